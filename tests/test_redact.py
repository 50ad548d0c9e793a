"""Secret redaction for logs and wandb."""

from __future__ import annotations

import logging

import pytest

from hermes_async._redact import REDACTED, redact, redact_url, secret_env_values


def test_known_token_shapes_and_assignments_are_redacted() -> None:
    text = (
        "key sk-abcdefghijklmnopqrstuvwx gh ghp_abcdefghijklmnopqrstuvwxyz0123 "
        "hf hf_abcdefghijklmnopqrstuvwxyz aws AKIAABCDEFGHIJKLMNOP "
        'Authorization: Bearer abc.def-ghijkl "api_key": "s3cr3tvalue" password=hunter22'
    )
    out = redact(text, environ={})
    for secret in (
        "sk-abcdef",
        "ghp_abc",
        "hf_abc",
        "AKIAABC",
        "abc.def-ghijkl",
        "s3cr3t",
        "hunter22",
    ):
        assert secret not in out
    assert out.count(REDACTED) == 7


def test_values_of_secret_named_variables_are_redacted_wherever_they_appear() -> None:
    environ = {
        "MY_DB_PASSWORD": "correct-horse",
        "OPENAI_API_KEY": "plainvalue123",
        "HOME": "/root",
    }
    assert secret_env_values(environ) == ["correct-horse", "plainvalue123"]
    out = redact("cmd --pw correct-horse; echo plainvalue123 in /root", environ=environ)
    assert out == f"cmd --pw {REDACTED}; echo {REDACTED} in /root"


def test_ordinary_text_is_left_alone() -> None:
    text = "max_tokens=1024 tokens: 5 the key point is skill; TOKEN_LIMIT=8"
    assert redact(text, environ={"TOKEN_LIMIT": "8"}) == text
    assert redact("", environ={}) == ""
    shell_env = "PWD=/root/project\nOLDPWD=/root\nDB_PWD=hunter22"  # `env` in a sandbox
    assert redact(shell_env, environ={}) == f"PWD=/root/project\nOLDPWD=/root\nDB_PWD={REDACTED}"
    assert redact("use it", extra_values=["configured-key-1"], environ={}) == "use it"
    assert redact("x configured-key-1 y", extra_values=["configured-key-1"], environ={}) == (
        f"x {REDACTED} y"
    )


def test_urls_lose_their_userinfo_and_secret_parameters() -> None:
    text = (
        "POST http://admin:hunter2pw@model-host:8000/v1/chat failed; "
        "DATABASE_URL=postgres://app:dbpass99@db:5432/x "
        "see https://api.example.com/v1?api_key=qwerty123&n=2&X-Amz-Signature=abcd1234"
    )
    out = redact(text, environ={})
    for secret in ("hunter2pw", "admin", "dbpass99", "qwerty123", "abcd1234"):
        assert secret not in out
    assert "model-host:8000/v1/chat" in out and "db:5432/x" in out and "n=2" in out
    assert redact_url("https://tok3n@host/x?sig=s1&page=2") == (
        f"https://{REDACTED}@host/x?sig={REDACTED}&page=2"
    )
    assert redact_url("not a url") == "not a url"


def test_pem_blocks_jwts_and_authorization_credentials() -> None:
    pem = (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7bq\nZZZ9\n-----END RSA PRIVATE KEY-----"
    )
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJlLXZhbHVl"
    out = redact(f"key: {pem} token {jwt} done", environ={})
    assert "MIIEpAIBAAKCAQEA7bq" not in out and "ZZZ9" not in out and jwt not in out
    assert out.endswith("done")
    # A PEM block cut off by truncation is redacted to the end of the text.
    assert "MIIEp" not in redact("-----BEGIN PRIVATE KEY-----\nMIIEpAIBAAK", environ={})
    basic = redact("Authorization: Basic dXNlcjpwYXNzd29yZA==", environ={})
    assert basic == f"Authorization: Basic {REDACTED}"  # the scheme kept, the credential gone
    assert "tok-123456" not in redact("authorization: Token tok-123456", environ={})


def test_ini_and_env_file_spellings() -> None:
    text = (
        "[default]\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG\n"
        "export GITHUB_TOKEN=gh-value-123456\nregion = us-east-1\n"
        'secretKey: "camel-secret-1"'
    )
    out = redact(text, environ={})
    for secret in ("wJalrXUtnFEMI", "gh-value-123456", "camel-secret-1"):
        assert secret not in out
    assert "region = us-east-1" in out
    # Names that are not secrets stay as they are.
    kept = 'eos_token: "<|im_end|>" {"key": "Enter"} max_tokens=1024'
    assert redact(kept, environ={}) == kept


def test_log_records_of_hermes_async_loggers_are_redacted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import hermes_async  # noqa: F401  (installs the record factory)

    logger = logging.getLogger("hermes_async.inference.test")
    other = logging.getLogger("elsewhere")
    with caplog.at_level(logging.WARNING):
        logger.warning("POST %s failed", "http://u:logpass123@h/v1")
        try:
            raise RuntimeError("password=tracepass99")
        except RuntimeError:
            logger.exception("it broke")
        other.warning("password=otherlib1")  # not ours: untouched
    assert "logpass123" not in caplog.text and "tracepass99" not in caplog.text
    assert "otherlib1" in caplog.text


def test_an_environment_dump_is_redacted_entry_by_entry() -> None:
    # /proc/<pid>/environ: NAME=value entries separated by NUL. A value with a space or a
    # comma was redacted only up to it (the rest of the secret stayed); passphrases were
    # not secret names at all.
    dump = (
        "HOME=/root\x00OPENAI_API_KEY=abcd,1234 efgh5678\x00SSH_KEY_PASSPHRASE=correct horse"
        "\x00GPG_PASSPHRASE=battery staple\x00PWD=/work\x00TOKEN_LIMIT=8\x00PATH=/bin"
    )
    assert redact(dump, environ={}) == (
        "HOME=/root\x00OPENAI_API_KEY=[REDACTED]\x00SSH_KEY_PASSPHRASE=[REDACTED]"
        "\x00GPG_PASSPHRASE=[REDACTED]\x00PWD=/work\x00TOKEN_LIMIT=8\x00PATH=/bin"
    )


def test_passphrases_are_secret_names_and_secret_variables() -> None:
    assert redact('{"db_passphrase": "correcthorse"}', environ={}) == (
        '{"db_passphrase": "[REDACTED]"}'
    )
    assert redact("export GPG_PASSPHRASE=correcthorse", environ={}) == (
        "export GPG_PASSPHRASE=[REDACTED]"
    )
    env = {"GPG_PASSPHRASE": "s3cret-value-here"}
    assert redact("the value s3cret-value-here leaked", environ=env) == (
        "the value [REDACTED] leaked"
    )

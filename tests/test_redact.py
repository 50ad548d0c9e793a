"""Secret redaction for logs and wandb."""

from __future__ import annotations

from hermes_async._redact import REDACTED, redact, secret_env_values


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
    assert redact("use it", extra_values=["configured-key-1"], environ={}) == "use it"
    assert redact("x configured-key-1 y", extra_values=["configured-key-1"], environ={}) == (
        f"x {REDACTED} y"
    )

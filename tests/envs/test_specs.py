"""What a command line names: ``--model``, ``ENV`` (file, module, short name), ``--oracle``."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from hermes_async.envs.specs import parse_model, resolve_env, resolve_oracle
from hermes_async.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MY_ENV = str(ROOT / "examples" / "my_env.py")
ORACLE = f"{MY_ENV}:oracle"


def test_parse_model() -> None:
    spec = parse_model("vllm/Qwen/Qwen3-8B@http://host:8000")
    assert (spec.provider, spec.name, spec.base_url) == (
        "vllm",
        "Qwen/Qwen3-8B",
        "http://host:8000/v1",
    )
    assert parse_model("openai/gpt-4o-mini").base_url == "https://api.openai.com/v1"
    assert parse_model("sglang/m@http://h:1/v1/").base_url == "http://h:1/v1"
    assert str(parse_model("vllm/m@http://u:pw@h:1")).endswith("@http://[REDACTED]@h:1/v1")
    for bad, message in [
        ("gpt-4o", "unknown provider 'gpt-4o'"),
        ("tgi/m@http://h", "unknown provider 'tgi'"),
        ("vllm/@http://h", "the model name is empty"),
        ("vllm/m@ftp://h", "is not http"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_model(bad)


def test_resolve_env_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_async.envs.terminal_test import TerminalTestEnv

    assert resolve_env(MY_ENV).__name__ == "MyEnv"
    assert resolve_env(f"{MY_ENV}:MyEnv") is resolve_env(MY_ENV)  # one module per file
    assert resolve_env("terminal_test") is TerminalTestEnv
    # The reference's benchmark environments by short name (issue #40).
    bundled = {
        "swe": "HermesSweEnv",
        "tblite": "TBLiteEvalEnv",
        "yc_bench": "YCBenchEvalEnv",
        "web_research": "WebResearchEnv",
    }
    assert {name: resolve_env(name).__name__ for name in bundled} == bundled
    assert resolve_env("hermes_async.envs.terminal_test:TerminalTestEnv") is TerminalTestEnv
    two = tmp_path / "two_envs.py"
    two.write_text(
        textwrap.dedent(
            """
            from hermes_async.envs import HermesAgentBaseEnv
            class A(HermesAgentBaseEnv): pass
            class B(HermesAgentBaseEnv): pass
            NOT_AN_ENV = 3
            """
        )
    )
    with pytest.raises(ConfigError, match=r"found A, B; name it: .*two_envs.py:MyEnv"):
        resolve_env(str(two))
    assert resolve_env(f"{two}:B").__name__ == "B"
    with pytest.raises(
        ConfigError, match=r"not a subclass of hermes_async\.envs\.HermesAgentBaseEnv"
    ):
        resolve_env(f"{two}:NOT_AN_ENV")
    with pytest.raises(ConfigError, match=r"has no 'C'"):
        resolve_env(f"{two}:C")
    with pytest.raises(ConfigError, match="no such file"):
        resolve_env(str(tmp_path / "missing.py"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="no module named 'nowhere_env'"):
        resolve_env("nowhere_env:Env")
    assert "two_envs" in sys.modules


def test_resolve_oracle_forms() -> None:
    from hermes_async.testing import PolicyRequest

    request = PolicyRequest(
        ({"role": "user", "content": "Write 1 + 2 to ~/answer.txt"},), "", (), 1, "chat"
    )
    assert "echo 3" in resolve_oracle(ORACLE)(request)
    # A function without parameters is a factory of policies (the bundled examples' form).
    factory = "hermes_async.envs.terminal_test:terminal_test_oracle"
    assert resolve_oracle(factory)(request) == "I do not know this task."
    with pytest.raises(ConfigError, match=r"expected FILE\.py:FUNCTION"):
        resolve_oracle(MY_ENV)
    with pytest.raises(ConfigError, match="not a function"):
        resolve_oracle(f"{MY_ENV}:TASKS")
    with pytest.raises(ConfigError, match="did you mean 'oracle'"):
        resolve_oracle(f"{MY_ENV}:oracel")


def test_a_bad_port_or_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    for bad in ("vllm/m@http://h:abc", "vllm/m@http://h:99999", "vllm/m@http://:80"):
        with pytest.raises(ConfigError, match="is not http"):
            parse_model(bad)  # was httpx's InvalidURL at the first request
    (tmp_path / "latin1_env.py").write_bytes(b"x = '\xff'\n")
    (tmp_path / "broken_env.py").write_text("def f(:\n    pass\n")
    with pytest.raises(ConfigError, match=r"cannot import .*latin1_env.py.*utf-8.*line 1"):
        resolve_env(str(tmp_path / "latin1_env.py"))
    with pytest.raises(ConfigError, match=r"invalid syntax \(line 1 of .*broken_env.py\)"):
        resolve_oracle(f"{tmp_path / 'broken_env.py'}:f")

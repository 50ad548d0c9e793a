"""``hermes-async eval`` / ``process``: any environment, offline with an oracle, one run folder.

The newcomer's sequence (issue #34) runs here end to end: the 30-line ``examples/my_env.py``,
``hermes-async eval examples/my_env.py --oracle examples/my_env.py:oracle --limit 5``, a
table, a run folder with rows, metrics and the viewer; then resuming it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_async.cli import main
from hermes_async.envs.command import RunRequest, plan_run

ROOT = Path(__file__).resolve().parents[2]
MY_ENV = str(ROOT / "examples" / "my_env.py")
ORACLE = f"{MY_ENV}:oracle"


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_newcomers_sequence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    argv = ["eval", MY_ENV, "--oracle", ORACLE, "--limit", "5", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "MyEnv against oracle" in printed
    assert "5 rollouts, mean reward 1.00, pass rate 100%" in printed
    for task in ("add-1-2", "add-20-22", "add-7-5", "add-100-1", "add-3-3"):
        assert f"eval  {task} " in printed
    assert "add-12-30" not in printed  # --limit 5 of the 6 tasks
    rows = lines(out / "samples.jsonl")
    assert len(rows) == 5 and {r["reward"] for r in rows} == {1.0}
    # Each row holds the whole conversation: the tool call with its arguments, its result.
    calls = [
        call["function"]
        for row in rows
        for message in row["messages"]  # type: ignore[attr-defined]
        for call in message.get("tool_calls") or ()
    ]
    assert len(calls) == 5 and all(c["name"] == "terminal" for c in calls)
    assert "echo 42 > ~/answer.txt" in {json.loads(c["arguments"])["command"] for c in calls}
    assert all(r["token_counts"]["completion"] > 0 for r in rows)  # type: ignore[index]
    metrics = json.loads((out / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/mean_reward"] == 1.0 and metrics["eval/num_samples"] == 5.0
    page = (out / "index.html").read_text()
    assert "echo 42 &gt; ~/answer.txt" in page
    run = json.loads((out / "run.json").read_text())
    assert run["env_name"] == "my_env" and run["mode"] == "eval" and run["seconds"] > 0
    assert f"viewer:  {out / 'index.html'}" in printed


def test_module_forms_and_group_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # From the examples folder, as `hermes-async eval my_env.py --oracle my_env:oracle`.
    monkeypatch.chdir(ROOT / "examples")
    out = tmp_path / "run"
    argv = ["eval", "my_env.py", "--oracle", "my_env:oracle", "--limit", "2", "--group-size", "2"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    keys = sorted(str(r["item_key"]) for r in lines(out / "samples.jsonl"))
    assert keys == ["add-1-2", "add-1-2#2", "add-20-22", "add-20-22#2"]
    assert "4 rollouts, mean reward 1.00" in capsys.readouterr().out


def test_resume_keeps_finished_rows_and_reruns_errored_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    base = ["eval", MY_ENV, "--oracle", ORACLE, "--out", str(out), "--no-progress"]
    assert main([*base, "--limit", "3"]) == 0
    first = (out / "samples.jsonl").read_bytes().splitlines(keepends=True)
    # Another run into the same folder without --resume is refused; nothing is touched.
    assert main([*base, "--limit", "3"]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert (out / "samples.jsonl").read_bytes().splitlines(keepends=True) == first
    # Mark the second row as an infra failure: resuming runs it again.
    broken = json.loads(first[1])
    broken["failure"] = {"category": "infra", "message": "the sandbox died", "detail": None}
    (out / "samples.jsonl").write_bytes(first[0] + json.dumps(broken).encode() + b"\n" + first[2])
    assert main([*base, "--limit", "5", "--resume"]) == 0
    now = (out / "samples.jsonl").read_bytes().splitlines(keepends=True)
    assert now[:2] == [first[0], first[2]]  # finished rows kept byte for byte
    assert len(now) == 5
    assert sorted(json.loads(line)["item_key"] for line in now) == sorted(
        ["add-1-2", "add-20-22", "add-7-5", "add-100-1", "add-3-3"]
    )
    assert "5 rollouts, mean reward 1.00" in capsys.readouterr().out


def test_process_writes_groups_and_rows_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    base = ["process", MY_ENV, "--oracle", ORACLE, "--group-size", "2", "--out", str(out)]
    assert main([*base, "--limit", "2", "--no-progress"]) == 0
    groups = lines(out / "groups.jsonl")
    assert len(groups) == 2 and all(g["scores"] == [1.0, 1.0] for g in groups)
    for group in groups:  # Phase 2: exact tokens against the oracle
        for tokens, masks in zip(group["tokens"], group["masks"], strict=True):  # type: ignore[call-overload]
            assert len(tokens) == len(masks) and any(m != -100 for m in masks)
    rows = (out / "samples.jsonl").read_bytes().splitlines(keepends=True)
    assert len(rows) == 4
    assert {json.loads(r)["group_key"] for r in rows} == {g["item_key"] for g in groups}
    assert "process  add-" in capsys.readouterr().out
    assert main([*base, "--limit", "3", "--resume", "--no-progress"]) == 0
    again = (out / "samples.jsonl").read_bytes().splitlines(keepends=True)
    assert again[:4] == rows and len(again) == 6
    assert len(lines(out / "groups.jsonl")) == 3
    assert "6 rollouts" in capsys.readouterr().out


def test_bad_flags_fail_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    cases = [
        (
            ["--env.max_agent_turn", "5"],
            "unknown flag --env.max_agent_turn (did you mean 'max_agent_turns'?)",
        ),
        (
            ["--openai.server_typ", "vllm"],
            "unknown flag --openai.server_typ (did you mean 'server_type'?)",
        ),
        (
            ["--env.max_agent_turns", "0"],
            "max_agent_turns: Input should be greater than or equal to 1",
        ),
        (["--limit", "0"], "--limit must be >= 1"),
    ]
    for extra, message in cases:
        code = main(["eval", MY_ENV, "--oracle", ORACLE, "--out", str(out), *extra])
        assert code == 2
        assert message in capsys.readouterr().err
    assert not out.exists()
    assert main(["eval", "terminal_tset", "--oracle", ORACLE]) == 2
    assert "did you mean 'terminal_test'?" in capsys.readouterr().err
    assert main(["eval", MY_ENV, "--resume", "--oracle", ORACLE]) == 2  # no earlier run
    assert "--resume: no earlier run of 'my_env'" in capsys.readouterr().err


def test_a_dead_model_server_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["eval", MY_ENV, "--model", "vllm/m@http://127.0.0.1:9", "--tokenizer", "qwen-offline"]
    secret = ["--openai.api_key", "plain-words-of-a-key-4711"]
    code = main([*argv, "--out", str(tmp_path / "r"), "--env.server_connect_timeout", "1", *secret])
    assert code == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("hermes-async eval: start-up check failed, no rollout was run: ")
    assert "127.0.0.1:9" in err[0]
    run = (tmp_path / "r" / "run.json").read_text()  # how it was run, without the key
    assert "--openai.api_key [REDACTED]" in run and "4711" not in run


def test_without_bubblewrap_an_oracle_opts_out_and_says_so_a_model_never_does(
    tmp_path: Path, without_bubblewrap: dict[str, str]
) -> None:
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        cli = [sys.executable, "-m", "hermes_async.cli", "eval", MY_ENV, "--no-progress"]
        return subprocess.run(
            [*cli, *argv],
            env=without_bubblewrap,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )

    oracle = run("--oracle", ORACLE, "--limit", "1", "--out", str(tmp_path / "oracle"))
    assert oracle.returncode == 0, oracle.stdout[-2000:] + oracle.stderr[-2000:]
    said = [line for line in oracle.stdout.splitlines() if "NOT isolated" in line]
    assert len(said) == 1 and said[0].startswith("hermes-async eval: sandboxes are NOT isolated")
    assert "bwrap not found on PATH" in said[0] and "isolation='process'" in said[0]
    assert "1 rollout, mean reward 1.00" in oracle.stdout
    # A model's commands: the start-up check refuses, in one line, before any rollout.
    model = run("--model", "vllm/m@http://127.0.0.1:9", "--tokenizer", "qwen-offline")
    assert model.returncode == 1
    assert model.stderr.splitlines() == [model.stderr.strip()], model.stderr
    assert model.stderr.startswith(
        "hermes-async eval: start-up check failed, no rollout was run: local sandboxes cannot "
        "be isolated on this machine: bwrap not found on PATH"
    )


def test_model_sets_the_server_and_infers_the_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "secret-of-the-server")
    plan = plan_run(RunRequest("eval", MY_ENV, model="vllm/org/model-x@http://127.0.0.1:9"))
    assert plan.config.tokenizer_name == "org/model-x"  # a token server: the model's tokenizer
    server = plan.server
    assert (server.base_url, server.server_type, server.model_name) == (
        "http://127.0.0.1:9/v1",
        "vllm",
        "org/model-x",
    )
    assert server.api_key == "secret-of-the-server"
    assert plan.config.use_wandb is False and plan.run_dir.parent.name == "runs"
    plan = plan_run(RunRequest("eval", MY_ENV, model="vllm/m@http://h:1", tokenizer="/tok"))
    assert plan.config.tokenizer_name == "/tok"
    plan = plan_run(RunRequest("eval", MY_ENV, model="openai/gpt-x", wandb=True))
    assert plan.config.tokenizer_name == "qwen-offline"  # chat: the env's own
    assert plan.config.use_wandb is True

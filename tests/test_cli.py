"""The ``hermes-async`` command: the demo is the project's main job, so it is tested end to end."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from hermes_async.cli import _parse_overrides, main
from tests.timed_output import Run, run_timed


def test_demo_runs_offline_and_writes_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["demo", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "scripted oracle model on http://127.0.0.1:" in printed
    for task in ("result", "greeting", "count", "answer"):
        assert task in printed
    assert "10 rollouts, mean reward 1.00" in printed
    assert "[TOOL CALL] terminal" in printed
    groups = [json.loads(line) for line in (out / "terminal_test.jsonl").read_text().splitlines()]
    assert len(groups) == 3 and all(g["scores"] == [1.0, 1.0, 1.0] for g in groups)
    for group in groups:  # Phase 2: real tokens, masks and logprobs, aligned
        for tokens, masks, logprobs in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], strict=True
        ):
            assert len(tokens) == len(masks) == len(logprobs)
            assert any(m != -100 for m in masks)
    assert (out / "terminal_test.html").is_file()
    # The viewer: every rollout (1 eval + 9 process), each with its tool calls' arguments.
    page = (out / "index.html").read_text()
    assert page.count('<details class="rollout"') == 10
    assert page.count('<div class="call-name">terminal</div>') == 10
    assert "seq 1 5 &gt; ~/count.txt" in page
    assert (
        json.loads((out / "eval" / "metrics.json").read_text())["results"]["all"][
            "eval/mean_reward"
        ]
        == 1.0
    )


def test_demo_phase1_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--out", str(tmp_path), "--no-progress", "--openai.server_type", "openai"]
    assert main([*argv, "--env.total_steps=1", "--env.group_size", "2"]) == 0
    printed = capsys.readouterr().out
    assert "Phase 1" in printed and "3 rollouts, mean reward 1.00" in printed


def test_demo_rejects_unknown_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="unrecognized argument '--bogus'"):
        _parse_overrides(["--bogus", "1"])
    with pytest.raises(SystemExit, match="needs a value"):
        _parse_overrides(["--env.group_size"])
    assert _parse_overrides(["--env.a", "1", "--openai.b=2"]) == ({"a": "1"}, {"b": "2"})
    out = tmp_path / "out"
    (out).mkdir()
    (out / "terminal_test.jsonl").write_text("a previous run\n")
    assert main(["demo", "--out", str(out), "--env.max_agent_turn", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "hermes-async demo: unknown flag: '--env.max_agent_turn'; "
        "did you mean '--env.max_agent_turns'?\n"
    )
    assert main(["demo", "--out", str(out), "--openai.server_typ", "vllm"]) == 2
    assert "did you mean '--openai.server_type'?" in capsys.readouterr().err
    # Rejected before anything in the output directory was touched.
    assert (out / "terminal_test.jsonl").read_text() == "a previous run\n"


def test_view_writes_the_page_and_prints_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = {
        "item_key": "a",
        "task": "a",
        "reward": 1.0,
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "1", "function": {"name": "terminal", "arguments": '{"command": "ls"}'}}
                ],
            },
        ],
    }
    (tmp_path / "samples.jsonl").write_text(json.dumps(row) + "\n")
    assert main(["view", str(tmp_path / "samples.jsonl")]) == 0
    printed = capsys.readouterr().out
    page = tmp_path / "index.html"
    assert f"viewer: {page.resolve()}" in printed and page.resolve().as_uri() in printed
    assert "&quot;command&quot;: &quot;ls&quot;" in page.read_text()
    assert main(["view", str(tmp_path / "nothing-here")]) == 2
    assert "has no samples.jsonl" in capsys.readouterr().err


def test_worker_loop_flag_reaches_anyio(monkeypatch: pytest.MonkeyPatch) -> None:
    import hermes_async.cli as cli

    seen: list[dict[str, object]] = []

    def fake_run(function: object, *args: object, **options: object) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(cli.anyio, "run", fake_run)
    argv = ["worker", "--env", "x=hermes_async.testing.worker_tasks:echo_task"]
    argv += ["--server", "http://127.0.0.1:1"]
    assert main([*argv, "--loop", "uvloop"]) == 0
    assert main(argv) == 0
    assert seen == [
        {"backend": "asyncio", "backend_options": {"use_uvloop": True}},
        {"backend": "asyncio", "backend_options": {"use_uvloop": False}},
    ]
    assert main([*argv, "--trio", "--loop", "uvloop"]) == 2  # refused, nothing run
    assert len(seen) == 2


# ---------------------------------------------------------------- start-up, as a user sees it

#: The demo as `make demo` runs it (the console script is this module's main).
DEMO = [sys.executable, "-m", "hermes_async.cli", "demo", "--no-progress"]


def _timed(argv: list[str], env: dict[str, str], **kwargs: Any) -> Run:
    return anyio.run(functools.partial(run_timed, argv, env=env, deadline=180, **kwargs))


def _interpreter_start() -> float:
    """Seconds to start Python and import the command's module: the part no change removes."""
    run = _timed([sys.executable, "-c", "import hermes_async.cli; print('up')"], dict(os.environ))
    return run.first("up").seconds


def test_demo_says_what_it_is_doing_before_the_slow_imports(tmp_path: Path) -> None:
    baseline = _interpreter_start()
    run = _timed([*DEMO, "--out", str(tmp_path)], dict(os.environ), stop=lambda line: True)
    first = run.lines[0]
    assert first.text == "hermes-async demo: loading TerminalTestEnv (atroposlib) ..."
    # Before: the first line came after atroposlib's import, seconds beyond the interpreter's.
    assert first.seconds - baseline < 1.0, (first.seconds, baseline)


def test_demo_without_bubblewrap_opts_out_for_the_oracle_and_says_so(
    tmp_path: Path, without_bubblewrap: dict[str, str]
) -> None:
    run = _timed([*DEMO, "--out", str(tmp_path)], without_bubblewrap)
    assert run.returncode == 0, run.text()[-3000:]
    said = [line for line in run.lines if "NOT isolated" in line.text]
    assert len(said) == 1 and "bwrap not found on PATH" in said[0].text
    assert "isolation='process'" in said[0].text
    assert "10 rollouts, mean reward 1.00" in run.text()


def test_failed_start_up_is_one_line_without_a_traceback(
    tmp_path: Path, without_bubblewrap: dict[str, str]
) -> None:
    env = dict(os.environ)
    # A real server (no oracle): the demo does not opt out, the start-up check refuses.
    url = "http://127.0.0.1:9/v1"
    run = _timed([*DEMO, "--out", str(tmp_path), "--openai.base_url", url], without_bubblewrap)
    errors = [line for line in run.lines if line.stream == "err"]
    assert run.returncode == 1
    assert len(errors) == 1, run.text()
    assert errors[0].text.startswith(
        "hermes-async demo: start-up check failed, no rollout was run: local sandboxes cannot "
        "be isolated on this machine: bwrap not found on PATH"
    )
    assert "Traceback" not in run.text()
    # With the oracle (its loopback server is a task group), a bad setting: one line too.
    oracle = _timed([*DEMO, "--out", str(tmp_path), "--env.tool_call_parser", "hermez"], env)
    errors = [line for line in oracle.lines if line.stream == "err"]
    assert oracle.returncode == 1 and len(errors) == 1, oracle.text()
    assert "--env.tool_call_parser='hermez' is not a tool-call parser" in errors[0].text
    verbose = _timed(
        [*DEMO, "--out", str(tmp_path), "--openai.base_url", url, "--verbose"], without_bubblewrap
    )
    assert verbose.returncode == 1 and "Traceback" in verbose.text()


def test_demo_bad_values_and_out_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["demo", "--out", str(tmp_path / "out"), "--no-progress"]
    assert main([*argv, "--env.max_agent_turns", "0"]) == 2  # was pydantic's traceback
    assert capsys.readouterr().err == (
        "hermes-async demo: --env.max_agent_turns: Input should be greater than or equal "
        "to 1 (got '0')\n"
    )
    assert main([*argv, "--openai.timeout", "abc"]) == 2
    assert "hermes-async demo: --openai.timeout: Input should be a valid integer" in (
        capsys.readouterr().err
    )
    (tmp_path / "a-file").write_text("")
    assert main(["demo", "--out", str(tmp_path / "a-file" / "out")]) == 2  # was a traceback
    err = capsys.readouterr().err
    assert err.startswith(f"hermes-async demo: --out {tmp_path / 'a-file' / 'out'}: cannot make")
    assert err.count("\n") == 1


def test_eval_out_that_cannot_be_a_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "run"
    assert main(["eval", "terminal_test", "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err == f"hermes-async eval: [Errno 20] Not a directory: '{out}'\n"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["status", "http://h:abc"], "status takes an http(s)://host[:port] URL, got"),
        (["view", ".", "--port", "70000"], "a port is a number from 0 to 65535, got '70000'"),
        (["worker", "--env", "a:b", "--server", "http://x", "--port", "-1"], "got '-1'"),
        (["serve-gym", "--tasks", "a:b", "--model-url", "http://x", "--port", "x"], "got 'x'"),
    ],
)
def test_bad_url_or_port_is_a_usage_error(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)  # was httpx's InvalidURL, or an OverflowError from bind()
    assert exited.value.code == 2
    assert expected in capsys.readouterr().err


def test_worker_on_a_taken_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["worker", "--env", "x=hermes_async.testing.worker_tasks:echo_task"]
        argv += ["--server", "http://127.0.0.1:1", "--api", "chat", "--port", str(port)]
        assert main(argv) == 2  # was a traceback from bind()
    err = capsys.readouterr().err
    assert err.startswith(f"hermes-async worker: error: cannot serve on 127.0.0.1:{port}: ")
    assert "Address already in use" in err and err.count("\n") == 1

"""The ``hermes-async`` command: the demo is the project's main job, so it is tested end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_async.cli import _parse_overrides, main


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


def test_demo_rejects_unknown_flags(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unrecognized argument '--bogus'"):
        _parse_overrides(["--bogus", "1"])
    with pytest.raises(SystemExit, match="needs a value"):
        _parse_overrides(["--env.group_size"])
    assert _parse_overrides(["--env.a", "1", "--openai.b=2"]) == ({"a": "1"}, {"b": "2"})
    out = tmp_path / "out"
    (out).mkdir()
    (out / "terminal_test.jsonl").write_text("a previous run\n")
    with pytest.raises(SystemExit, match="unknown --env fields: nonsense"):
        main(["demo", "--out", str(out), "--env.nonsense", "1"])
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

"""Run folders: names, bounded reading of samples.jsonl, the end-of-run table."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hermes_async.envs.results import RolloutSummary, format_summary
from hermes_async.envs.runs import default_run_dir, latest_run_dir, read_samples


def test_default_run_dir_is_named_after_the_env_and_never_reused(tmp_path: Path) -> None:
    first = default_run_dir("my env/x", root=tmp_path, now=0.0)
    assert first.parent == tmp_path and first.name.startswith("my_env_x-19")
    first.mkdir()
    second = default_run_dir("my env/x", root=tmp_path, now=0.0)
    assert second.name == first.name + "-2"


def test_latest_run_dir_is_the_newest_with_results(tmp_path: Path) -> None:
    assert latest_run_dir("e", root=tmp_path / "missing") is None
    for name, mtime in (("e-1", 100), ("e-2", 300), ("e-3", 200), ("other-9", 999)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "samples.jsonl").write_text("{}\n")
        os.utime(tmp_path / name / "samples.jsonl", (mtime, mtime))
    (tmp_path / "e-4").mkdir()  # no results: not a run to resume
    assert latest_run_dir("e", root=tmp_path) == tmp_path / "e-2"


def test_read_samples_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    path.write_bytes(
        b'{"item_key": "a"}\n\n'
        + b'{"item_key": "'
        + b"x" * 5000
        + b'"}\n'  # over the line bound
        + b"[1, 2]\n"  # not an object
        + b'{"item_key": "b"}\n'
        + b'{"item_key": "c"}\n'
        + b'{"item_key": "d"'  # cut short by a kill
    )
    samples = read_samples(path, max_line_bytes=1000)
    assert [r["item_key"] for r in samples.rows] == ["a", "b", "c"]
    assert (samples.skipped, samples.unread) == (3, 0)
    capped = read_samples(path, max_rows=2, max_line_bytes=1000)
    assert [r["item_key"] for r in capped.rows] == ["a", "b"]
    assert capped.unread == 2
    assert read_samples(tmp_path / "none.jsonl").rows == []


def summary(label: str, reward: float, category: str | None = None, **kw: object) -> RolloutSummary:
    values: dict[str, object] = {
        "label": label,
        "task_id": "t",
        "reward": reward,
        "turns": 2,
        "tokens": 100,
        "seconds": 1.0,
        "finished_naturally": True,
        "tool_errors": 0,
        "error": None,
        "evaluating": True,
        "category": category,
    }
    values.update(kw)
    return RolloutSummary(**values)  # type: ignore[arg-type]


def test_the_summary_leaves_errored_rollouts_out_of_the_rewards() -> None:
    rows = [
        summary("b", 1.0),
        summary("b", 0.0, "tool"),
        summary("a", 0.5, turns=4),
        summary("a", 0.0, "infra", turns=0),  # errored: counted, not scored
        summary("a", 1.0, evaluating=False),
    ]
    text = format_summary(rows, 12.0)
    lines = text.splitlines()
    assert lines[0].split() == [
        "mode", "task", "rollouts", "reward", "std", "pass", "turns", "tokens", "time_s",
        "failures",
    ]  # fmt: skip
    assert lines[2].split() == ["eval", "a", "2", "0.50", "0.00", "0.00", "4.00", "100", "1.00", "infra:1"]  # fmt: skip
    assert lines[3].split() == ["eval", "b", "2", "0.50", "0.50", "0.50", "2.00", "100", "1.00", "tool:1"]  # fmt: skip
    assert lines[4].split()[:3] == ["process", "a", "1"]
    assert lines[5].split()[:4] == ["all", "5", "0.62", "0.41"]
    assert lines[6] == "5 rollouts (1 errored), mean reward 0.62, pass rate 50%, 12.0 s"


def test_samples_read_back_as_summaries(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    rows = [
        {"item_key": "k", "mode": "process", "task": "t", "reward": 1.0, "turns": 3},
        {"item_key": "j", "task": "u", "reward": 0.0, "failure": {"category": "verifier"}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_samples(path).summaries()
    assert [(s.label, s.evaluating, s.category, s.turns) for s in got] == [
        ("t", False, None, 3),
        ("u", True, "verifier", 0),
    ]


def test_damaged_run_json_and_samples_read_as_broken_not_raise(tmp_path: Path) -> None:
    # Deep nesting raised RecursionError; a 400-digit "started" OverflowError, a string
    # ValueError.
    from hermes_async.envs.runs import RUN_FILE, RunInfo

    (tmp_path / RUN_FILE).write_text("[" * 100_000)
    assert RunInfo.read(tmp_path) is None
    (tmp_path / RUN_FILE).write_text('{"started": ' + "9" * 400 + ', "seconds": "x"}')
    info = RunInfo.read(tmp_path)
    assert info is not None and (info.started, info.seconds) == (0.0, None)
    assert RunInfo.from_json({"started": "yesterday", "seconds": float("nan")}).started == 0.0
    path = tmp_path / "samples.jsonl"
    path.write_text("[" * 100_000 + '\n{"item_key": "a"}\n')
    samples = read_samples(path)
    assert [r["item_key"] for r in samples.rows] == ["a"] and samples.skipped == 1

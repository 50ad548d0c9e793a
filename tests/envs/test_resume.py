"""Resumable runs: results written line by line with item keys; a run SIGKILLed at a random
point and resumed with ``--env.resume true`` ends with exactly one result per item, the
finished ones byte for byte as the first run wrote them."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from hermes_async.envs._resume import ResultsFile, default_item_key, errored, item_keys
from hermes_async.envs.terminal_test import terminal_test_oracle
from tests.envs.helpers import serve_policy
from tests.envs.resumable_env import RESUME_EVAL_ITEMS

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def command(mode: str, url: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tests.envs.resumable_env",
        mode,
        "--openai.base_url",
        url + "/v1",
        "--env.use_wandb",
        "false",
        "--env.failure_max_attempts",
        "1",
        *args,
    ]


def complete_lines(path: Path) -> list[bytes]:
    data = path.read_bytes() if path.exists() else b""
    return [line + b"\n" for line in data.split(b"\n")[:-1] if line.strip()]


async def run_to_end(argv: list[str], env: dict[str, str]) -> None:
    with anyio.fail_after(120):
        done = await anyio.run_process(argv, check=False, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr.decode()[-3000:]


async def kill_midway(
    argv: list[str], env: dict[str, str], output: Path, rng: random.Random
) -> None:
    """Start the run, wait for its first result line, SIGKILL it a random moment later."""
    async with await anyio.open_process(argv, cwd=ROOT, env=env) as process:
        with anyio.fail_after(120):
            while not complete_lines(output):
                if process.returncode is not None:
                    break
                await anyio.sleep(0.05)
            await anyio.sleep(rng.uniform(0.0, 1.5))
        killed = process.returncode is None
        if killed:
            process.send_signal(signal.SIGKILL)
        await process.wait()
    return killed


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


async def test_process_killed_and_resumed_has_one_group_per_item(tmp_path: Path) -> None:
    rng = random.Random()
    seed = rng.randrange(1_000_000)
    rng.seed(seed)
    groups = tmp_path / "out" / "groups.jsonl"
    args = (
        "--env.total_steps",
        "8",
        "--env.group_size",
        "2",
        "--env.data_path_to_save_groups",
        str(groups),
    )
    async with serve_policy(terminal_test_oracle(), response_delay_seconds=0.05) as (url, _):
        argv = command("process", url, *args)
        assert await kill_midway(argv, environment(), groups, rng), f"seed {seed}: ended first"
        before = complete_lines(groups)
        assert 1 <= len(before) < 8
        await run_to_end([*argv, "--env.resume", "true"], environment())
    after = complete_lines(groups)
    keys = [json.loads(line)["item_key"] for line in after]
    # 3 training tasks, cycled: each occurrence is its own item.
    expected = ["greeting", "count", "answer", "greeting#2", "count#2", "answer#2"]
    expected += ["greeting#3", "count#3"]
    assert sorted(keys) == sorted(expected), f"seed {seed}: {keys}"
    assert after[: len(before)] == before, f"seed {seed}: finished lines changed"
    assert not (tmp_path / "out" / "groups_1.jsonl").exists()  # resumed in place
    assert groups.with_suffix(".html").is_file()
    for line in after:
        group = json.loads(line)
        assert group["scores"] == [1.0, 1.0] and len(group["tokens"]) == 2


async def test_evaluate_killed_and_resumed_reruns_missing_and_errored_items(
    tmp_path: Path,
) -> None:
    rng = random.Random()
    seed = rng.randrange(1_000_000)
    rng.seed(seed)
    evals = tmp_path / "evals"
    samples = evals / "samples.jsonl"
    marker = tmp_path / "fail"
    marker.write_text("count-0 result-1")  # these two error in the first run
    env = environment(RESUME_TEST_FAIL_MARKER=str(marker))
    args = ("--env.data_dir_to_save_evals", str(evals), "--env.eval_concurrency", "2")
    async with serve_policy(terminal_test_oracle(), response_delay_seconds=0.05) as (url, _):
        argv = command("evaluate", url, *args)
        assert await kill_midway(argv, env, samples, rng), f"seed {seed}: ended first"
        before = complete_lines(samples)
        assert 1 <= len(before) < 12
        first_errored = {
            json.loads(line)["item_key"] for line in before if errored(json.loads(line))
        }
        marker.unlink()  # the verifier is back
        await run_to_end([*argv, "--env.resume", "true"], env)
    after = complete_lines(samples)
    records = [json.loads(line) for line in after]
    keys = [r["item_key"] for r in records]
    assert sorted(keys) == sorted(item["name"] for item in RESUME_EVAL_ITEMS), f"seed {seed}"
    assert not any(errored(r) for r in records), f"seed {seed}: errored items not re-run"
    finished_before = [line for line in before if not errored(json.loads(line))]
    assert after[: len(finished_before)] == finished_before, f"seed {seed}: lines changed"
    assert first_errored <= {"count-0", "result-1"}
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/num_samples"] == 12.0 and metrics["eval/num_errored"] == 0.0
    assert metrics["eval/mean_reward"] == 1.0


# ------------------------------------------------------------------ the results file


def test_results_file_drops_a_cut_tail_and_errored_lines_keeping_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    good = json.dumps({"item_key": "a", "reward": 1.0}) + "\n"
    bad = json.dumps({"item_key": "b", "failure": {"category": "infra"}}) + "\n"
    foreign = json.dumps({"tokens": [1]}) + "\n"
    path.write_text(good + bad + foreign + '{"item_key": "c", "rew')
    results = ResultsFile(path, resume=True, keep=lambda r: not errored(r)).open()
    assert set(results.done) == {"a"}
    results.append({"item_key": "b", "reward": 0.5})
    results.close()
    assert path.read_text() == good + foreign + json.dumps({"item_key": "b", "reward": 0.5}) + "\n"
    fresh = ResultsFile(path, resume=False).open()
    fresh.close()
    assert path.read_text() == "" and fresh.done == {}
    unkeyed = ResultsFile(path, resume=False).open()
    with pytest.raises(ValueError, match="a result line needs a string 'item_key'"):
        unkeyed.append({"reward": 1})
    unkeyed.close()


def test_results_file_drops_a_line_nested_too_deeply(tmp_path: Path) -> None:
    # json.loads raises RecursionError (not ValueError) there: resume crashed.
    path = tmp_path / "r.jsonl"
    good = json.dumps({"item_key": "a", "reward": 1.0}) + "\n"
    path.write_text(good + '{"item_key": "b", "x": ' + "[" * 100_000 + "\n" + good)
    results = ResultsFile(path, resume=True).open()
    results.close()
    assert set(results.done) == {"a"} and path.read_text() == good


def test_results_file_writes_a_lone_surrogate_as_an_escape(tmp_path: Path) -> None:
    # A key from a file name of non-UTF-8 bytes raised UnicodeEncodeError out of append.
    path = tmp_path / "r.jsonl"
    results = ResultsFile(path, resume=False).open()
    results.append({"item_key": "bad\udcff", "error": "in /data/\udcfe"})
    results.write({"note": "\udcfe"})
    results.append({"item_key": "ünï"})  # valid UTF-8 is written as it is
    results.close()
    assert path.read_bytes().splitlines()[1:] == [
        b'{"note": "\\udcfe"}',
        '{"item_key": "ünï"}'.encode(),
    ]
    resumed = ResultsFile(path, resume=True).open()
    resumed.close()
    assert set(resumed.done) == {"bad\udcff", "ünï"}


def test_item_keys_are_stable_and_unique() -> None:
    items: list[Any] = [{"name": "a"}, {"id": 7}, {"x": [1, 2]}, {"name": "a"}, "plain"]
    keys = item_keys(items, default_item_key)
    assert keys[:2] == ["a", "7"] and keys[3] == "a#2" and len(set(keys)) == 5
    assert keys == item_keys(items, default_item_key)  # the same across runs
    assert default_item_key({"x": [1, 2]}) == default_item_key({"x": [1, 2]})
    assert default_item_key({"x": [1, 2]}) != default_item_key({"x": [2, 1]})


@pytest.mark.parametrize("mode", ["process", "evaluate"])
def test_resume_flag_is_an_env_flag(mode: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.envs.resumable_env", mode, "--help"],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert b"--env.resume" in done.stdout and b"--env.failure_policy" in done.stdout

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hermes_async.agent.budget import (
    DEFAULT_BUDGET,
    PERSISTED_OUTPUT_TAG,
    BudgetConfig,
    content_for_file,
    enforce_turn_budget,
    maybe_persist_tool_result,
    next_to_persist,
    render_preview,
    resolve_threshold,
    result_file_name,
)
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.registry import ToolRuntime, dispatch
from hermes_async.tools.sandbox.base import ExecRequest, ExecResult, Sandbox
from hermes_async.tools.sandbox.local import LocalSandbox

pytestmark = pytest.mark.anyio

SAVED = re.compile(r"Full output saved to: (\S+)")


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[LocalSandbox]:
    sbx = await LocalSandbox.create("budget-test", root_dir=str(tmp_path))
    try:
        yield sbx
    finally:
        await sbx.aclose()


# --------------------------------------------------------------------------------------------
# Pure decisions


def test_defaults_and_threshold_resolution() -> None:
    assert (DEFAULT_BUDGET.default_result_size, DEFAULT_BUDGET.turn_budget) == (100_000, 200_000)
    assert DEFAULT_BUDGET.preview_size == 1_500
    cfg = BudgetConfig(default_result_size=50_000, tool_overrides={"terminal": 10, "read_file": 5})
    assert resolve_threshold(cfg, "read_file") == math.inf  # pinned, not overridable
    assert resolve_threshold(cfg, "terminal", 100_000) == 10  # override wins
    assert resolve_threshold(cfg, "web_extract", 100_000) == 50_000  # capped at the default
    assert resolve_threshold(cfg, "web_extract", 20_000) == 20_000
    assert cfg.resolve_threshold("anything") == 50_000
    with pytest.raises(TypeError):
        cfg.tool_overrides["x"] = 1  # type: ignore[index]
    with pytest.raises(ValueError, match="turn_budget must be an int >= 0, got -1"):
        BudgetConfig(turn_budget=-1)
    with pytest.raises(ValueError, match=r"tool_overrides\['terminal'\] must be a number >= 0"):
        BudgetConfig(tool_overrides={"terminal": -1})  # before: accepted
    assert BudgetConfig(tool_overrides={"x": math.inf}).resolve_threshold("x") == math.inf


def test_next_to_persist_largest_first_until_under_budget() -> None:
    assert next_to_persist([10, 20], [True, True], 30) is None
    assert next_to_persist([10, 50, 40], [True, True, True], 30) == 1
    assert next_to_persist([10, 50, 40], [True, False, True], 30) == 2
    assert next_to_persist([10, 50, 40], [False, False, False], 30) is None


def test_result_file_name_unique_and_safe() -> None:
    a, b = result_file_name("functions.read:0"), result_file_name("functions.read:0")
    assert a != b and a.startswith("functions.read_0-") and a.endswith(".txt")
    assert result_file_name("../../etc/passwd", "n") == "_.._etc_passwd-n.txt"
    assert "/" not in result_file_name("a/b", "n")


def test_preview_text_and_size() -> None:
    content = "".join(f"row {i:06d}\n" for i in range(20_000))
    text = render_preview(content, "/tmp/r/x.txt", 1_500)
    assert text.startswith(PERSISTED_OUTPUT_TAG) and text.endswith("</persisted-output>")
    assert f"({len(content):,} characters," in text
    assert "Full output saved to: /tmp/r/x.txt" in text
    assert "read_file" in text and "offset" in text and "limit" in text
    preview = text.split("Preview (first ", 1)[1].split("chars):\n", 1)[1]
    shown = preview.removesuffix("\n...\n</persisted-output>")
    assert content.startswith(shown) and len(shown) <= 1_500
    assert shown.endswith("row 000135")  # cut at the last newline inside the limit
    failed = render_preview(content, None, 100)
    assert failed.endswith(
        f"[Truncated: tool response was {len(content):,} chars. "
        "Full output could not be saved to sandbox.]"
    )


def test_long_json_lines_are_saved_pretty() -> None:
    payload = json.dumps({"matches": [{"line": i, "content": "x" * 50} for i in range(200)]})
    saved = content_for_file(payload)
    assert json.loads(saved) == json.loads(payload)
    assert max(len(x) for x in saved.split("\n")) < 200
    assert content_for_file("short\nlines\n") == "short\nlines\n"
    text = render_preview("y" * 5000, "/p", 100)
    assert "cut -c 2001-4000" in text  # long non-JSON lines: says how to reach them


# --------------------------------------------------------------------------------------------
# Async shells


async def test_small_or_exempt_results_pass_through(sandbox: LocalSandbox) -> None:
    assert await maybe_persist_tool_result("x" * 10, "terminal", "c1", sandbox) == "x" * 10
    big = "z" * 150_000
    assert await maybe_persist_tool_result(big, "read_file", "c2", sandbox) is big
    at_limit = "a" * 100_000
    assert await maybe_persist_tool_result(at_limit, "terminal", "c3", sandbox) is at_limit


async def test_oversized_result_is_saved_in_the_sandbox(sandbox: LocalSandbox) -> None:
    content = "".join(f"line {i}\n" for i in range(30_000))
    out = await maybe_persist_tool_result(content, "terminal", "call_1", sandbox)
    assert out.startswith(PERSISTED_OUTPUT_TAG)
    match = SAVED.search(out)
    assert match is not None
    path = match.group(1)
    # In the sandbox's own temp dir (namespaced: its private /tmp; process mode: <root>/tmp).
    assert path.startswith(str(Path(sandbox.env["TMPDIR"]) / "hermes-results"))
    assert Path(path).name.startswith("call_1-")
    assert await sandbox.read_bytes(path) == content.encode()
    # The model can follow the preview's advice: read_file with offset/limit in the sandbox.
    runtime = ToolRuntime("budget-test", sandboxes=_Provider(sandbox))
    page = json.loads(
        (await dispatch("read_file", json.dumps({"path": path, "offset": 29_999}), runtime)).content
    )
    assert page["content"] == " 29999|line 29998\n 30000|line 29999"


async def test_same_call_id_twice_gives_two_files(sandbox: LocalSandbox) -> None:
    a = await maybe_persist_tool_result("a" * 200, "t", "functions.x:0", sandbox, threshold=100)
    b = await maybe_persist_tool_result("b" * 200, "t", "functions.x:0", sandbox, threshold=100)
    pa, pb = SAVED.search(a), SAVED.search(b)
    assert pa and pb and pa.group(1) != pb.group(1)
    assert await sandbox.read_bytes(pa.group(1)) == b"a" * 200
    assert await sandbox.read_bytes(pb.group(1)) == b"b" * 200


async def test_unsaveable_result_falls_back_to_truncation() -> None:
    out = await maybe_persist_tool_result("q" * 200_000, "terminal", "c", None)
    assert out.startswith("q" * 1_500) and "could not be saved" in out
    out = await maybe_persist_tool_result("q" * 200_000, "terminal", "c", _BrokenSandbox())
    assert "could not be saved" in out and len(out) < 2_000


async def test_turn_budget_persists_largest_first(sandbox: LocalSandbox) -> None:
    cfg = BudgetConfig(turn_budget=10_000, preview_size=100)
    messages: list[JSONObject] = [
        {"role": "tool", "tool_call_id": "small", "content": "s" * 1_000},
        {"role": "tool", "tool_call_id": "big", "content": "b" * 8_000},
        {"role": "tool", "tool_call_id": "mid", "content": "m" * 4_000},
        {"role": "tool", "tool_call_id": "rf", "name": "read_file", "content": "r" * 5_000},
    ]
    replaced = await enforce_turn_budget(messages, sandbox, cfg)
    # 18 K -> persist "big" (8 K) -> ~10.6 K still over -> persist "mid"; read_file exempt.
    assert replaced == [1, 2]
    assert messages[0]["content"] == "s" * 1_000
    assert messages[3]["content"] == "r" * 5_000
    assert sum(len(m["content"]) for m in messages) <= 10_000
    for i, letter in ((1, "b"), (2, "m")):
        m = SAVED.search(messages[i]["content"])
        assert m and (await sandbox.read_bytes(m.group(1)))[:1] == letter.encode()
    # A second pass changes nothing (already persisted results are left alone).
    assert await enforce_turn_budget(messages, sandbox, cfg) == []


async def test_turn_budget_stops_when_nothing_is_eligible(sandbox: LocalSandbox) -> None:
    messages: list[JSONObject] = [
        {"role": "tool", "tool_call_id": "a", "content": "a" * 500},
        {"role": "tool", "tool_call_id": "b", "content": "b" * 500},
    ]
    cfg = BudgetConfig(turn_budget=100, preview_size=1_500)
    assert await enforce_turn_budget(messages, sandbox, cfg, tool_names=["x", "y"]) == []


class _Provider:
    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    async def get(self, task_id: str) -> Sandbox:
        return self.sandbox


class _BrokenSandbox(Sandbox):
    task_id = "broken"
    workdir = "/nowhere"

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        return ExecResult("", "disk full", 1)

    async def read_bytes(self, path: str) -> bytes:
        raise FileNotFoundError(path)

    async def write_bytes(self, path: str, data: bytes) -> None:
        raise OSError("disk full")

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        raise OSError("disk full")

    async def get_archive(self, path: str) -> bytes:
        raise FileNotFoundError(path)

    async def aclose(self) -> None:
        return None

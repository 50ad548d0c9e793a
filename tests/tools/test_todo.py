from __future__ import annotations

import json

import pytest

from hermes_async.tools.registry import ToolRuntime, dispatch
from hermes_async.tools.todo import TodoStore

pytestmark = pytest.mark.anyio


def test_replace_normalizes_and_dedupes() -> None:
    store = TodoStore()
    store.write(
        [
            {"id": "1", "content": "first", "status": "pending"},
            {"id": "2", "content": "", "status": "bogus"},
            {"id": "", "content": "no id", "status": "completed"},
            {"id": "1", "content": "first again", "status": "in_progress"},
        ]
    )
    assert store.items() == [
        {"id": "1", "content": "first again", "status": "in_progress"},
        {"id": "2", "content": "(no description)", "status": "pending"},
        {"id": "?", "content": "no id", "status": "completed"},
    ]
    store.write([{"id": "9", "content": "only", "status": "pending"}])
    assert [i["id"] for i in store.items()] == ["9"]


def test_merge_updates_and_appends() -> None:
    store = TodoStore()
    store.write([{"id": "a", "content": "A", "status": "pending"}])
    store.write(
        [{"id": "a", "status": "completed"}, {"id": "b", "content": "B", "status": "pending"}],
        merge=True,
    )
    assert store.items() == [
        {"id": "a", "content": "A", "status": "completed"},
        {"id": "b", "content": "B", "status": "pending"},
    ]
    assert store.result()["summary"] == {
        "total": 2,
        "pending": 1,
        "in_progress": 0,
        "completed": 1,
        "cancelled": 0,
    }


async def test_todo_tool_per_rollout_store() -> None:
    r1, r2 = ToolRuntime("r1"), ToolRuntime("r2")
    write = {"todos": [{"id": "1", "content": "x", "status": "in_progress"}]}
    out = await dispatch("todo", json.dumps(write), r1)
    assert json.loads(out.content) == {
        "todos": [{"id": "1", "content": "x", "status": "in_progress"}],
        "summary": {"total": 1, "pending": 0, "in_progress": 1, "completed": 0, "cancelled": 0},
    }
    # Reading with no arguments; the other rollout's list is separate.
    assert json.loads((await dispatch("todo", "", r1)).content)["summary"]["total"] == 1
    assert json.loads((await dispatch("todo", "{}", r2)).content)["todos"] == []


async def test_todo_bad_status_rejected_by_schema() -> None:
    out = await dispatch(
        "todo", '{"todos": [{"id": "1", "content": "x", "status": "done"}]}', ToolRuntime("r")
    )
    assert out.error is not None and "status" in out.error

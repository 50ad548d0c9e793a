"""The per-rollout todo list behind the ``todo`` tool (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hermes_async.jsontypes import JSONObject

__all__ = ["TODO_STATUSES", "TodoStore"]

#: Valid item statuses, in the order the summary reports them.
TODO_STATUSES = ("pending", "in_progress", "completed", "cancelled")


def _normalize(item: Any) -> dict[str, str]:
    data = item if isinstance(item, dict) else {}
    status = str(data.get("status") or "pending").strip()
    return {
        "id": str(data.get("id") or "").strip() or "?",
        "content": str(data.get("content") or "").strip() or "(no description)",
        "status": status if status in TODO_STATUSES else "pending",
    }


class TodoStore:
    """One rollout's todo list, with the reference's write semantics.

    * ``merge=False`` replaces the list: items are normalized (missing id -> ``"?"``, empty
      content -> ``"(no description)"``, unknown status -> ``pending``) and de-duplicated by id,
      the last occurrence winning at the position of the first.
    * ``merge=True`` updates the fields given for existing ids and appends new ids.
    """

    def __init__(self) -> None:
        self._items: list[dict[str, str]] = []

    def write(self, todos: Iterable[Any], *, merge: bool = False) -> None:
        """Replace or merge ``todos`` into the list."""
        if not merge:
            by_id: dict[str, dict[str, str]] = {}
            for raw in todos:
                item = _normalize(raw)
                by_id[item["id"]] = item
            self._items = list(by_id.values())
            return
        index = {item["id"]: item for item in self._items}
        for raw in todos:
            data = raw if isinstance(raw, dict) else {}
            item_id = str(data.get("id") or "").strip() or "?"
            existing = index.get(item_id)
            if existing is None:
                new = _normalize(data)
                self._items.append(new)
                index[new["id"]] = new
                continue
            if str(data.get("content") or "").strip():
                existing["content"] = str(data["content"]).strip()
            status = str(data.get("status") or "").strip()
            if status in TODO_STATUSES:
                existing["status"] = status

    def items(self) -> list[dict[str, str]]:
        """A copy of the current items."""
        return [dict(item) for item in self._items]

    def result(self) -> JSONObject:
        """The tool's result object: the items and a count per status."""
        summary = {"total": len(self._items), **dict.fromkeys(TODO_STATUSES, 0)}
        for item in self._items:
            summary[item["status"]] += 1
        return {"todos": self.items(), "summary": summary}

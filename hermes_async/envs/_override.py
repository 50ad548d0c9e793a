"""The reference's single-rollout extension point: a subclass that overrides ``collect_trajectory``.

When a subclass overrides it, ``collect_trajectories`` runs it ``group_size`` times
concurrently and builds the group as atroposlib does, keeping ``inference_logprobs`` and
leaving out ``None`` items. See docs/architecture.md, "Single-rollout overrides".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from hermes_async._paced import start_paced

__all__ = ("collect_with_override", "overrides")

_OPTIONAL_PER_ITEM = ("advantages", "ref_logprobs", "messages", "overrides", "images")


def overrides(instance: object, base: type, name: str) -> bool:
    """Whether ``type(instance)`` replaces ``base``'s attribute ``name``."""
    return getattr(type(instance), name, None) is not getattr(base, name, None)


def _group_from_items(
    items: Sequence[Mapping[str, Any] | None],
    *,
    generation_params: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The ``ScoredDataGroup`` of per-rollout items, or ``None`` when none is left.

    Raises:
        TypeError: An item is neither a mapping nor ``None``.
    """
    kept: list[Mapping[str, Any]] = []
    for item in items:
        if item is None:
            continue
        if not isinstance(item, Mapping):
            raise TypeError(
                "collect_trajectory must return (scored_item_dict | None, backlog); got a "
                f"{type(item).__name__} as the scored item"
            )
        kept.append(item)
    if not kept:
        return None
    group: dict[str, Any] = {
        "tokens": [list(i["tokens"]) for i in kept],
        "masks": [list(i["masks"]) for i in kept],
        "scores": [float(i["scores"]) for i in kept],
        "advantages": [],
        "ref_logprobs": [],
        "messages": [],
        "group_overrides": {},
        "overrides": [],
        "images": [],
        "generation_params": dict(generation_params) if generation_params is not None else None,
    }
    for item in kept:
        for key in _OPTIONAL_PER_ITEM:
            if item.get(key) is not None:
                group[key].append(item[key])
        if item.get("group_overrides"):
            group["group_overrides"].update(item["group_overrides"])
    logprobs = [i.get("inference_logprobs") for i in kept]
    group["inference_logprobs"] = (
        [list(lp) for lp in logprobs if lp is not None]
        if all(lp is not None for lp in logprobs)
        else None
    )
    return group


async def collect_with_override(
    collect: Callable[[Any], Awaitable[tuple[Any, list[Any]]]],
    item: Any,
    size: int,
    *,
    generation_params: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, list[Any]]:
    """Run ``collect(item)`` ``size`` times concurrently; build the group. One failure cancels all.

    **Cancellation**: reaches every rollout.
    """
    results: list[tuple[Any, list[Any]] | None] = [None] * size

    async def one(index: int) -> None:
        results[index] = await collect(item)

    async with anyio.create_task_group() as tg:
        await start_paced(tg, one, range(size), name=lambda i: f"collect_trajectory #{i}")
    items: list[Any] = []
    backlog: list[Any] = []
    for result in results:
        scored, more = result if result is not None else (None, [])
        items.append(scored)
        backlog.extend(more or [])
    return _group_from_items(items, generation_params=generation_params), backlog

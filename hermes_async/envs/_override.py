"""The reference's single-rollout extension point: a subclass that overrides ``collect_trajectory``.

In the reference, atroposlib's ``collect_trajectories`` ran ``collect_trajectory(item)``
``group_size`` times and built the group; a subclass customised one rollout by overriding it.
:class:`~hermes_async.envs.base.HermesAgentBaseEnv` runs whole groups through the rollout core
(``run_group``) instead, which is faster and keeps ``inference_logprobs``. So that the extension
point still works, ``collect_trajectories`` checks once per call whether the subclass overrides
``collect_trajectory`` (:func:`overrides`, one attribute comparison: the default path pays
nothing measurable) and, if it does, runs the override ``group_size`` times concurrently and
builds the group from what it returns (:func:`_group_from_items`).

Building the group follows atroposlib's default collector: ``tokens``, ``masks`` and ``scores``
from every item; ``advantages``, ``ref_logprobs``, ``messages``, ``overrides`` and ``images``
from the items that have them; ``group_overrides`` merged. Two differences, on purpose:
``inference_logprobs`` is kept (when every item carries it; atroposlib drops it and trainers
then crash on ``None``), and an item that is ``None`` (a rollout the override decided to skip) is
left out instead of failing the whole group with a ``ValueError``; a group with no item left is
``None`` (atroposlib retries the item). The backlogs are concatenated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

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
    """The ``ScoredDataGroup`` of per-rollout items (see the module docstring), or ``None``.

    Raises:
        TypeError: An item is neither a mapping nor ``None`` (the override returned something
            else as the first element of its pair).
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
    """Run ``collect(item)`` ``size`` times concurrently; build the group from the results.

    A rollout that raises cancels its siblings (the task group); the caller unwraps a lone
    exception.

    **Cancellation**: reaches every rollout.
    """
    results: list[tuple[Any, list[Any]] | None] = [None] * size

    async def one(index: int) -> None:
        results[index] = await collect(item)

    async with anyio.create_task_group() as tg:
        for index in range(size):
            tg.start_soon(one, index, name=f"collect_trajectory #{index}")
    items: list[Any] = []
    backlog: list[Any] = []
    for result in results:
        scored, more = result if result is not None else (None, [])
        items.append(scored)
        backlog.extend(more or [])
    return _group_from_items(items, generation_params=generation_params), backlog

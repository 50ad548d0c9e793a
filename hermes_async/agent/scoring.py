"""Training rows from finished rollouts, as pure functions (no I/O, no atroposlib).

Phase 2 rows are the ids the server sampled (:func:`exact_rows`); Phase 1 rows are the
reference's placeholders, not trainable (:func:`placeholder_rows`). :func:`scored_data_group`
builds Atropos' ``ScoredDataGroup`` dict, with redacted ``messages`` and failures and policy
versions in ``overrides``. The dict's fields: docs/architecture.md, "Training rows and the
scored group".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hermes_async._redact import redact_messages
from hermes_async.agent.failures import RolloutFailure
from hermes_async.agent.result import AgentResult
from hermes_async.inference.trajectory import MASK_ID, MASKED_LOGPROB

__all__ = (
    "Rows",
    "ScoredRows",
    "exact_rows",
    "model_answered",
    "placeholder_rows",
    "rollout_rows",
    "scored_data_group",
    "scored_data_item",
)


@dataclass(frozen=True, slots=True)
class Rows:
    """One rollout's training rows, aligned one to one.

    Attributes:
        masks: The id where the policy sampled it, ``-100`` elsewhere.
        logprobs: The sampled logprob, ``1.0`` at masked positions.
        trainable: True for exact Phase 2 tokens; False for Phase 1 placeholders.
    """

    tokens: list[int]
    masks: list[int]
    logprobs: list[float]
    trainable: bool


class ScoredRows(Protocol):
    """What :func:`scored_data_group` reads of each rollout (``ScoredRollout`` has it)."""

    @property
    def tokens(self) -> list[int]: ...

    @property
    def masks(self) -> list[int]: ...

    @property
    def logprobs(self) -> list[float]: ...

    @property
    def reward(self) -> float: ...

    @property
    def messages(self) -> list[dict[str, Any]]: ...

    @property
    def failure(self) -> RolloutFailure | None: ...


def _node_field(node: object, name: str) -> Iterable[Any]:
    value = node.get(name) if isinstance(node, Mapping) else getattr(node, name, None)
    return value or ()


def exact_rows(managed_state: Mapping[str, Any] | None) -> Rows | None:
    """The Phase 2 rows of ``managed_state`` (its last node), or ``None`` if it has none."""
    nodes = (managed_state or {}).get("nodes") or []
    if not nodes:
        return None
    node = nodes[-1]
    return Rows(
        tokens=_as(int, _node_field(node, "tokens")),
        masks=_as(int, _node_field(node, "masked_tokens")),
        logprobs=_as(float, _node_field(node, "logprobs")),
        trainable=True,
    )


def _as(kind: type[Any], values: Iterable[Any]) -> list[Any]:
    """``values`` as a new list of ``kind``: copied when a list holds exactly that type (this
    library's trajectories), converted one by one otherwise (numpy numbers, bools)."""
    # One C pass to read the types is cheaper than a call to kind() per value.
    if type(values) is list and set(map(type, values)) <= {kind}:
        return values.copy()
    return list(map(kind, values))


def placeholder_rows(
    messages: Sequence[Mapping[str, Any]], encode: Callable[[str], Sequence[int]]
) -> Rows:
    """Phase 1 placeholder rows, as the reference built them (not trainable).

    The non-empty string contents joined by newlines and encoded; the first token masked,
    every logprob ``1.0``.
    """
    text = "\n".join(
        str(m["content"]) for m in messages if isinstance(m.get("content"), str) and m["content"]
    )
    tokens = [int(t) for t in encode(text)]
    masks = [MASK_ID, *tokens[1:]] if tokens else []
    return Rows(tokens, masks, [MASKED_LOGPROB] * len(tokens), trainable=False)


def rollout_rows(result: AgentResult, encode: Callable[[str], Sequence[int]]) -> Rows:
    """Exact rows if the rollout has a token trajectory, else placeholder rows."""
    exact = exact_rows(result.managed_state)
    return exact if exact is not None else placeholder_rows(result.messages, encode)


def model_answered(result: AgentResult) -> bool:
    """Whether the model produced anything at all (else there is nothing to reward)."""
    return result.turns_used > 0 and any(
        m.get("role") not in ("system", "user") for m in result.messages
    )


def _failure_override(rollout: ScoredRows) -> dict[str, Any]:
    """The rollout's ``overrides`` entry (failure and policy versions), or ``{}``."""
    failure = rollout.failure
    out: dict[str, Any] = {"failure": failure.to_json()} if failure is not None else {}
    out.update(_version_override(rollout))
    return out


def _spans(rollout: object) -> list[tuple[int, int, int | None]]:
    spans = getattr(rollout, "version_spans", None)
    return list(spans) if spans else []


def _version_override(rollout: object) -> dict[str, Any]:
    """The rollout's ``policy_versions`` and their min and max, or ``{}``."""
    spans = [(a, b, v) for a, b, v in _spans(rollout) if v is not None]
    if not spans:
        return {}
    versions = [v for _, _, v in spans]
    out: dict[str, Any] = {
        "policy_versions": [[a, b, v] for a, b, v in spans],
        "policy_version_min": min(versions),
        "policy_version_max": max(versions),
    }
    masked = getattr(rollout, "stale_masked_tokens", 0)
    if masked:
        out["stale_masked_tokens"] = masked
    return out


def scored_data_item(rollout: ScoredRows) -> dict[str, Any]:
    """One rollout as atroposlib's ``collect_trajectory`` returns it (``scores`` a float)."""
    item: dict[str, Any] = {
        "tokens": rollout.tokens,
        "masks": rollout.masks,
        "scores": rollout.reward,
        "inference_logprobs": rollout.logprobs,
        "messages": redact_messages(rollout.messages),
    }
    override = _failure_override(rollout)
    if override:
        item["overrides"] = override
    return item


def scored_data_group(
    rollouts: Sequence[ScoredRows],
    *,
    generation_params: Mapping[str, Any] | None = None,
    group_overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Atropos-shaped group dict of ``rollouts`` (a ``ScoredDataGroup``), aligned.

    ``overrides`` is ``None`` if no rollout has a failure or policy versions;
    ``group_overrides`` is merged into the group's policy versions.
    """
    versions = [v for r in rollouts for _, _, v in _spans(r) if v is not None]
    group: dict[str, Any] = {}
    if versions:
        group = {"policy_version_min": min(versions), "policy_version_max": max(versions)}
    group.update(group_overrides or {})
    failed = any(r.failure is not None for r in rollouts) or bool(versions)
    return {
        "tokens": [r.tokens for r in rollouts],
        "masks": [r.masks for r in rollouts],
        "scores": [r.reward for r in rollouts],
        "inference_logprobs": [r.logprobs for r in rollouts],
        "messages": [redact_messages(r.messages) for r in rollouts],
        "advantages": None,
        "ref_logprobs": None,
        "generation_params": dict(generation_params) if generation_params is not None else None,
        "group_overrides": group,
        "overrides": [_failure_override(r) for r in rollouts] if failed else None,
        "images": None,
    }

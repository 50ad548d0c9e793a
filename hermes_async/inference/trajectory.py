"""Exact token bookkeeping for one Phase 2 rollout.

Tokens are built, never re-tokenized, from ``prompt``, ``completion`` (the sampled ids,
their logprobs and policy version; the only trained segments) and ``suffix`` segments. A
resumed generation splits where its version changed. Masks follow Atropos (``-100``),
logprobs the reference's ManagedServer node (``1.0`` where not trained).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from hermes_async.jsontypes import JSONObject

__all__ = (
    "MASKED_LOGPROB",
    "MASK_ID",
    "Segment",
    "Trajectory",
    "TrajectoryError",
)

#: Atropos' "not trained" mask value.
MASK_ID = -100
#: Logprob reported at masked positions (what atroposlib's trainers expect).
MASKED_LOGPROB = 1.0

SegmentKind = Literal["prompt", "completion", "suffix"]


class TrajectoryError(ValueError):
    """Token bookkeeping was given inconsistent data (e.g. ids and logprobs of different length)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of tokens of one kind, in compact arrays: thousands of parked rollouts stay resident."""

    kind: SegmentKind
    token_ids: array[int]
    logprobs: array[float] | None = None
    #: The turn (1-based) a completion or suffix belongs to; 0 for the prompt.
    turn: int = 0
    #: The policy version that sampled a completion (``None``: unknown / not sampled).
    version: int | None = None


@dataclass(slots=True)
class Trajectory:
    """The growing token sequence of one rollout.

    Args:
        prompt_ids: Ids of the first rendered prompt, kept as a compact array. An
            ``array('i')`` is kept as it is, not copied: a group's rollouts share one, and
            neither the trajectory nor its caller may change it.
    """

    prompt_ids: Sequence[int]
    segments: list[Segment] = field(default_factory=list)
    #: Aborted generations that were resumed (over every turn).
    resumes: int = 0

    def __post_init__(self) -> None:
        if not self.segments:
            given = self.prompt_ids
            ids = given if isinstance(given, array) and given.typecode == "i" else array("i", given)
            self.prompt_ids = ids
            self.segments.append(Segment("prompt", ids))

    def add_completion(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        *,
        turn: int = 0,
        version: int | None = None,
    ) -> None:
        """Append turn ``turn``'s sampled ids and logprobs, sampled by policy version ``version``.

        Raises:
            TrajectoryError: ``len(token_ids) != len(logprobs)``.
        """
        if len(token_ids) != len(logprobs):
            raise TrajectoryError(
                f"completion has {len(token_ids)} token ids but {len(logprobs)} logprobs; "
                "the server must return one logprob per sampled token"
            )
        self.segments.append(
            Segment("completion", array("i", token_ids), array("d", logprobs), turn, version)
        )

    def add_suffix(self, token_ids: Sequence[int], *, turn: int = 0) -> None:
        """Append ids the loop rendered itself (masked positions) after turn ``turn``."""
        if token_ids:
            self.segments.append(Segment("suffix", array("i", token_ids), None, turn))

    @property
    def tokens(self) -> list[int]:
        """All ids in order; also the prompt for the next turn."""
        # Joined as arrays (a copy in C) and converted once: a comprehension over every id
        # costs ~30 ns per token per turn, which adds up over long rollouts.
        return self.token_array().tolist()

    def token_array(self) -> array[int]:
        """All ids in order, as a compact array (4 bytes a token, not a Python int each)."""
        joined = array("i")
        for seg in self.segments:
            joined += seg.token_ids
        return joined

    @property
    def masks(self) -> list[int]:
        """``-100`` on prompt and suffix positions, the id on completion positions."""
        out: list[int] = []
        for seg in self.segments:
            if seg.kind == "completion":
                out.extend(seg.token_ids)
            else:
                out.extend([MASK_ID] * len(seg.token_ids))
        return out

    @property
    def logprobs(self) -> list[float]:
        """Sampled logprobs on completion positions, ``1.0`` elsewhere."""
        out: list[float] = []
        for seg in self.segments:
            if seg.kind == "completion" and seg.logprobs is not None:
                out.extend(seg.logprobs)
            else:
                out.extend([MASKED_LOGPROB] * len(seg.token_ids))
        return out

    @property
    def completion_token_count(self) -> int:
        """How many ids were sampled in total."""
        return sum(len(s.token_ids) for s in self.segments if s.kind == "completion")

    def __len__(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    def to_node(self) -> JSONObject:
        """The reference's ManagedServer node shape: ``tokens``, ``masked_tokens``, ``logprobs``."""
        return {"tokens": self.tokens, "masked_tokens": self.masks, "logprobs": self.logprobs}

    def boundaries(self) -> list[JSONObject]:
        """The segments as ``{"kind", "turn", "start", "end"}`` token offsets, in order.

        A completion's ``tokens[start:end]`` is exactly what the server sampled; completions
        also carry ``"version"``. A turn has several when a resumed generation changed version.
        """
        out: list[JSONObject] = []
        start = 0
        for seg in self.segments:
            end = start + len(seg.token_ids)
            entry: JSONObject = {"kind": seg.kind, "turn": seg.turn, "start": start, "end": end}
            if seg.kind == "completion":
                entry["version"] = seg.version
            out.append(entry)
            start = end
        return out

    def versions(self) -> list[int]:
        """The distinct policy versions of the completion segments, in order of appearance."""
        seen: dict[int, None] = {}
        for seg in self.segments:
            if seg.kind == "completion" and seg.version is not None:
                seen.setdefault(seg.version)
        return list(seen)

    def managed_state(self) -> JSONObject:
        """``{"nodes": [node], "segments", "policy_versions", "resumes"}`` for ``AgentResult``.

        ``nodes`` is the reference's shape; the other keys are additive.
        """
        return {
            "nodes": [self.to_node()],
            "segments": self.boundaries(),
            "policy_versions": list(self.versions()),
            "resumes": self.resumes,
        }

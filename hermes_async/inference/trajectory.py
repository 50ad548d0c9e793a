"""Exact token bookkeeping for one Phase 2 rollout.

A rollout's token sequence is built, never re-tokenized, from three kinds of segment:

* ``prompt``: the rendered first prompt (system, user, tools, generation prompt) — not trained;
* ``completion``: exactly the ids the server sampled, with their logprobs — trained;
* ``suffix``: what the loop renders between two completions (an end-of-turn token the server did
  not sample, the tool responses, the next generation prompt) — not trained.

The next turn's prompt is always ``tokens`` so far; the server's sampled ids are kept verbatim,
so a model that writes ``{"a":1}`` is trained on exactly that, not on a re-rendering.

A completion segment also carries the **policy version** that sampled it (read once per
request from the trainer's version source; ``None`` without one). A turn whose generation was
aborted and resumed under another version is split into two completion segments exactly at
the first token of the resumed request, so every token is labelled with the version of the
request that produced it.

Masks follow Atropos: ``-100`` where not trained, the token id where trained. Logprobs follow
the reference's ManagedServer node: the sampled logprob on trained positions, ``1.0`` elsewhere.
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
    """A run of tokens of one kind (see the module docstring).

    Ids and logprobs are kept in compact arrays (4 and 8 bytes per token instead of a Python
    object each): thousands of rollouts stay resident while they wait on tools.
    """

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
        prompt_ids: Ids of the first rendered prompt. Kept as the prompt segment's compact
            array (the same object), not as the list given: the tokenizer's list of Python
            ints costs ~40 bytes per token, which thousands of parked rollouts would keep. An
            ``array('i')`` is kept as it is, not copied (the rollouts of a group share one;
            the trajectory never changes a segment's ids, and neither may its caller).
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
        """Append sampled ids and their logprobs (trained positions) of turn ``turn``, sampled
        by policy version ``version``.

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

        ``tokens[start:end]`` of a ``completion`` is exactly what the server sampled on that
        turn (several completion segments of one turn: a resumed generation whose policy
        version changed); a ``suffix`` follows its turn's completion; the ``prompt`` (turn 0)
        comes first. Completion segments also carry ``"version"`` (``None``: unknown).
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
        """``{"nodes": [node], "segments": [...], "policy_versions": [...], "resumes": n}``,
        as ``AgentResult.managed_state`` carries it.

        ``nodes`` is the reference's shape; ``segments`` (:meth:`boundaries`, each completion
        with its ``version``), ``policy_versions`` (:meth:`versions`) and ``resumes`` (aborted
        generations that were resumed) are additive.
        """
        return {
            "nodes": [self.to_node()],
            "segments": self.boundaries(),
            "policy_versions": list(self.versions()),
            "resumes": self.resumes,
        }

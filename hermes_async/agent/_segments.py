"""Phase 2 segments against the chat template: where each turn's text sits, and the check.

Pure text arithmetic: the token turn calls :func:`place_turn` once per turn. A turn's suffix
is cut out of the template's own rendering, so the next prompt is exactly what the template
would render. Each turn checks only what it adds, once. Design:
docs/decisions/036-template-check.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ("TemplateCheck", "place_turn")

#: Characters of text kept on each side of a divergence in a :class:`TemplateCheck`.
_EXCERPT_CHARS = 80
# How far back a divergence is moved to the start of a marker it falls inside.
_MARKER_CHARS = 16

CheckReason = Literal["history", "completion", "length"]


@dataclass(frozen=True, slots=True)
class TemplateCheck:
    """One divergence between the trajectory and the chat template's rendering.

    Attributes:
        turn: The 1-based turn at which it appeared.
        reason: ``"history"``, ``"completion"`` or ``"length"`` (see the decision record).
        counted: Whether it counts in ``AgentResult.template_mismatches`` (all but ``length``).
        position: Character offset in the template's rendering where the texts part.
        expected: The template's text from there (up to :data:`_EXCERPT_CHARS` characters).
        actual: The trajectory's text from there (up to :data:`_EXCERPT_CHARS` characters).
    """

    turn: int
    reason: CheckReason
    counted: bool
    position: int
    expected: str
    actual: str

    def describe(self) -> str:
        """One line for logs: turn, reason, position and both excerpts."""
        return (
            f"turn {self.turn}: {self.reason} divergence at char {self.position}: template "
            f"{self.expected!r}, trajectory {self.actual!r}"
        )


@dataclass(frozen=True, slots=True)
class _TurnPlacement:
    """Where one turn's completion sits: its suffix (``""`` after the final turn) and checks."""

    suffix: str
    checks: tuple[TemplateCheck, ...]


def _common_prefix_length(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (binary search on slices)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _marker_start(text: str, split: int) -> int:
    """``split`` moved back to the ``<`` of a marker it falls inside, so an excerpt starts whole."""
    opening = text.rfind("<", max(0, split - _MARKER_CHARS), split)
    return opening if opening >= 0 and ">" not in text[opening:split] else split


def _check(
    turn: int, reason: CheckReason, position: int, expected: str, actual: str
) -> TemplateCheck:
    return TemplateCheck(
        turn=turn,
        reason=reason,
        counted=reason != "length",
        position=position,
        expected=expected[:_EXCERPT_CHARS],
        actual=actual[:_EXCERPT_CHARS],
    )


def _splice(before: str, full: str, stop_texts: Sequence[str], *, ended_on_stop: bool) -> str:
    """The suffix when the completion could not be found in ``full`` as sampled.

    The end-of-turn text decides the cut: if ``full`` continues with it, it opens what follows
    (GLM's role tokens); otherwise it closed the assistant turn inside ``before`` (ChatML).
    """
    if not full.startswith(before):
        before = before[: _common_prefix_length(before, full)]
    tail = full[len(before) :]
    texts = [t for t in stop_texts if t]
    for text in texts:
        if tail.startswith(text):
            return tail[len(text) :] if ended_on_stop else tail
    cuts = [(before.rfind(text), text) for text in texts]
    cut, text = max(cuts, default=(-1, ""))
    if cut < 0:
        return tail
    return before[cut + len(text) :] + tail if ended_on_stop else before[cut:] + tail


def place_turn(
    *,
    turn: int,
    prompt: str,
    full: str,
    completion: str,
    stop_texts: Sequence[str],
    ended_on_stop: bool,
    final: bool,
    before: Callable[[], str],
) -> _TurnPlacement:
    """Check one turn against the template and find its suffix.

    Args:
        prompt: The rendering that prompted this turn (the previous turn's ``full``).
        full: The rendering after this turn: with a generation prompt, or without one if final.
        completion: The decoded sampled ids of this turn.
        stop_texts: The sampled stop token's text, or (cut by length) every end-of-turn text
            the template may close the turn with.
        ended_on_stop: The completion ends with a sampled stop token (``stop_texts[0]``).
        final: No generation follows.
        before: Renders up to this turn's assistant message; called only when the completion
            cannot be found as sampled.

    Returns:
        The suffix text and the divergences this turn introduced.
    """
    checks: list[TemplateCheck] = []
    start = len(prompt)
    if not full.startswith(prompt):
        split = _common_prefix_length(full, prompt)
        shown = _marker_start(full, split)
        checks.append(_check(turn, "history", shown, full[shown:], prompt[shown:]))
        # Find the completion again after the rewritten part (the sampled text itself is
        # usually still rendered verbatim).
        stop = stop_texts[0] if ended_on_stop and stop_texts else ""
        body = completion[: -len(stop)] if stop and completion.endswith(stop) else completion
        # The texts may part inside the completion's first characters (``<think>`` of the
        # prompt vs ``<tool_call>`` of the rendering share ``<t``): look from where the
        # completion could begin at the earliest.
        found = full.find(body, max(0, split - len(body))) if body else -1
        start = found if found >= 0 else -1
    if final and ended_on_stop and start >= 0 and stop_texts:
        # A stop token that opens the next message (GLM's <|user|>) is not rendered after the
        # final turn: the rendering ends with the completion's text before it.
        stop = stop_texts[0]
        trimmed = completion[: -len(stop)] if completion.endswith(stop) else None
        if (
            trimmed is not None
            and not full.startswith(completion, start)
            and full.startswith(trimmed, start)
            and not full[start + len(trimmed) :].strip()
        ):
            return _TurnPlacement("", tuple(checks))
    if start >= 0 and full.startswith(completion, start):
        rest = full[start + len(completion) :]
        if not final:
            return _TurnPlacement(rest, tuple(checks))
        if not rest.strip():
            return _TurnPlacement("", tuple(checks))
        if not ended_on_stop and any(
            text and rest.startswith(text) and not rest[len(text) :].strip() for text in stop_texts
        ):
            end = start + len(completion)
            checks.append(_check(turn, "length", end, rest, ""))
            return _TurnPlacement("", tuple(checks))
        end = start + len(completion)
        checks.append(_check(turn, "completion", end, rest, ""))
        return _TurnPlacement("", tuple(checks))
    if start >= 0:
        split = max(
            start, _marker_start(full, start + _common_prefix_length(full[start:], completion))
        )
        checks.append(_check(turn, "completion", split, full[split:], completion[split - start :]))
    elif not any(c.reason == "completion" for c in checks):
        checks.append(_check(turn, "completion", len(full), "", completion))
    if final:
        return _TurnPlacement("", tuple(checks))
    return _TurnPlacement(
        _splice(before(), full, stop_texts, ended_on_stop=ended_on_stop), tuple(checks)
    )

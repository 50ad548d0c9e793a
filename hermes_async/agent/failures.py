"""Why a rollout failed: the failure taxonomy, as a category on every result.

Each result carries at most one :class:`RolloutFailure`, the most severe. ``model`` and
``tool`` are observations of the policy; ``infra`` and ``verifier`` are what a group's
failure policy acts on. Classification is pure, and messages are redacted when built. The
categories and their severity: docs/architecture.md, "Failure categories".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from hermes_async._groups import unwrap_group
from hermes_async._redact import redact
from hermes_async.errors import InferenceError, SandboxError

__all__ = (
    "FAILURE_CATEGORIES",
    "GROUP_FAILURE_CATEGORIES",
    "FailureCategory",
    "FailureDetail",
    "RolloutFailure",
    "classify_exception",
    "worst_failure",
)

#: The failure categories (docs/architecture.md, "Failure categories").
FailureCategory: TypeAlias = Literal[
    "cancelled", "infra", "verifier", "agent_timeout", "model", "tool"
]

#: Every category, most severe first.
FAILURE_CATEGORIES: tuple[FailureCategory, ...] = (
    "cancelled",
    "infra",
    "verifier",
    "agent_timeout",
    "model",
    "tool",
)

#: Categories that say nothing about the policy: what a group's failure policy acts on.
GROUP_FAILURE_CATEGORIES: frozenset[FailureCategory] = frozenset({"infra", "verifier"})

#: Values of :attr:`RolloutFailure.detail` (JSON scalars, so a failure serializes as it is).
FailureDetail: TypeAlias = Mapping[str, str | int | float | bool | None]

_SEVERITY = {category: rank for rank, category in enumerate(FAILURE_CATEGORIES)}

#: How servers word a prompt that does not fit (vLLM, SGLang, OpenAI, llama.cpp, TGI).
_CONTEXT_LENGTH = re.compile(
    r"context[ _-]?length|context window|maximum (?:model )?(?:context|input|sequence) length"
    r"|prompt is too long|too many tokens|input (?:is )?too long|exceeds? the (?:model'?s? )?"
    r"(?:maximum|context)",
    re.I,
)

_MESSAGE_MAX_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class RolloutFailure:
    """What went wrong in one rollout: a category, a redacted message, structured detail.

    Build it with :meth:`of` (which redacts) or :func:`classify_exception`.

    Attributes:
        message: What happened, redacted (at most 2,000 characters).
        detail: Structured fields: ``source`` (``"model_server"``, ``"sandbox"``, ``"reward"``,
            ``"deadline"``, ``"tools"``, ``"harness"``), ``exception``, ``endpoint``,
            ``status``, ``completion_tokens``, ``count``, ...
    """

    category: FailureCategory
    message: str
    detail: FailureDetail = field(default_factory=dict)

    @classmethod
    def of(cls, category: FailureCategory, message: str, **detail: object) -> RolloutFailure:
        """A failure with ``message`` (and string ``detail`` values) redacted."""
        clean: dict[str, str | int | float | bool | None] = {}
        for key, value in detail.items():
            if value is None or isinstance(value, bool | int | float):
                clean[key] = value
            else:
                clean[key] = redact(str(value))[:_MESSAGE_MAX_CHARS]
        return cls(category, redact(message)[:_MESSAGE_MAX_CHARS], clean)

    @property
    def retryable(self) -> bool:
        """True for ``infra`` and ``verifier``: a re-run on a fresh sandbox may succeed."""
        return self.category in GROUP_FAILURE_CATEGORIES

    def to_json(self) -> dict[str, object]:
        """``{"category", "message", "detail"}`` (for JSONL, eval samples and overrides)."""
        return {"category": self.category, "message": self.message, "detail": dict(self.detail)}

    def __str__(self) -> str:
        return f"{self.category}: {self.message}"


def worst_failure(failures: Iterable[RolloutFailure | None]) -> RolloutFailure | None:
    """The most severe of ``failures`` (the first one among equals), or ``None``."""
    worst: RolloutFailure | None = None
    for failure in failures:
        if failure is not None and (
            worst is None or _SEVERITY[failure.category] < _SEVERITY[worst.category]
        ):
            worst = failure
    return worst


def _context_length_exceeded(text: str) -> bool:
    """Whether a server's error text says the prompt does not fit the model's context."""
    return bool(_CONTEXT_LENGTH.search(text))


def classify_exception(exc: BaseException, *, source: str) -> RolloutFailure:
    """The failure an exception means, raised while the rollout did ``source``.

    From the model server, a 400/413/422 saying the context is full is ``model``; anything else
    is ``infra``. A ``SandboxError`` is ``infra`` anywhere; from the reward, ``verifier``;
    anything else (a harness bug) is ``infra``. Exception groups are unwrapped first.
    """
    if isinstance(exc, BaseExceptionGroup):
        exc = unwrap_group(exc)
    name = type(exc).__name__
    text = f"{name}: {exc}"
    detail: dict[str, object] = {"source": source, "exception": name}
    for attr in ("endpoint", "status", "attempt"):
        value = getattr(exc, attr, None)
        if value is not None:
            detail[attr] = value
    received = getattr(exc, "token_ids", None)
    if isinstance(received, tuple | list) and received:
        detail["completion_tokens"] = len(received)  # the server sampled: it is alive
    if isinstance(exc, SandboxError):
        return RolloutFailure.of(
            "infra", f"sandbox failed: {text}", **{**detail, "source": "sandbox"}
        )
    if source == "reward":
        return RolloutFailure.of("verifier", f"reward failed: {text}", **detail)
    if source == "model_server":
        status = getattr(exc, "status", None)
        if (status in (400, 413, 422) or not isinstance(exc, InferenceError)) and (
            _context_length_exceeded(str(exc))
        ):
            return RolloutFailure.of("model", f"context length exceeded: {text}", **detail)
        return RolloutFailure.of("infra", f"model call failed: {text}", **detail)
    return RolloutFailure.of("infra", f"{source} raised {text}", **detail)

"""Why a rollout failed: the failure taxonomy, as a category on every result.

Every rollout result carries at most one :class:`RolloutFailure` — the most severe thing that
went wrong — with a :data:`FailureCategory`:

=================  =========================================================  ===============
category           what happened                                              the rollout
=================  =========================================================  ===============
``model``          the model wrote a malformed tool call (bad JSON, unknown    continues
                   tool, wrong arguments, cut off), or its context is full    (context: ends)
``tool``           a tool call failed (non-zero exit, timeout, missing file)  continues
``agent_timeout``  the rollout's deadline (``rollout_timeout``) or a turn's   ends, reward 0
                   deadline (``turn_timeout``) passed
``infra``          the sandbox could not be created or died, the model        ends, reward 0
                   server failed after its retries (5xx, disconnect, stall),
                   sent invalid token data, or the harness itself raised
``verifier``       the reward function raised or produced no reward            reward 0
                   (``None``, NaN, infinite), or ran past the deadline
``cancelled``      the rollout was cancelled from outside (a serve-mode       none emitted
                   worker timeout, SIGTERM, a cancelled eval)
=================  =========================================================  ===============

``model`` and ``tool`` are *observations*: the policy caused them and the reward judges the
result, so they are counted but change nothing. ``infra`` and ``verifier`` say nothing about
the policy: they are what a group's failure policy (retry / mask / zero, see
:class:`~hermes_async.agent.rollout.FailurePolicy`) acts on. ``agent_timeout`` is the policy's
slowness or the environment's; it has a policy of its own.

Severity (when several apply, the first of this order wins): ``cancelled``, ``infra``,
``verifier``, ``agent_timeout``, ``model``, ``tool`` — a rollout whose sandbox died is an infra
failure even if a tool call failed before.

The classification of exceptions is pure (:func:`classify_exception`), so it is tested without
I/O, and every message is redacted (:func:`~hermes_async._redact.redact`) when the failure is
built: a failure may go to logs, JSONL, wandb and eval samples as it is.
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

#: The failure categories (see the module docstring).
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
        category: The :data:`FailureCategory`.
        message: What happened, redacted of credentials (at most 2,000 characters).
        detail: Structured fields: ``source`` (``"model_server"``, ``"sandbox"``, ``"reward"``,
            ``"deadline"``, ``"tools"``, ``"harness"``), ``exception`` (the type name),
            ``endpoint`` (redacted), ``status``, ``completion_tokens`` (received before a
            model-server failure), ``count``, ...
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

    * from the model server (``source="model_server"``): an HTTP 400/413/422 whose text says
      the context is full is ``model`` (the policy's trajectory outgrew the model); anything
      else — 5xx, 429 after the retries, a disconnect, a stall past the read timeout, a
      malformed or invalid chunk, a 4xx for a wrong route or key — is ``infra``;
    * a :class:`~hermes_async.errors.SandboxError` is ``infra`` wherever it comes from;
    * from the reward (``source="reward"``): ``verifier``;
    * anything else (a bug in the harness, a parser that raised) is ``infra``: it says nothing
      about the policy.

    Exception groups are unwrapped to their lone exception first.
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

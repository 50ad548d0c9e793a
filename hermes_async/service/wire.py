"""The worker's wire model: a group asked for, and the group (or its failure) answered.

One versioned JSON shape (:data:`WIRE_VERSION`) for the HTTP service and the Ray actor.
:class:`GroupResult` is a :class:`~hermes_async.agent.ScoredGroup` across a process
boundary: rows, rewards and failures, never live objects, plus the outcome ``failed``.
Messages travel only when asked for, redacted.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Self, TypeAlias

import orjson

from hermes_async._json import exceeds_depth
from hermes_async._redact import redact_messages
from hermes_async.agent.failures import FAILURE_CATEGORIES, RolloutFailure
from hermes_async.agent.rollout import ScoredGroup, ScoredRollout
from hermes_async.errors import RequestError, WorkerError
from hermes_async.jsontypes import JSON, JSONObject

__all__ = (
    "MAX_DEADLINE_SECONDS",
    "WIRE_VERSION",
    "GroupRequest",
    "GroupResult",
    "GroupState",
    "RequestBounds",
    "RolloutRecord",
    "decode_json",
)

#: The wire model's version; a peer speaking another is refused with a clear error.
WIRE_VERSION = 1

#: Furthest a deadline may lie ahead: a day (an agentic group runs minutes to hours).
MAX_DEADLINE_SECONDS = 86_400.0

#: How a group ended: :data:`~hermes_async.agent.rollout.GroupOutcome`, or ``failed``.
GroupState: TypeAlias = Literal["ok", "retried", "zeroed", "masked", "stale", "failed"]
_STATES: frozenset[str] = frozenset({"ok", "retried", "zeroed", "masked", "stale", "failed"})

_MAX_JSON_DEPTH = 64


def decode_json(data: bytes, what: str) -> JSON:
    """Parse ``data`` as JSON, nesting bounded.

    Raises:
        RequestError: It is not JSON, or nests deeper than 64 levels (400).
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"{what} is not UTF-8: {exc}") from None
    if exceeds_depth(text, _MAX_JSON_DEPTH):
        raise RequestError(f"{what} nests deeper than {_MAX_JSON_DEPTH} levels")
    try:
        value: JSON = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"{what} is not valid JSON: {exc}") from None
    return value


@dataclass(frozen=True, slots=True)
class RequestBounds:
    """What a worker accepts (every field an operator maximum; see ``WorkerOptions``)."""

    max_group_size: int = 256
    max_item_bytes: int = 256 * 1024
    max_deadline_seconds: float = MAX_DEADLINE_SECONDS


def _check_version(obj: Mapping[str, Any], what: str) -> None:
    version = obj.get("wire")
    if version != WIRE_VERSION:
        raise RequestError(
            f"{what} speaks wire version {version!r}; this worker speaks {WIRE_VERSION}: "
            "upgrade the older side",
            status=422,
        )


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """One group asked of a worker.

    Attributes:
        deadline: Unix time the answer is due: the group, or a ``failed`` result.
        group_id: A worker refuses an id it is still running; a driver reports each id once.
        include_messages: Return each rollout's conversation (redacted) too.
    """

    environment: str
    item: JSON
    size: int
    deadline: float
    group_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    policy_version: int | None = None
    temperature: float | None = None
    include_messages: bool = False

    @classmethod
    def within(cls, seconds: float, environment: str, item: JSON, size: int, **kw: Any) -> Self:
        """A request due ``seconds`` from now."""
        return cls(environment, item, size, time.time() + seconds, **kw)

    def to_json(self) -> JSONObject:
        """The request's JSON object (``{"wire": 1, ...}``)."""
        return {
            "wire": WIRE_VERSION,
            "environment": self.environment,
            "item": self.item,
            "size": self.size,
            "deadline": self.deadline,
            "group_id": self.group_id,
            "policy_version": self.policy_version,
            "temperature": self.temperature,
            "include_messages": self.include_messages,
        }

    def to_bytes(self) -> bytes:
        """The request as JSON bytes."""
        return orjson.dumps(self.to_json())

    @classmethod
    def from_json(
        cls, obj: JSON, bounds: RequestBounds, *, now: float | None = None
    ) -> GroupRequest:
        """Check a decoded request against ``bounds`` (``now``: Unix time, default the clock).

        Raises:
            RequestError: A bad field (400), another wire version (422), an item too large
                (413), or a deadline passed or too far ahead (400).
        """
        if not isinstance(obj, dict):
            raise RequestError(f"a group request is a JSON object, got {type(obj).__name__}")
        _check_version(obj, "the request")
        unknown = sorted(set(obj) - _REQUEST_FIELDS)
        if unknown:
            raise RequestError(
                f"unknown request fields {unknown}; known: {sorted(_REQUEST_FIELDS)}"
            )
        environment = obj.get("environment")
        if not isinstance(environment, str) or not environment:
            raise RequestError(f"'environment' must be a non-empty string, got {environment!r:.80}")
        if "item" not in obj:
            raise RequestError("'item' is missing (the environment's item, any JSON value)")
        item = obj["item"]
        item_bytes = len(orjson.dumps(item))
        if item_bytes > bounds.max_item_bytes:
            raise RequestError(
                f"the item is {item_bytes} bytes of JSON; this worker takes at most "
                f"{bounds.max_item_bytes} (send a reference to large data instead)",
                status=413,
            )
        size = obj.get("size")
        if isinstance(size, bool) or not isinstance(size, int):
            raise RequestError(f"'size' must be an integer, got {size!r:.80}")
        if not 1 <= size <= bounds.max_group_size:
            raise RequestError(
                f"'size' must be between 1 and {bounds.max_group_size} (this worker's "
                f"max_group_size), got {size}"
            )
        deadline = obj.get("deadline")
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise RequestError(
                f"'deadline' must be a Unix time in seconds (a number), got {deadline!r:.80}"
            )
        now = time.time() if now is None else now
        if not math.isfinite(deadline) or deadline <= now:
            raise RequestError(
                f"the deadline {deadline!r} has already passed (now {now:.3f}): nothing can "
                "be done in time; send a later one"
            )
        if deadline - now > bounds.max_deadline_seconds:
            raise RequestError(
                f"the deadline is {deadline - now:.0f} s ahead; this worker takes at most "
                f"{bounds.max_deadline_seconds:.0f} s"
            )
        group_id = obj.get("group_id")
        if not isinstance(group_id, str) or not 0 < len(group_id) <= 200:
            raise RequestError(
                f"'group_id' must be a string of 1-200 characters, got {group_id!r:.80}"
            )
        version = obj.get("policy_version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise RequestError(f"'policy_version' must be an integer or null, got {version!r:.80}")
        temperature = obj.get("temperature")
        if temperature is not None and (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not 0 <= temperature <= 10
        ):
            raise RequestError(
                f"'temperature' must be a number in [0, 10] or null, got {temperature!r:.80}"
            )
        messages = obj.get("include_messages", False)
        if not isinstance(messages, bool):
            raise RequestError(f"'include_messages' must be true or false, got {messages!r:.80}")
        return cls(
            environment,
            item,
            size,
            float(deadline),
            group_id,
            version,
            None if temperature is None else float(temperature),
            messages,
        )


_REQUEST_FIELDS = frozenset(GroupRequest.__dataclass_fields__) | {"wire"}


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """One rollout of a :class:`GroupResult`: its training rows, reward and failure.

    ``masks`` hold the id where the policy sampled it and ``-100`` elsewhere; ``logprobs``
    hold ``1.0`` at masked positions; ``trainable`` means exact (Phase 2) tokens;
    ``messages`` travel, redacted, only when asked for.
    """

    task_id: str
    tokens: list[int]
    masks: list[int]
    logprobs: list[float]
    reward: float
    trainable: bool
    failure: RolloutFailure | None = None
    attempt: int = 1
    turns: int = 0
    seconds: float = 0.0
    policy_versions: list[int] = field(default_factory=list)
    stale_masked_tokens: int = 0
    messages: list[Any] | None = None

    @classmethod
    def of(cls, rollout: ScoredRollout, *, messages: bool) -> RolloutRecord:
        """The record of a scored rollout (messages redacted, if asked for)."""
        return cls(
            rollout.task_id,
            rollout.tokens,
            rollout.masks,
            rollout.logprobs,
            rollout.reward,
            rollout.trainable,
            rollout.failure,
            rollout.attempt,
            rollout.result.turns_used,
            rollout.seconds,
            rollout.policy_versions,
            rollout.stale_masked_tokens,
            redact_messages(rollout.messages) if messages else None,
        )

    def to_json(self) -> JSONObject:
        """The record's JSON object."""
        return {
            "task_id": self.task_id,
            "tokens": self.tokens,
            "masks": self.masks,
            "logprobs": self.logprobs,
            "reward": self.reward,
            "trainable": self.trainable,
            "failure": self.failure.to_json() if self.failure is not None else None,
            "attempt": self.attempt,
            "turns": self.turns,
            "seconds": self.seconds,
            "policy_versions": self.policy_versions,
            "stale_masked_tokens": self.stale_masked_tokens,
            "messages": self.messages,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RolloutRecord:
        """Read a record (see :meth:`GroupResult.from_json` for the errors)."""
        tokens, masks, logprobs = obj["tokens"], obj["masks"], obj["logprobs"]
        if not (len(tokens) == len(masks) == len(logprobs)):
            raise ValueError(
                f"rollout {obj.get('task_id')!r}: tokens, masks and logprobs differ in length "
                f"({len(tokens)}, {len(masks)}, {len(logprobs)})"
            )
        if not (type(tokens) is type(masks) is type(logprobs) is list):
            raise ValueError(
                f"rollout {obj.get('task_id')!r}: tokens, masks, logprobs must be lists"
            )
        return cls(
            str(obj["task_id"]),
            tokens,  # taken as decoded: a copy per element cost 5x the decode itself
            masks,
            logprobs,
            float(obj["reward"]),
            bool(obj["trainable"]),
            _failure(obj.get("failure")),
            int(obj.get("attempt", 1)),
            int(obj.get("turns", 0)),
            float(obj.get("seconds", 0.0)),
            list(obj.get("policy_versions") or []),
            int(obj.get("stale_masked_tokens", 0)),
            obj.get("messages"),
        )


def _failure(obj: object) -> RolloutFailure | None:
    if obj is None:
        return None
    if not isinstance(obj, dict) or obj.get("category") not in FAILURE_CATEGORIES:
        raise ValueError(f"not a failure: {obj!r:.200}")
    return RolloutFailure(
        obj["category"], str(obj.get("message", "")), dict(obj.get("detail") or {})
    )


@dataclass(frozen=True, slots=True)
class GroupResult:
    """A group as a worker answers it: its rollouts, or why there are none.

    Attributes:
        outcome: ``ok``, ``retried``, ``zeroed``, ``masked``, ``stale`` or ``failed``.
        failure: Why a ``failed`` group has none: ``agent_timeout``, ``infra`` or ``cancelled``.
        worker: The worker that answered ("" when the driver made the result itself).
    """

    group_id: str
    environment: str
    outcome: GroupState
    rollouts: tuple[RolloutRecord, ...] = ()
    failure: RolloutFailure | None = None
    failure_counts: Mapping[str, int] = field(default_factory=dict)
    worker: str = ""
    seconds: float = 0.0
    policy_version: int | None = None
    attempts: int = 1

    @classmethod
    def of(
        cls, group: ScoredGroup, request: GroupRequest, *, worker: str, seconds: float
    ) -> GroupResult:
        """The result of a finished group."""
        return cls(
            request.group_id,
            request.environment,
            group.outcome,
            tuple(RolloutRecord.of(r, messages=request.include_messages) for r in group.rollouts),
            None,
            {str(k): v for k, v in group.failure_counts().items()},
            worker,
            seconds,
            request.policy_version,
        )

    @classmethod
    def failed(
        cls,
        request: GroupRequest,
        failure: RolloutFailure,
        *,
        worker: str = "",
        seconds: float = 0.0,
        attempts: int = 1,
    ) -> GroupResult:
        """A group with no rollouts, and why."""
        return cls(
            request.group_id,
            request.environment,
            "failed",
            (),
            failure,
            {failure.category: request.size},
            worker,
            seconds,
            request.policy_version,
            attempts,
        )

    @property
    def masked(self) -> bool:
        """True if the group has no training data (failed, masked or stale)."""
        return self.outcome in ("failed", "masked", "stale")

    @property
    def rewards(self) -> list[float]:
        """The rollouts' rewards, in order."""
        return [r.reward for r in self.rollouts]

    def to_json(self) -> JSONObject:
        """The result's JSON object (``{"wire": 1, ...}``)."""
        return {
            "wire": WIRE_VERSION,
            "group_id": self.group_id,
            "environment": self.environment,
            "outcome": self.outcome,
            "rollouts": [r.to_json() for r in self.rollouts],
            "failure": self.failure.to_json() if self.failure is not None else None,
            "failure_counts": dict(self.failure_counts),
            "worker": self.worker,
            "seconds": self.seconds,
            "policy_version": self.policy_version,
            "attempts": self.attempts,
        }

    def to_bytes(self) -> bytes:
        """The result as JSON bytes."""
        return orjson.dumps(self.to_json())

    @classmethod
    def from_json(cls, obj: JSON) -> GroupResult:
        """Read a result.

        Raises:
            WorkerError: Not a result of this wire version, or malformed.
        """
        try:
            if not isinstance(obj, dict):
                raise ValueError(f"a group result is a JSON object, got {type(obj).__name__}")
            _check_version(obj, "the worker's result")
            outcome = obj["outcome"]
            if outcome not in _STATES:
                raise ValueError(f"unknown outcome {outcome!r}")
            counts = obj.get("failure_counts") or {}
            if not isinstance(counts, dict):
                raise ValueError(f"'failure_counts' must be an object, got {counts!r:.80}")
            return cls(
                str(obj["group_id"]),
                str(obj["environment"]),
                outcome,
                tuple(RolloutRecord.from_json(r) for r in obj["rollouts"]),
                _failure(obj.get("failure")),
                {str(k): int(v) for k, v in counts.items()},
                str(obj.get("worker", "")),
                float(obj.get("seconds", 0.0)),
                obj.get("policy_version"),
                int(obj.get("attempts", 1)),
            )
        except (KeyError, TypeError, ValueError, RequestError) as exc:
            raise WorkerError(f"malformed group result from a worker: {exc}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> GroupResult:
        """Read a result from JSON bytes (see :meth:`from_json`)."""
        try:
            return cls.from_json(orjson.loads(data))
        except orjson.JSONDecodeError as exc:
            raise WorkerError(f"a worker's result is not JSON: {exc}") from None

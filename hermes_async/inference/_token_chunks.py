"""Token-server chunk decoders, sans I/O: one decoded JSON chunk in, checked tokens out.

One decoder per wire format (vLLM, SGLang, the Atropos reference server). Each checks what a
trainer relies on: integer ids in ``[0, vocab_size)`` (else ``[0, 2**31)``), one finite
logprob ``<= 0`` per id. A violation is a :class:`ChunkError`, never training data.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

from hermes_async.jsontypes import JSON, JSONObject

__all__ = (
    "MAX_LOGPROB",
    "TOKEN_ID_LIMIT",
    "AtroposDecoder",
    "ChunkDecoder",
    "ChunkError",
    "SGLangDecoder",
    "TokenChunk",
    "VLLMDecoder",
    "first_choice",
    "ids_outside",
)

#: Ids must be below this to fit the signed 32-bit arrays of a trajectory (``array("i")``).
TOKEN_ID_LIMIT = 2**31

#: The largest logprob accepted: a log-probability is <= 0; this leaves room for rounding.
MAX_LOGPROB = 1e-6


class TokenChunk(NamedTuple):
    """The new tokens of one chunk (``len(token_ids) == len(logprobs)``, checked)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None


class ChunkError(Exception):
    """A malformed chunk, an error frame (``server_error``) or bad values (``invalid_tokens``)."""

    def __init__(
        self, message: str, *, server_error: bool = False, invalid_tokens: bool = False
    ) -> None:
        super().__init__(message)
        self.server_error = server_error
        self.invalid_tokens = invalid_tokens


def _check_token_values(
    ids: Sequence[int], logprobs: Sequence[float], vocab_size: int | None
) -> None:
    """Raise :class:`ChunkError` (``invalid_tokens``) for a bad id or logprob."""
    limit = _id_limit(vocab_size)
    if _values_ok(ids, logprobs, limit):
        return
    for position, token_id in enumerate(ids):
        if not 0 <= token_id < limit:
            if token_id < 0:
                why = "is negative"
            elif vocab_size is not None and token_id >= vocab_size:
                why = (
                    f"is outside the vocabulary [0, {vocab_size}): the server samples from "
                    "another vocabulary than the tokenizer's (wrong model or tokenizer?)"
                )
            else:
                why = f"does not fit a 32-bit token id (limit {TOKEN_ID_LIMIT})"
            raise ChunkError(
                f"token id {token_id} at position {position} of the chunk {why}",
                invalid_tokens=True,
            )
    for position, logprob in enumerate(logprobs):
        if not (math.isfinite(logprob) and logprob <= MAX_LOGPROB):
            why = "is not finite" if not math.isfinite(logprob) else "is positive"
            raise ChunkError(
                f"logprob {logprob!r} of token {ids[position] if position < len(ids) else '?'} "
                f"at position {position} of the chunk {why}; a log-probability is a finite "
                "number <= 0",
                invalid_tokens=True,
            )


def _id_limit(vocab_size: int | None) -> int:
    """Ids must be below this: the vocabulary's size, and never past 32 bits."""
    return TOKEN_ID_LIMIT if vocab_size is None else min(vocab_size, TOKEN_ID_LIMIT)


def ids_outside(ids: Sequence[int], limit: int) -> bool:
    """Whether an id of ``ids`` is outside ``[0, limit)``: one C-level pass each way."""
    return bool(ids) and not 0 <= min(ids) <= max(ids) < limit


def _values_ok(ids: Sequence[int], logprobs: Sequence[float], limit: int) -> bool:
    """Whether every id is in ``[0, limit)`` and every logprob finite and ``<= MAX_LOGPROB``: one
    C-level pass each. The sum of finite numbers is finite unless it overflows (``False`` then,
    and the caller's loops decide); a NaN or an infinity makes it non-finite."""
    return not ids_outside(ids, limit) and (
        not logprobs or (max(logprobs) <= MAX_LOGPROB and math.isfinite(sum(logprobs)))
    )


def _check_error_frame(payload: JSON) -> None:
    if not isinstance(payload, dict):
        raise ChunkError(f"expected a JSON object, got {type(payload).__name__}")
    error = payload.get("error")
    if error is not None or payload.get("object") == "error":
        detail = error if error is not None else payload.get("message", payload)
        if isinstance(detail, dict):
            detail = detail.get("message", detail)
        raise ChunkError(f"the server reported an error mid-stream: {detail}", server_error=True)


def _int_ids(value: JSON, what: str) -> list[int]:
    if type(value) is list and set(map(type, value)) <= _INT:  # fast path, no bool
        return value
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in value
    ):
        raise ChunkError(f"{what} must be a list of integers")
    return value


_INT = frozenset({int})
_FLOAT = frozenset({float})
_NUMBER = frozenset({int, float})


def _float(value: JSON, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ChunkError(f"{what} must be a number, got {value!r}")
    return float(value)


def _check_lengths(ids: Sequence[int], logprobs: Sequence[float]) -> None:
    if len(ids) != len(logprobs):
        raise ChunkError(
            f"chunk has {len(ids)} token ids but {len(logprobs)} logprobs; every sampled "
            "token needs its logprob (request logprobs from the server)"
        )


def _finish_reason(value: JSON) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):  # SGLang: {"type": "stop", "matched": 151645}
        value = value.get("type")
    if not isinstance(value, str):
        raise ChunkError(f"finish_reason must be a string or null, got {value!r}")
    return value


class ChunkDecoder(ABC):
    """One stream's decoder; ``vocab_size`` (when known) bounds the ids it accepts."""

    def __init__(self, *, vocab_size: int | None = None) -> None:
        self.vocab_size = vocab_size

    @abstractmethod
    def feed(self, payload: JSON) -> TokenChunk | None:
        """Decode one chunk; ``None`` for chunks without tokens or finish (usage, keep-alive)."""

    def _checked(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        _check_lengths(ids, logprobs)
        _check_token_values(ids, logprobs, self.vocab_size)


def first_choice(payload: JSON) -> JSONObject | None:
    """``choices[0]`` of an OpenAI-style chunk; ``None`` for the usage chunk.

    Raises:
        ChunkError: An error frame, or ``choices`` that is not a list of objects.
    """
    _check_error_frame(payload)
    choices = payload.get("choices")
    if not choices:
        return None
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise ChunkError("choices must be a list of objects")
    return choices[0]


class VLLMDecoder(ChunkDecoder):
    def feed(self, payload: JSON) -> TokenChunk | None:
        # The chunk vLLM sends, checked inline (a dozen calls less per chunk); any other shape
        # or value takes the general path, which accepts the same and names each fault.
        if type(payload) is dict and payload.get("error") is None:
            choices = payload.get("choices")
            if type(choices) is list and choices and type(choice := choices[0]) is dict:
                ids = choice.get("token_ids")
                logprobs = choice.get("logprobs")
                content = logprobs.get("content") if type(logprobs) is dict else None
                finish = choice.get("finish_reason")
                if (
                    type(ids) is list
                    and ids
                    and type(content) is list
                    and len(content) == len(ids)
                    and (finish is None or type(finish) is str)
                    and payload.get("object") != "error"
                ):
                    try:  # entries that are not objects with both keys: the general path
                        values = [entry["logprob"] for entry in content]
                        marks = [entry["token_id"] for entry in content]
                    except (TypeError, KeyError):
                        return self._feed_checked(payload)
                    if (
                        marks == ids
                        and set(map(type, ids)) == _INT
                        and set(map(type, values)) == _FLOAT
                        and _values_ok(ids, values, _id_limit(self.vocab_size))
                    ):
                        return TokenChunk(tuple(ids), tuple(values), finish)
        return self._feed_checked(payload)

    def _feed_checked(self, payload: JSON) -> TokenChunk | None:
        choice = first_choice(payload)
        if choice is None:  # the usage chunk
            return None
        ids = _int_ids(choice.get("token_ids", []), "choices[0].token_ids")
        logprobs_field = choice.get("logprobs") or {}  # null or empty: no logprobs
        if not isinstance(logprobs_field, dict):
            raise ChunkError("choices[0].logprobs must be an object or null")
        content = logprobs_field.get("content")
        if content is None:
            content = []
        if not isinstance(content, list):
            raise ChunkError("choices[0].logprobs.content must be a list")
        logprobs = _vllm_logprobs(content, ids)
        if logprobs is None:
            logprobs = _vllm_logprobs_checked(content, ids)
        self._checked(ids, logprobs)
        finish = _finish_reason(choice.get("finish_reason"))
        if not ids and finish is None:
            return None
        return TokenChunk(tuple(ids), tuple(logprobs), finish)


def _vllm_logprobs(content: list[JSON], ids: list[int]) -> list[float] | None:
    """The logprobs of well-formed entries whose ids match ``ids``; ``None`` for anything
    else (then :func:`_vllm_logprobs_checked` names the fault, or accepts what this did not)."""
    try:
        logprobs = [entry["logprob"] for entry in content]
        marks = [entry.get("token_id") for entry in content]
    except (TypeError, KeyError, AttributeError):
        return None
    # Entries may leave token_id out (all None); a mark of any kind may be unhashable.
    if marks != ids and (not marks or any(mark is not None for mark in marks)):
        return None
    types = set(map(type, logprobs))
    if types == _FLOAT:
        return logprobs
    if types <= _NUMBER:
        return list(map(float, logprobs))
    return None


def _vllm_logprobs_checked(content: list[JSON], ids: list[int]) -> list[float]:
    logprobs: list[float] = []
    for i, entry in enumerate(content):
        if not isinstance(entry, dict):
            raise ChunkError("logprobs.content entries must be objects")
        logprobs.append(_float(entry.get("logprob"), "logprobs.content[].logprob"))
        token_id = entry.get("token_id")
        if token_id is not None and i < len(ids) and token_id != ids[i]:
            raise ChunkError(
                f"logprob entry {i} is for token {token_id} but the chunk's id there is {ids[i]}"
            )
    return logprobs


class SGLangDecoder(ChunkDecoder):
    def __init__(self, *, incremental: bool, vocab_size: int | None = None) -> None:
        super().__init__(vocab_size=vocab_size)
        self._incremental = incremental
        self._seen: list[int] = []

    def feed(self, payload: JSON) -> TokenChunk | None:
        _check_error_frame(payload)
        ids = _int_ids(payload.get("output_ids"), "output_ids")
        meta = payload.get("meta_info")
        if not isinstance(meta, dict):
            raise ChunkError("meta_info must be an object")
        raw = meta.get("output_token_logprobs")
        if raw is None:
            raise ChunkError(
                "meta_info.output_token_logprobs is missing (request return_logprob=true)"
            )
        if not isinstance(raw, list):
            raise ChunkError("meta_info.output_token_logprobs must be a list")
        logprobs: list[float] = []
        for i, entry in enumerate(raw):
            if not isinstance(entry, list) or len(entry) < 2:
                raise ChunkError("output_token_logprobs entries must be [logprob, token_id, ...]")
            logprobs.append(_float(entry[0], "output_token_logprobs[][0]"))
            if i < len(ids) and entry[1] != ids[i]:
                raise ChunkError(
                    f"logprob entry {i} is for token {entry[1]} but output_ids has {ids[i]} there"
                )
        _check_lengths(ids, logprobs)
        finish = _finish_reason(meta.get("finish_reason"))
        if not self._incremental:
            seen = len(self._seen)
            if len(ids) < seen or ids[:seen] != self._seen:
                raise ChunkError(
                    f"cumulative chunk does not extend the {seen} ids seen so far; if the "
                    "server runs with --incremental-streaming-output, use "
                    "SGLangGenerateClient(..., incremental=True)"
                )
            ids, logprobs = ids[seen:], logprobs[seen:]
        # Only the new ids: a cumulative chunk repeats the ones already checked.
        _check_token_values(ids, logprobs, self.vocab_size)
        if not self._incremental:
            self._seen.extend(ids)
        if not ids and finish is None:
            return None
        return TokenChunk(tuple(ids), tuple(logprobs), finish)


class AtroposDecoder(ChunkDecoder):
    def feed(self, payload: JSON) -> TokenChunk | None:
        _check_error_frame(payload)
        try:
            ids_all = payload["token_ids"]
            lps_all = payload["logprobs"]
            reasons = payload["finish_reasons"]
        except KeyError as exc:
            raise ChunkError(f"response lacks {exc.args[0]!r}") from None
        if not (isinstance(ids_all, list) and ids_all and isinstance(lps_all, list) and lps_all):
            raise ChunkError("token_ids and logprobs must be non-empty lists (one per choice)")
        ids = _int_ids(ids_all[0], "token_ids[0]")
        entries = lps_all[0]
        if not isinstance(entries, list):
            raise ChunkError("logprobs[0] must be a list")
        logprobs: list[float] = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ChunkError('logprobs entries must be one-key objects {"<token id>": lp}')
            ((key, value),) = entry.items()
            if i < len(ids) and key != str(ids[i]):
                raise ChunkError(
                    f"logprob entry {i} is for token {key} but token_ids has {ids[i]} there"
                )
            logprobs.append(_float(value, "logprob"))
        self._checked(ids, logprobs)
        finish = _finish_reason(reasons[0] if isinstance(reasons, list) and reasons else None)
        return TokenChunk(tuple(ids), tuple(logprobs), finish or "stop")

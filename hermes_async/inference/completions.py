"""Exact tokens from a stock vLLM: the OpenAI completions route with token-id prompts.

:class:`VLLMCompletionsClient` speaks ``POST /v1/completions`` behind the ``TokenClient``
interface, so Phase 2 works against the server most users already run. Ids and logprobs of
every chunk are checked. :func:`detect_token_endpoint` picks the route. Wire format and
version notes: docs/architecture.md, "Exact tokens from a stock vLLM".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Unpack

import httpx

from hermes_async.inference._errors import ServerStatusError
from hermes_async.inference._http import (
    ConnectionKwargs,
    HTTPOptions,
    ServerConnection,
)
from hermes_async.inference._token_chunks import (
    ChunkDecoder,
    ChunkError,
    TokenChunk,
    _finish_reason,
    _float,
    _int_ids,
    first_choice,
)
from hermes_async.inference.generate import GenerateClient, SamplingParams
from hermes_async.jsontypes import JSON, JSONObject

__all__ = ("CompletionsDecoder", "VLLMCompletionsClient", "detect_token_endpoint")

#: vLLM's scale-out token route and the OpenAI completions route.
_GENERATE_PATH = "/inference/v1/generate"
_COMPLETIONS_PATH = "/v1/completions"
_TOKEN_ID_PREFIX = "token_id:"
#: Statuses that mean "no generate route here": disabled (403), unknown (404), GET-only (405).
_ABSENT_STATUSES = frozenset({403, 404, 405})


class CompletionsDecoder(ChunkDecoder):
    """Decode one completions-route chunk into checked ids and logprobs (sans I/O)."""

    def feed(self, payload: JSON) -> TokenChunk | None:
        """Decode one chunk; ``None`` for a chunk without tokens or finish (usage)."""
        choice = first_choice(payload)
        if choice is None:  # the usage chunk
            return None
        logprobs_obj = choice.get("logprobs") or {}
        if not isinstance(logprobs_obj, dict):
            raise ChunkError("choices[0].logprobs must be an object")
        raw_lps = logprobs_obj.get("token_logprobs") or []
        tokens = logprobs_obj.get("tokens") or []
        if not isinstance(raw_lps, list) or not isinstance(tokens, list):
            raise ChunkError("logprobs.token_logprobs and logprobs.tokens must be lists")
        logprobs = [_float(lp, "logprobs.token_logprobs[]") for lp in raw_lps]
        named = [_token_id(t) for t in tokens]
        if "token_ids" in choice and choice["token_ids"] is not None:
            ids = _int_ids(choice["token_ids"], "choices[0].token_ids")
            for i, (a, b) in enumerate(zip(ids, named, strict=False)):
                if b is not None and a != b:
                    raise ChunkError(
                        f"logprob entry {i} is for token {b} but the chunk's id there is {a}"
                    )
        elif named and all(n is not None for n in named):
            ids = [n for n in named if n is not None]
        elif raw_lps or choice.get("text"):
            raise ChunkError(
                "the completions chunk carries no token ids; the server must support "
                "return_token_ids (vLLM >= 0.10.2) or return_tokens_as_token_ids (vLLM >= 0.6)"
            )
        else:
            ids = []
        self._checked(ids, logprobs)
        finish = _finish_reason(choice.get("finish_reason"))
        if not ids and finish is None:
            return None
        return TokenChunk(tuple(ids), tuple(logprobs), finish)


def _token_id(token: JSON) -> int | None:
    if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX):
        try:
            return int(token[len(_TOKEN_ID_PREFIX) :])
        except ValueError:
            return None
    return None


class VLLMCompletionsClient(GenerateClient):
    """A stock vLLM's ``POST /v1/completions`` as a token client.

    Args:
        base_url: The server's URL; a trailing ``/v1`` is stripped.
        model: The served model name; ``None`` omits it (vLLM uses its only model).
        **connection: As for :class:`~hermes_async.inference.generate.GenerateClient`.
    """

    path = _COMPLETIONS_PATH
    extras_kind = "completions"

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        vocab_size: int | None = None,
        **connection: Unpack[ConnectionKwargs],
    ) -> None:
        super().__init__(base_url, vocab_size=vocab_size, **connection)
        self.model = model

    def _base_url(self, base_url: str) -> str:
        return base_url.rstrip("/").removesuffix("/v1")

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> JSONObject:
        body: JSONObject = {
            "prompt": list(prompt_ids),
            "max_tokens": params.max_tokens,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            # The text is not used; special tokens in it would only cost detokenization.
            "skip_special_tokens": False,
            "add_special_tokens": False,
            "stream": True,
        }
        if self.model is not None:
            body["model"] = self.model
        return self._flat_tail(body, params)

    def _decoder(self) -> ChunkDecoder:
        return CompletionsDecoder(vocab_size=self.vocab_size)


async def detect_token_endpoint(
    base_url: str,
    *,
    timeout: float = 10.0,
    transport: httpx.AsyncBaseTransport | None = None,
    api_key: str | None = None,
) -> Literal["vllm", "completions"]:
    """Which token route a vLLM server offers: ``"vllm"`` (generate) or ``"completions"``.

    One empty-body ``POST /inference/v1/generate``: 400/422 means the route exists; 403, 404
    or 405 mean it does not.

    Raises:
        ModelServerError: Unreachable, or another answer (401: a wrong key; 5xx).

    **Cancellation**: the probe's connection is closed; nothing else is held.
    """
    options = HTTPOptions.for_probe(timeout)
    root = base_url.rstrip("/").removesuffix("/v1")
    async with ServerConnection(
        root, options=options, transport=transport, api_key=api_key
    ) as connection:
        try:
            await connection.post_json(_GENERATE_PATH, {})
        except ServerStatusError as exc:
            if exc.status in _ABSENT_STATUSES:
                return "completions"
            if exc.status in (400, 422):
                return "vllm"
            raise
    return "vllm"

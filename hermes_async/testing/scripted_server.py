"""A scripted model server: one ASGI app speaking every protocol the clients speak.

:class:`ScriptedModelServer` answers from a :class:`ScriptedPolicy` (conversation in, assistant
text out) on the vLLM, completions, Atropos, SGLang and chat routes. Everything random derives
from the seed, every response is recorded in :attr:`ScriptedModelServer.requests`, and faults,
pauses and aborts are injected per request.
Routes and rules: docs/decisions/061-scripted-model-server.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast, runtime_checkable

import anyio

from hermes_async._checks import NON_NEGATIVE_FINITE, check_value
from hermes_async._json import exceeds_depth
from hermes_async.inference.tokenizer import Tokenizer, load_tokenizer
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.testing.http import answer_lifespan

__all__ = (
    "Fault",
    "FixedScript",
    "PolicyRequest",
    "ScriptExhaustedError",
    "ScriptedModelServer",
    "ScriptedPolicy",
    "ServedRequest",
    "hermes_tool_call",
    "parse_chatml",
)

_Route = Literal["vllm", "atropos", "sglang", "chat", "completions"]

_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PolicyRequest:
    """What a policy sees for one request.

    On token routes ``messages`` are recovered from the prompt and ``tools`` is empty (the
    schemas are in the system message's text). ``protocol`` is ``"vllm"``, ``"atropos"``,
    ``"sglang"`` or ``"chat"``.
    """

    messages: tuple[JSONObject, ...]
    prompt_text: str
    tools: tuple[JSONObject, ...]
    request_number: int
    protocol: str

    @property
    def last_user_text(self) -> str:
        """Content of the last ``user`` message ('' if none)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return str(message.get("content") or "")
        return ""

    @property
    def tool_results(self) -> tuple[str, ...]:
        """Contents of the ``tool`` messages after the last ``user`` message, in order."""
        start = 0
        for index, message in enumerate(self.messages):
            if message.get("role") == "user":
                start = index + 1
        return tuple(
            str(m.get("content") or "") for m in self.messages[start:] if m.get("role") == "tool"
        )


@runtime_checkable
class ScriptedPolicy(Protocol):
    """The model being simulated: the conversation in, the next assistant text out."""

    def __call__(self, request: PolicyRequest) -> str:
        """Return the assistant's next message text (may contain ``<tool_call>`` blocks)."""
        ...


def hermes_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A ``<tool_call>`` block in the hermes format, for a policy's reply.

    The chat route turns it into a structured ``tool_calls`` entry; token routes send it as is.
    """
    call = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


class ScriptExhaustedError(RuntimeError):
    """A :class:`FixedScript` was asked for more replies than it holds."""


class FixedScript:
    """Reply with the given texts in order; ``repeat`` starts over instead of failing."""

    def __init__(self, texts: Sequence[str], *, repeat: bool = False) -> None:
        if not texts:
            raise ValueError("FixedScript needs at least one text")
        self.texts = list(texts)
        self.repeat = repeat
        self.position = 0

    def __call__(self, request: PolicyRequest) -> str:
        if self.position >= len(self.texts):
            if not self.repeat:
                raise ScriptExhaustedError(
                    f"FixedScript exhausted: all {len(self.texts)} replies were used "
                    f"(request {request.request_number}); add texts or pass repeat=True"
                )
            self.position = 0
        text = self.texts[self.position]
        self.position += 1
        return text


FaultKind = Literal["status", "rate_limit", "disconnect", "malformed", "stall", "abort"]


@dataclass(frozen=True, slots=True)
class Fault:
    """A misbehaviour to inject into one request. Build with the class methods.

    ``after_tokens`` counts completion tokens (chat: chunks) sent before the fault; ``abort``
    cuts exactly there, also inside a chunk. A ``stall_seconds`` of ``inf`` lasts until the
    client disconnects.
    """

    kind: FaultKind
    status: int = 500
    retry_after: float | None = None
    after_tokens: int = 0
    stall_seconds: float = math.inf
    message: str | None = None

    @classmethod
    def http_error(cls, status: int = 500, message: str | None = None) -> Fault:
        """Answer with this HTTP status and a JSON error body (``message`` in it)."""
        return cls("status", status=status, message=message)

    @classmethod
    def rate_limited(cls, retry_after: float = 0.05) -> Fault:
        """Answer 429 with ``Retry-After: retry_after``."""
        return cls("rate_limit", status=429, retry_after=retry_after)

    @classmethod
    def disconnect(cls, after_tokens: int = 1) -> Fault:
        """Cut the connection after ``after_tokens`` tokens, mid-body."""
        return cls("disconnect", after_tokens=after_tokens)

    @classmethod
    def malformed(cls, after_tokens: int = 1) -> Fault:
        """Send a chunk that is not valid JSON after ``after_tokens`` tokens."""
        return cls("malformed", after_tokens=after_tokens)

    @classmethod
    def stall(cls, after_tokens: int = 1, seconds: float = math.inf) -> Fault:
        """Stop sending after ``after_tokens`` tokens for ``seconds``."""
        return cls("stall", after_tokens=after_tokens, stall_seconds=seconds)

    @classmethod
    def abort(cls, after_tokens: int = 1) -> Fault:
        """End a token stream after ``after_tokens`` tokens with ``finish_reason`` "abort"."""
        return cls("abort", after_tokens=after_tokens)


#: The line a ``malformed`` fault sends.
MALFORMED_LINE = 'data: {"choices": [{"token_ids": [1, 2'


@dataclass(slots=True)
class ServedRequest:
    """The record of one generation request, filled in while it is served.

    Attributes:
        completion_ids: Every completion id the server sent (chat: the encoded text).
        fault_at_token: Ids (chat: deltas) sent when a mid-stream fault fired.
        continued: For the continuation of an aborted request, how many planned ids its
            prompt's prefix held; ``None`` for a fresh request.
        disconnected: Set when the client went away mid-response.
    """

    number: int
    protocol: str
    body: JSONObject
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    chunks: list[list[int]] = field(default_factory=list)
    finish_reason: str = ""
    text: str = ""
    fault: Fault | None = None
    fault_at_token: int | None = None
    continued: int | None = None
    disconnected: anyio.Event = field(default_factory=anyio.Event)
    completed: anyio.Event = field(default_factory=anyio.Event)


PauseMode = Literal["keep", "abort", "cut"]


@dataclass(slots=True)
class _Plan:
    """An aborted generation's whole planned completion, before any ``max_tokens`` cut."""

    base: list[int]
    seed: object
    ids: list[int]
    logprobs: list[float]
    text: str


class _SimulatedDisconnect(Exception):
    """Raised inside the app to make the server cut the connection mid-body."""


class _ClientGone(Exception):
    pass


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@functools.cache
def _default_tokenizer() -> Tokenizer:
    return load_tokenizer()


#: Where each token protocol's request body keeps what the server reads: the prompt ids' key,
#: the nested sampling object's key (``None``: the body itself), the max-tokens key and its
#: server default, and the seed's key. The stop ids are ``stop_token_ids`` in all of them.
_TOKEN_BODY_FIELDS: dict[str, tuple[str, str | None, str, int, str]] = {
    "vllm": ("token_ids", "sampling_params", "max_tokens", 256, "seed"),
    "completions": ("prompt", None, "max_tokens", 16, "seed"),
    "sglang": ("input_ids", "sampling_params", "max_new_tokens", 128, "sampling_seed"),
}
_CHATML_TURN = re.compile(r"<\|im_start\|>([^\n]*)\n(.*?)(?:<\|im_end\|>\n?|\Z)", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_THINK = re.compile(r"^\s*<think>\n?(.*?)\n?</think>\s*", re.S)


def parse_chatml(text: str) -> list[JSONObject]:
    """Split ChatML prompt text back into messages (the inverse of the built-in template).

    ``<tool_response>`` blocks become ``tool`` messages; the generation prompt is dropped.
    """
    messages: list[JSONObject] = []
    for match in _CHATML_TURN.finditer(text):
        role, content = match.group(1).strip(), match.group(2)
        if role == "user":
            responses = _TOOL_RESPONSE.findall(content)
            if responses and not _TOOL_RESPONSE.sub("", content).strip():
                messages.extend({"role": "tool", "content": r} for r in responses)
                continue
        messages.append({"role": role, "content": content})
    if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
        messages.pop()
    return messages


class ScriptedModelServer:
    """An ASGI app simulating a model server from a policy.

    Args:
        tokenizer: Default: the built-in offline Qwen one (~0.4 s to load, blocking: build
            servers at setup time).
        max_chunk_tokens: Chunks carry 1..this many tokens (chat: characters x 4).
        faults: Request number (1-based) -> :class:`Fault`; tests may add entries between
            requests.
        fault_plan: Called with the number and body of each request ``faults`` has no entry
            for; returns its :class:`Fault` or ``None``.
        rng_key: ``"request"`` seeds per request number; ``"prompt"`` per prompt text, so
            concurrent rollouts get the same numbers in any arrival order.
        scale_out: ``False`` answers ``/inference/v1/generate`` 403, like a stock vLLM.
        seconds_per_token: Simulated sampling time per token.
        capacity_tokens_per_second: Total sampling throughput shared by every stream;
            ``None``: unlimited.
        keep_requests: Keep each request's record in :attr:`requests` (tests read them).
            ``False`` for a server that runs long (a benchmark's): a record holds the request's
            body and ids, so keeping them all grows without bound.

    :meth:`pause` modes: ``"keep"`` holds streams at the next chunk, ``"abort"`` ends token
    streams with ``finish_reason`` "abort", ``"cut"`` drops their connections. A request that
    continues an aborted one is served the rest of that planned completion.
    """

    def __init__(
        self,
        policy: ScriptedPolicy | Callable[[PolicyRequest], str],
        *,
        tokenizer: Tokenizer | None = None,
        seed: int = 0,
        max_chunk_tokens: int = 8,
        chunk_delay_seconds: float = 0.0,
        response_delay_seconds: float = 0.0,
        faults: Mapping[int, Fault] | None = None,
        fault_plan: Callable[[int, JSONObject], Fault | None] | None = None,
        sglang_incremental: bool = False,
        model_name: str = "scripted",
        rng_key: Literal["request", "prompt"] = "request",
        scale_out: bool = True,
        seconds_per_token: float = 0.0,
        capacity_tokens_per_second: float | None = None,
        keep_requests: bool = True,
    ) -> None:
        if max_chunk_tokens < 1:
            raise ValueError(f"max_chunk_tokens must be >= 1, got {max_chunk_tokens!r}")
        if not callable(policy):
            raise TypeError(
                "policy must be a callable (PolicyRequest) -> str or a ScriptedPolicy, got "
                f"{type(policy).__name__}"
            )
        for name, delay in (
            ("chunk_delay_seconds", chunk_delay_seconds),
            ("response_delay_seconds", response_delay_seconds),
        ):  # a negative or NaN delay was taken as none; infinity would never answer
            check_value(f"ScriptedModelServer {name}", delay, NON_NEGATIVE_FINITE, error=ValueError)
        self.policy = policy
        self.tokenizer = tokenizer if tokenizer is not None else _default_tokenizer()
        self.seed = seed
        self.max_chunk_tokens = max_chunk_tokens
        self.chunk_delay_seconds = chunk_delay_seconds
        self.response_delay_seconds = response_delay_seconds
        self.faults: dict[int, Fault] = dict(faults or {})
        self.fault_plan = fault_plan
        self.sglang_incremental = sglang_incremental
        self.model_name = model_name
        if rng_key not in ("request", "prompt"):
            raise ValueError(f"rng_key must be 'request' or 'prompt', got {rng_key!r}")
        self.rng_key = rng_key
        self.scale_out = scale_out
        if not seconds_per_token >= 0:
            raise ValueError(f"seconds_per_token must be >= 0, got {seconds_per_token!r}")
        self.seconds_per_token = seconds_per_token
        if capacity_tokens_per_second is not None and not capacity_tokens_per_second > 0:
            raise ValueError(
                f"capacity_tokens_per_second must be > 0 or None, got {capacity_tokens_per_second!r}"
            )
        self.capacity_tokens_per_second = capacity_tokens_per_second
        self._capacity_free_at = -math.inf
        self.requests: list[ServedRequest] = []
        self.keep_requests = keep_requests
        self._served = 0  # requests so far (their numbers), kept or not
        #: How many streams ended with ``finish_reason`` "abort" (faults, pauses, aborts).
        self.aborted = 0
        self._paused: PauseMode | None = None
        self._resumed: anyio.Event | None = None
        self._wake: anyio.Event | None = None
        self._abort_epoch = 0
        self._cut_epoch = 0
        self._plans: list[_Plan] = []

    # ---------------------------------------------------------------- pause / resume / abort

    @property
    def is_paused(self) -> bool:
        """Whether the server is paused (what ``GET /is_paused`` reports)."""
        return self._paused is not None

    def pause(self, mode: PauseMode = "abort") -> None:
        """Pause generation in ``mode`` (see the class docstring)."""
        if mode not in ("keep", "abort", "cut"):
            raise ValueError(f"pause mode must be 'keep', 'abort' or 'cut', got {mode!r}")
        self._paused = mode
        if mode == "abort":
            self.abort_inflight()
        elif mode == "cut":
            self._cut_epoch += 1
            self._wake_all()

    def resume(self) -> None:
        """Resume generation: held requests and streams go on."""
        self._paused = None
        if self._resumed is not None:
            self._resumed.set()
            self._resumed = None

    def abort_inflight(self) -> None:
        """End every in-flight token stream now with ``finish_reason`` "abort"."""
        self._abort_epoch += 1
        self._wake_all()

    def _wake_all(self) -> None:
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    async def _wait_resumed(self) -> None:
        while self._paused is not None:
            if self._resumed is None:
                self._resumed = anyio.Event()
            await self._resumed.wait()

    async def _nap(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when an abort or a cut wakes the streams."""
        if seconds <= 0:
            return
        if self._wake is None:
            self._wake = anyio.Event()
        with anyio.move_on_after(seconds):
            await self._wake.wait()

    def _continuation(self, prompt_ids: list[int], seed: object) -> tuple[_Plan | None, int]:
        """The aborted plan ``prompt_ids`` continues, and how many of its ids it holds."""
        for index, plan in enumerate(self._plans):
            n = len(plan.base)
            if plan.seed != seed or len(prompt_ids) < n or prompt_ids[:n] != plan.base:
                continue
            done = len(prompt_ids) - n
            if done <= len(plan.ids) and prompt_ids[n:] == plan.ids[:done]:
                del self._plans[index]
                return plan, done
        return None, 0

    # ---------------------------------------------------------------- ASGI entry point

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        """ASGI entry point.

        **Cancellation**: a cancelled request (the server shutting down) stops mid-response;
        its :class:`ServedRequest` keeps what was sent, ``completed`` stays unset.
        """
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"].rstrip("/")
        if method == "GET" and path in ("/health", "/v1/health"):
            await _send_json(send, 200, {"status": "ok"})
            return
        if method == "GET" and path == "/v1/models":
            await _send_json(
                send, 200, {"object": "list", "data": [{"id": self.model_name, "object": "model"}]}
            )
            return
        if await self._control(method, path, scope, send):
            return
        routes = {
            "/inference/v1/generate",
            "/generate",
            "/v1/chat/completions",
            "/chat/completions",
            "/v1/completions",
        }
        if path not in routes:
            await _send_json(send, 404, {"error": {"message": f"no route {method} {path}"}})
            return
        if method != "POST":
            await _send_json(send, 405, {"error": {"message": f"{method} not allowed on {path}"}})
            return
        if path == "/inference/v1/generate" and not self.scale_out:
            message = "Scale-out endpoints are disabled (scripted server with scale_out=False)"
            await _send_json(send, 403, {"error": {"message": message, "code": 403}})
            return
        try:
            raw = await _read_body(receive)
        except _ClientGone:
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
        except ValueError as exc:
            await _send_json(send, 400, {"error": {"message": f"invalid JSON body: {exc}"}})
            return
        if path == "/inference/v1/generate":
            protocol: _Route = "vllm"
        elif path == "/generate":
            protocol = "sglang" if "input_ids" in body else "atropos"
        elif path == "/v1/completions":
            protocol = "completions"
        else:
            protocol = "chat"
        self._served += 1
        record = ServedRequest(number=self._served, protocol=protocol, body=body)
        record.fault = self.faults.get(record.number)
        if record.fault is None and self.fault_plan is not None:
            record.fault = self.fault_plan(record.number, body)
        if self.keep_requests:
            self.requests.append(record)
        await self._serve(record, receive, send)

    async def _control(self, method: str, path: str, scope: _Scope, send: _Send) -> bool:
        """The pause / resume / is_paused routes; ``True`` if ``path`` was one."""
        if method == "GET" and path == "/is_paused":
            await _send_json(send, 200, {"is_paused": self.is_paused})
            return True
        if method == "POST" and path == "/resume":
            self.resume()
            await _send_json(send, 200, {"status": "resumed"})
            return True
        if method == "POST" and path == "/pause":
            query = dict(
                part.split("=", 1)
                for part in scope.get("query_string", b"").decode().split("&")
                if "=" in part
            )
            mode = query.get("mode", "abort")
            if mode not in ("keep", "abort", "cut"):
                await _send_json(send, 400, {"error": {"message": f"unknown mode {mode!r}"}})
                return True
            self.pause(cast("PauseMode", mode))
            await _send_json(send, 200, {"status": "paused", "mode": mode})
            return True
        return False

    async def _serve(self, record: ServedRequest, receive: _Receive, send: _Send) -> None:
        """Serve one generation request, watching for the client going away."""
        fault = record.fault
        async with anyio.create_task_group() as tg:

            async def watch_disconnect() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        record.disconnected.set()
                        tg.cancel_scope.cancel(reason="client disconnected")
                        return

            async def guarded_send(message: MutableMapping[str, Any]) -> None:
                try:
                    await send(message)
                except OSError:
                    record.disconnected.set()
                    tg.cancel_scope.cancel(reason="client disconnected")
                    raise _ClientGone from None

            tg.start_soon(watch_disconnect)
            try:
                await self._wait_resumed()  # a paused server holds new requests
                if self.response_delay_seconds:
                    await anyio.sleep(self.response_delay_seconds)
                if fault is not None and fault.kind == "status":
                    await _send_json(
                        guarded_send,
                        fault.status,
                        {
                            "error": {
                                "message": fault.message or f"injected HTTP {fault.status}",
                                "code": fault.status,
                            }
                        },
                    )
                elif fault is not None and fault.kind == "rate_limit":
                    headers = [(b"retry-after", f"{fault.retry_after:g}".encode())]
                    await _send_json(
                        guarded_send,
                        429,
                        {"error": {"message": "injected rate limit", "code": 429}},
                        headers,
                    )
                else:
                    try:
                        await self._respond(record, guarded_send)
                    except _BadRequest as exc:
                        await _send_json(guarded_send, exc.status, {"error": {"message": str(exc)}})
                    except ScriptExhaustedError as exc:
                        await _send_json(guarded_send, 500, {"error": {"message": str(exc)}})
                record.completed.set()
            except _ClientGone:
                pass
            tg.cancel_scope.cancel(reason="response sent")

    async def _respond(self, record: ServedRequest, send: _Send) -> None:
        body = record.body
        if record.protocol == "chat":
            await self._respond_chat(record, send)
            return
        stop_ids: object = None
        seed: object = body.get("seed")
        fields = _TOKEN_BODY_FIELDS.get(record.protocol)
        if fields is not None:
            ids_key, sampling_key, max_key, max_default, seed_key = fields
            prompt_ids = body.get(ids_key)
            sampling = (body.get(sampling_key) or {}) if sampling_key else body
            max_tokens = sampling.get(max_key, max_default)
            stop_ids = sampling.get("stop_token_ids")
            seed = sampling.get(seed_key)
        else:
            prompt = body.get("prompt") or {}
            prompt_ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
            max_tokens = body.get("max_tokens", 16)
        if not isinstance(prompt_ids, list) or not all(isinstance(i, int) for i in prompt_ids):
            raise _BadRequest(400, "prompt token ids missing or not a list of integers")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise _BadRequest(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
        record.prompt_ids = list(prompt_ids)
        prompt_text = self.tokenizer.decode(prompt_ids)
        rng = self._rng(record, prompt_text)
        plan, done = self._continuation(record.prompt_ids, seed)
        if plan is not None:
            # The rest of an aborted generation, exactly as planned (the policy is not asked).
            record.continued = done
            record.text = plan.text
            rest, rest_logprobs = plan.ids[done:], plan.logprobs[done:]
            ids, finish = rest[:max_tokens], "length" if len(rest) > max_tokens else "stop"
            logprobs = rest_logprobs[:max_tokens]
            chunks = list(_chunk_sizes(len(ids), self.max_chunk_tokens, rng))
        else:
            text = self.policy(
                PolicyRequest(
                    messages=tuple(parse_chatml(prompt_text)),
                    prompt_text=prompt_text,
                    tools=(),
                    request_number=record.number,
                    protocol=record.protocol,
                )
            )
            record.text = text
            planned = _stop_at(self.tokenizer.encode(text, allow_special=True), stop_ids)
            if planned is None:
                planned = [
                    *self.tokenizer.encode(text, allow_special=True),
                    self.tokenizer.eos_token_id,
                ]
            ids, finish = planned, "stop"
            if len(ids) > max_tokens:
                ids, finish = ids[:max_tokens], "length"
            logprobs = [round(-rng.expovariate(2.0), 6) for _ in ids]
            chunks = list(_chunk_sizes(len(ids), self.max_chunk_tokens, rng))
            # Logprobs of the planned ids past the cut, drawn after everything else (what a
            # continuation with too large a budget would get; never changes a normal reply).
            beyond = [round(-rng.expovariate(2.0), 6) for _ in planned[len(ids) :]]
            plan = _Plan(list(prompt_ids), seed, planned, [*logprobs, *beyond], text)
        if record.protocol == "atropos":
            await self._respond_atropos(record, send, ids, logprobs, finish, prompt_text)
        elif record.protocol == "vllm" and not body.get("stream"):
            await self._respond_vllm_json(record, send, ids, logprobs, finish, plan)
        else:
            await self._respond_sse_tokens(record, send, ids, logprobs, finish, chunks, plan, done)

    async def _respond_sse_tokens(
        self,
        record: ServedRequest,
        send: _Send,
        ids: list[int],
        logprobs: list[float],
        finish: str,
        chunk_sizes: list[int],
        plan: _Plan,
        done: int,
    ) -> None:
        fault = record.fault
        abort_at: int | None = None
        if fault is not None and fault.kind == "abort":
            # A finished stream cannot be aborted: a position at or past its end is no abort.
            abort_at = fault.after_tokens if fault.after_tokens < len(ids) else None
            fault = None
        abort_epoch, cut_epoch = self._abort_epoch, self._cut_epoch
        await _start_sse(send)
        position = 0
        sizes = list(chunk_sizes)
        if not sizes:  # a continuation with nothing left: just the finish
            await self._send_token_chunk(record, send, ids, logprobs, 0, 0, finish)
        while sizes:
            size = sizes.pop(0)
            if fault is not None and position >= fault.after_tokens:
                await self._apply_stream_fault(record, fault, send, position)
                fault = None
            await self._nap(size * self.seconds_per_token)
            if self.capacity_tokens_per_second is not None:
                # The shared budget: this chunk's tokens are sampled after everyone's before.
                now = anyio.current_time()
                ready = max(now, self._capacity_free_at) + size / self.capacity_tokens_per_second
                self._capacity_free_at = ready
                await self._nap(ready - now)
            while self._paused == "keep":
                await self._wait_resumed()
            if self._cut_epoch != cut_epoch:
                record.fault_at_token = position
                if plan not in self._plans:  # continuable, like an abort
                    self._plans.append(plan)
                raise _SimulatedDisconnect("server paused (cut)")
            aborted = self._abort_epoch != abort_epoch
            if abort_at is not None and position + size > abort_at:
                size, aborted = abort_at - position, True
            if aborted:
                await self._send_token_chunk(record, send, ids, logprobs, position, size, "abort")
                position += size
                self.aborted += 1
                record.fault_at_token = position
                if plan not in self._plans:
                    self._plans.append(plan)
                break
            last = not sizes
            await self._send_token_chunk(
                record, send, ids, logprobs, position, size, finish if last else None
            )
            position += size
            if self.chunk_delay_seconds and not last:
                await self._nap(self.chunk_delay_seconds)
        else:
            if fault is not None:  # after_tokens >= the completion length
                await self._apply_stream_fault(record, fault, send, position)
        if record.protocol == "vllm":
            usage = {
                "prompt_tokens": len(record.prompt_ids),
                "completion_tokens": position,
                "total_tokens": len(record.prompt_ids) + position,
            }
            await _send_sse(send, {"id": f"gen-{record.number}", "choices": [], "usage": usage})
        await _send_raw(send, b"data: [DONE]\n\n", more=False)

    async def _respond_vllm_json(
        self,
        record: ServedRequest,
        send: _Send,
        ids: list[int],
        logprobs: list[float],
        finish: str,
        plan: _Plan,
    ) -> None:
        """vLLM's non-streamed answer: the whole completion in one chunk-shaped body."""
        fault = record.fault
        if fault is not None and fault.kind == "abort" and fault.after_tokens < len(ids):
            ids, logprobs, finish = (
                ids[: fault.after_tokens],
                logprobs[: fault.after_tokens],
                "abort",
            )
            self.aborted += 1
            record.fault_at_token = len(ids)
            if plan not in self._plans:  # continuable, as a streamed abort
                self._plans.append(plan)
        await self._nap(len(ids) * self.seconds_per_token)
        payload = _vllm_chunk(record.number, ids, logprobs, finish)
        payload["usage"] = {
            "prompt_tokens": len(record.prompt_ids),
            "completion_tokens": len(ids),
            "total_tokens": len(record.prompt_ids) + len(ids),
        }
        await _send_whole(record, send, payload, ids, logprobs, finish)

    async def _send_token_chunk(
        self,
        record: ServedRequest,
        send: _Send,
        ids: list[int],
        logprobs: list[float],
        position: int,
        size: int,
        finish: str | None,
    ) -> None:
        """Send ``ids[position:position + size]`` (and ``finish``) in the route's chunk shape."""
        end = position + size
        piece_ids, piece_lps = ids[position:end], logprobs[position:end]
        if record.protocol == "vllm":
            payload = _vllm_chunk(record.number, piece_ids, piece_lps, finish)
        elif record.protocol == "completions":
            payload = _completions_chunk(
                record.number, self.tokenizer, piece_ids, piece_lps, finish
            )
        elif self.sglang_incremental:
            payload = _sglang_chunk(record.number, self.tokenizer, piece_ids, piece_lps, finish)
        else:
            payload = _sglang_chunk(
                record.number, self.tokenizer, ids[:end], logprobs[:end], finish
            )
        await _send_sse(send, payload)
        record.chunks.append(piece_ids)
        record.completion_ids.extend(piece_ids)
        record.logprobs.extend(piece_lps)
        if finish is not None:
            record.finish_reason = finish

    async def _apply_stream_fault(
        self, record: ServedRequest, fault: Fault, send: _Send, position: int
    ) -> None:
        record.fault_at_token = position
        if fault.kind == "disconnect":
            raise _SimulatedDisconnect("injected disconnect")
        if fault.kind == "malformed":
            await _send_raw(send, MALFORMED_LINE.encode() + b"\n\n")
        elif fault.kind == "stall":
            await anyio.sleep(fault.stall_seconds)

    async def _respond_atropos(
        self,
        record: ServedRequest,
        send: _Send,
        ids: list[int],
        logprobs: list[float],
        finish: str,
        prompt_text: str,
    ) -> None:
        payload = {
            "text": [self.tokenizer.decode(ids)],
            "prompt": prompt_text,
            "finish_reasons": [finish],
            "logprobs": [[{str(i): lp} for i, lp in zip(ids, logprobs, strict=True)]],
            "prompt_token_ids": record.prompt_ids,
            "token_ids": [ids],
        }
        await _send_whole(record, send, payload, ids, logprobs, finish)

    # ---------------------------------------------------------------- chat route

    def _rng(self, record: ServedRequest, prompt_text: str) -> random.Random:
        if self.rng_key == "prompt":
            digest = hashlib.sha256(prompt_text.encode()).hexdigest()
            return random.Random(f"{self.seed}:{digest}")
        return random.Random(f"{self.seed}:{record.number}")

    async def _respond_chat(self, record: ServedRequest, send: _Send) -> None:
        body = record.body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest(400, "messages must be a non-empty list")
        tools = body.get("tools") or []
        prompt_text = self.tokenizer.apply_chat_template(messages, tools or None)
        text = self.policy(
            PolicyRequest(
                messages=tuple(messages),
                prompt_text=prompt_text,
                tools=tuple(tools),
                request_number=record.number,
                protocol="chat",
            )
        )
        completion_ids = [*self.tokenizer.encode(text), self.tokenizer.eos_token_id]
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise _BadRequest(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
        cut = max_tokens is not None and len(completion_ids) > max_tokens
        if cut:  # the reply is what the first max_tokens ids decode to, parsed as such
            completion_ids = completion_ids[:max_tokens]
            text = self.tokenizer.decode(completion_ids)
        record.text = text
        rng = self._rng(record, prompt_text)
        reasoning, content, calls = _split_reply(text, parse_tools=bool(tools))
        finish = "length" if cut else "tool_calls" if calls else "stop"
        record.completion_ids = completion_ids
        record.finish_reason = finish
        usage = {
            "prompt_tokens": len(self.tokenizer.encode(prompt_text)),
            "completion_tokens": len(completion_ids),
            "total_tokens": len(self.tokenizer.encode(prompt_text)) + len(completion_ids),
        }
        completion_id = f"chatcmpl-{record.number}"
        if not body.get("stream"):
            message: JSONObject = {"role": "assistant", "content": content}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = calls
            fault = record.fault
            if fault is not None and fault.kind == "stall":
                await anyio.sleep(fault.stall_seconds)
            payload = {
                "id": completion_id,
                "object": "chat.completion",
                "created": 0,
                "model": self.model_name,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            }
            data = await _start_json_with_fault(send, payload, fault)
            await _send_raw(send, data, more=False)
            return
        deltas = list(_chat_deltas(reasoning, content, calls, rng, self.max_chunk_tokens * 4))
        await _start_sse(send)
        fault = record.fault
        base = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": self.model_name,
        }
        await _send_sse(
            send,
            {
                **base,
                "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}],
            },
        )
        for index, delta in enumerate(deltas):
            if fault is not None and index >= fault.after_tokens:
                await self._apply_stream_fault(record, fault, send, index)
                fault = None
            await _send_sse(
                send, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            )
            if self.chunk_delay_seconds:
                await anyio.sleep(self.chunk_delay_seconds)
        if fault is not None:
            await self._apply_stream_fault(record, fault, send, len(deltas))
        await _send_sse(
            send, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        )
        options = body.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            await _send_sse(send, {**base, "choices": [], "usage": usage})
        await _send_raw(send, b"data: [DONE]\n\n", more=False)


# --------------------------------------------------------------------------------------------
# Helpers (pure)


def _chunk_sizes(total: int, max_size: int, rng: random.Random) -> Iterator[int]:
    while total > 0:
        size = min(total, rng.randint(1, max_size))
        total -= size
        yield size


def _split_reply(
    text: str, *, parse_tools: bool
) -> tuple[str | None, str | None, list[JSONObject]]:
    """Reasoning, content and OpenAI tool calls of a reply text (as a hermes-parser server)."""
    reasoning = None
    think = _THINK.match(text)
    if think:
        reasoning = think.group(1)
        text = text[think.end() :]
    calls: list[JSONObject] = []
    if parse_tools:
        for match in _TOOL_CALL.finditer(text):
            body = match.group(1)
            if exceeds_depth(body):  # a server refuses what its JSON decoder cannot take
                continue
            try:
                call = json.loads(body)
            except ValueError:
                continue  # like a real parser: malformed calls stay in the content
            if not isinstance(call, dict) or "name" not in call:
                continue
            calls.append(
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": json.dumps(call.get("arguments", {}), ensure_ascii=False),
                    },
                }
            )
        if calls:
            text = _TOOL_CALL.sub("", text)
    content = text.strip() if calls else text
    return reasoning, (content or None), calls


def _chat_deltas(
    reasoning: str | None,
    content: str | None,
    calls: list[JSONObject],
    rng: random.Random,
    max_chars: int,
) -> Iterator[JSONObject]:
    def pieces(text: str) -> Iterator[str]:
        position = 0
        while position < len(text):
            size = rng.randint(1, max_chars)
            yield text[position : position + size]
            position += size

    for piece in pieces(reasoning or ""):
        yield {"reasoning_content": piece}
    for piece in pieces(content or ""):
        yield {"content": piece}
    for index, call in enumerate(calls):
        fn = call["function"]
        yield {
            "tool_calls": [
                {
                    "index": index,
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": ""},
                }
            ]
        }
        for piece in pieces(fn["arguments"]):
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}


def _stop_at(ids: list[int], stop_ids: object) -> list[int] | None:
    """``ids`` up to and including the first of ``stop_ids`` in them, else ``None``."""
    if not isinstance(stop_ids, list):
        return None
    stops = {i for i in stop_ids if isinstance(i, int)}
    for position, token in enumerate(ids):
        if token in stops:
            return ids[: position + 1]
    return None


def _completions_chunk(
    number: int, tokenizer: Tokenizer, ids: list[int], logprobs: list[float], finish: str | None
) -> JSONObject:
    return {
        "id": f"cmpl-{number}",
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": tokenizer.decode(ids),
                "token_ids": ids,
                "logprobs": {
                    "tokens": [f"token_id:{i}" for i in ids],
                    "token_logprobs": logprobs,
                    "top_logprobs": [{} for _ in ids],
                    "text_offset": [0 for _ in ids],
                },
                "finish_reason": finish,
                "stop_reason": None,
            }
        ],
    }


def _vllm_chunk(
    number: int, ids: list[int], logprobs: list[float], finish: str | None
) -> JSONObject:
    return {
        "id": f"gen-{number}",
        "output_mode": "tokens",
        "choices": [
            {
                "index": 0,
                "token_ids": ids,
                "logprobs": {
                    "content": [
                        {"token_id": i, "logprob": lp} for i, lp in zip(ids, logprobs, strict=True)
                    ]
                },
                "finish_reason": finish,
                "stop_reason": None,
            }
        ],
    }


def _sglang_chunk(
    number: int, tokenizer: Tokenizer, ids: list[int], logprobs: list[float], finish: str | None
) -> JSONObject:
    finish_info: JSON = None
    if finish == "stop":
        finish_info = {"type": "stop", "matched": tokenizer.eos_token_id}
    elif finish is not None:
        finish_info = {"type": finish, "length": len(ids)}
    return {
        "text": tokenizer.decode(ids),
        "output_ids": ids,
        "meta_info": {
            "id": f"rid-{number}",
            "finish_reason": finish_info,
            "completion_tokens": len(ids),
            "output_token_logprobs": [[lp, i, None] for i, lp in zip(ids, logprobs, strict=True)],
        },
    }


# --------------------------------------------------------------------------------------------
# ASGI plumbing


async def _read_body(receive: _Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _send_json(
    send: _Send, status: int, payload: JSON, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(payload).encode()
    all_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        *(headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


async def _send_whole(
    record: ServedRequest,
    send: _Send,
    payload: JSON,
    ids: list[int],
    logprobs: list[float],
    finish: str,
) -> None:
    """A non-streamed token answer: the record's fault applied, the completion recorded as one
    chunk, the body sent."""
    fault = record.fault
    if fault is not None and fault.kind == "stall":
        await anyio.sleep(fault.stall_seconds)
    data = await _start_json_with_fault(send, payload, fault)
    record.completion_ids, record.logprobs, record.chunks = list(ids), list(logprobs), [list(ids)]
    record.finish_reason = finish
    await _send_raw(send, data, more=False)


async def _start_json_with_fault(send: _Send, payload: JSON, fault: Fault | None) -> bytes:
    """Start a 200 JSON response with a body fault applied; return the body still to send."""
    data = json.dumps(payload).encode()
    if fault is not None and fault.kind == "malformed":
        data = data[: len(data) // 2]
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if fault is not None and fault.kind == "disconnect":
        await _send_raw(send, data[: len(data) // 2])
        raise _SimulatedDisconnect("injected disconnect")
    return data


async def _start_sse(send: _Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
        }
    )


async def _send_sse(send: _Send, payload: JSON) -> None:
    await _send_raw(send, b"data: " + json.dumps(payload).encode() + b"\n\n")


async def _send_raw(send: _Send, data: bytes, *, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})

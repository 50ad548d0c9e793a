"""Asynchronous RL against a real CPU vLLM: a pause in the middle of Phase 2 generations.

The server runs with ``VLLM_SERVER_DEV_MODE=1`` (``scripts/vllm/run_tests.sh``), which registers
``POST /pause?mode=abort|wait|keep``, ``POST /resume`` and ``GET /is_paused``. Several rollouts
stream long completions (the tiny random model rarely ends a turn early, so ``max_tokens`` is
the end); once each has streamed some tokens, the test pauses the server, waits, and resumes it.

* ``mode=abort``: vLLM ends every in-flight stream with a final chunk ``finish_reason="abort"``
  (holding 0 or 1 ids: every id sampled before the abort is streamed); the loop (``pause_probe=PolledPause``) waits for
  ``/is_paused`` to clear and resumes each turn with prompt + the kept prefix and the remaining
  budget. Checked at the wire level (request bodies and raw SSE, parsed here): every resumed
  request's ids are the previous prompt + everything streamed so far, its ``max_tokens`` is
  what is left, the trajectory holds exactly the streamed ids with bit-equal logprobs, the
  budget holds, the template check finds nothing, and the tokens after the pause carry the
  version read at the resumed dispatch.
* ``mode=keep``: the streams freeze (no chunk while paused) and go on after ``/resume``: one
  request per rollout, no resume, the same trajectory structure.
* ``POST /abort_requests`` (dev mode too): aborts without pausing; the probe says "not
  paused", so each turn is resumed at once.

Both routes: ``/inference/v1/generate`` (``VLLMGenerateClient``) and ``/v1/completions``
(``VLLMCompletionsClient``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import anyio
import httpx
import pytest

from hermes_async.agent import AgentOptions, AgentResult, HermesAgentLoop
from hermes_async.agent.versions import PolledPause
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.inference.trajectory import MASK_ID
from hermes_async.jsontypes import JSONObject
from tests.integration.test_vllm_multiturn import RecordingTransport, _client, streamed

pytestmark = [pytest.mark.anyio, pytest.mark.vllm]

ROLLOUTS = 3
#: ~16 ms a token on 2 CPU cores: several seconds of streaming, so the pause lands mid-stream.
MAX_TOKENS = 640
#: Chunks each rollout's first request has *received* before the pause is sent. Small: on a
#: loaded 2-core machine the client can read the streams well behind the server (seen: 122
#: chunks read while the server had finished all 384), and a pause after the server is done
#: pauses nothing.
BEFORE_PAUSE = 16
PAUSED_SECONDS = 1.0
WAIT_SECONDS = 60.0
_PROMPT_KEY = {"vllm": "token_ids", "completions": "prompt"}


@pytest.fixture
async def pausable(vllm_url: str) -> str:
    """The server's URL, once it is known to expose vLLM's pause routes (else: skipped)."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0)) as http:
        response = await http.get(vllm_url + "/is_paused")
    if response.status_code == 404:
        pytest.skip(
            "this vLLM build exposes no GET /is_paused: it registers POST /pause, POST /resume "
            "and GET /is_paused only with VLLM_SERVER_DEV_MODE=1 (scripts/vllm/run_tests.sh)"
        )
    assert response.json() == {"is_paused": False}, response.text
    return vllm_url


class _TimedTransport(RecordingTransport):
    """Also keeps when each request was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent_at: list[float] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent_at.append(time.monotonic())
        return await super().handle_async_request(request)


def _chunks(raw: bytearray) -> int:
    """Chunks carrying tokens received so far (vLLM sends one choice per chunk)."""
    return bytes(raw).count(b'"token_ids":[')


async def _all_streaming(transport: RecordingTransport) -> None:
    """Return once every rollout's first request has streamed :data:`BEFORE_PAUSE` chunks."""
    with anyio.fail_after(WAIT_SECONDS):
        while len(transport.exchanges) < ROLLOUTS or any(
            _chunks(raw) < BEFORE_PAUSE for _, raw in transport.exchanges
        ):
            await anyio.sleep(0.02)


async def _pause_mid_stream(
    url: str,
    transport: RecordingTransport,
    mode: str,
    on_paused: Callable[[], None] = lambda: None,
) -> dict[str, object]:
    """Pause the server once every rollout is streaming, hold it, resume; report what it saw."""
    report: dict[str, object] = {}
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30.0, connect=5.0)) as http:
        await _all_streaming(transport)
        try:
            started = time.monotonic()
            response = await http.post("/pause", params={"mode": mode})
            report["pause_seconds"] = time.monotonic() - started
            assert response.status_code == 200, response.text
            assert (await http.get("/is_paused")).json() == {"is_paused": True}
            on_paused()
            await anyio.sleep(0.2)  # outputs already on their way arrive
            frozen = [_chunks(raw) for _, raw in transport.exchanges]
            await anyio.sleep(PAUSED_SECONDS)
            # Nothing is generated while paused (abort: ended; keep: held).
            assert [_chunks(raw) for _, raw in transport.exchanges[:ROLLOUTS]] == frozen[:ROLLOUTS]
            report["chunks_at_pause"] = frozen[:ROLLOUTS]
        finally:
            with anyio.move_on_after(10, shield=True):
                response = await http.post("/resume")
                report["resume_status"] = response.status_code
        assert (await http.get("/is_paused")).json() == {"is_paused": False}
    return report


def _raw_of(transport: RecordingTransport, body: JSONObject) -> bytes:
    """The raw SSE body answering ``body``."""
    (raw,) = [raw for sent, raw in transport.exchanges if sent is body]
    return bytes(raw)


def _final_chunk(raw: bytes) -> tuple[str | None, list[int]]:
    """The finish reason and ids of the last chunk carrying a choice."""
    last: tuple[str | None, list[int]] = (None, [])
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[len("data: ") :]).get("choices") or []:
                last = (choice.get("finish_reason"), list(choice.get("token_ids") or []))
    return last


def _requests(
    result: AgentResult, exchanges: list[tuple[JSONObject, bytearray]], route: str
) -> tuple[list[int], list[tuple[JSONObject, list[int], list[float], str | None]]]:
    """The rollout's prompt and, in order, its requests: (body, ids, logprobs, finish)."""
    state = result.managed_state or {}
    (first,) = [s for s in state["segments"] if s["kind"] == "completion"][:1]
    prompt = state["nodes"][0]["tokens"][: first["start"]]
    mine = []
    for body, raw in exchanges:
        ids = body[_PROMPT_KEY[route]]
        assert isinstance(ids, list)
        if ids[: len(prompt)] == prompt:
            mine.append((body, *streamed(bytes(raw), route)))
    return prompt, mine


def _check_trajectory(
    result: AgentResult,
    route: str,
    prompt: list[int],
    requests: list[tuple[JSONObject, list[int], list[float], str | None]],
) -> list[int]:
    """The trajectory is the prompt + exactly what the requests streamed; returns the ids."""
    assert result.error is None and result.failure is None, result.error
    assert result.turns_used == 1 and result.finished_naturally
    sent: list[int] = []
    sent_lps: list[float] = []
    for n, (body, ids, lps, _finish) in enumerate(requests):
        # Each request continues exactly where the previous one stopped, with what is left.
        assert body[_PROMPT_KEY[route]] == prompt + sent, f"request {n} does not continue"
        params = body["sampling_params"] if route == "vllm" else body
        assert isinstance(params, dict)
        assert params["max_tokens"] == MAX_TOKENS - len(sent)
        sent += ids
        sent_lps += lps
    node = (result.managed_state or {})["nodes"][0]
    tokens, masks, logprobs = node["tokens"], node["masked_tokens"], node["logprobs"]
    assert len(tokens) == len(masks) == len(logprobs)
    assert tokens[: len(prompt)] == prompt
    trained = [i for i, t in enumerate(tokens) if masks[i] != MASK_ID]
    assert [tokens[i] for i in trained] == sent  # no token lost, none repeated
    assert [logprobs[i] for i in trained] == sent_lps  # bit-equal
    assert trained == list(range(len(prompt), len(prompt) + len(sent)))  # one contiguous run
    assert len(sent) <= MAX_TOKENS  # the budget holds across resumes
    if requests[-1][3] == "length":
        assert len(sent) == MAX_TOKENS
    assert result.template_mismatches == 0, [c.describe() for c in result.template_checks]
    return sent


async def _rollouts(
    url: str,
    route: str,
    tokenizer: Tokenizer,
    transport: RecordingTransport,
    options: AgentOptions,
) -> list[AgentResult]:
    results: dict[int, AgentResult] = {}

    def task(i: int) -> list[JSONObject]:
        return [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": f"Task {i}: write a long answer."},
        ]

    # Warm-up, unrecorded: the first rollout of a session compiles the chat template and the
    # parser (seen: event-loop steps of 1.1 s on a loaded machine), while vLLM streams on.
    async with _client(route, url, RecordingTransport()) as client:
        warm = AgentOptions(max_turns=1, max_tokens=2)
        await HermesAgentLoop(client, [], set(), options=warm, tokenizer=tokenizer).run(
            task(-1), seed=1
        )
    async with _client(route, url, transport) as client:
        loop = HermesAgentLoop(client, [], set(), options=options, tokenizer=tokenizer)

        async def one(i: int) -> None:
            results[i] = await loop.run(task(i), task_id=f"r{i}", seed=300 + i)

        async with anyio.create_task_group() as tg:
            for i in range(ROLLOUTS):
                tg.start_soon(one, i)
    return [results[i] for i in range(ROLLOUTS)]


@pytest.mark.parametrize("route", ["vllm", "completions"])
async def test_abort_pause_resumes_every_turn_with_its_exact_prefix(
    pausable: str, served_tokenizer: Tokenizer, route: str
) -> None:
    vllm_url = pausable
    transport = _TimedTransport()
    version = [0]
    report: dict[str, object] = {}

    def weights_updated() -> None:
        version[0] = 1

    async def pause() -> None:
        report.update(await _pause_mid_stream(vllm_url, transport, "abort", weights_updated))

    started = time.monotonic()
    async with PolledPause(vllm_url + "/is_paused") as probe, anyio.create_task_group() as tg:
        options = AgentOptions(
            max_turns=1,
            max_tokens=MAX_TOKENS,
            pause_probe=probe,
            pause_timeout=30.0,
            max_resumes=4,
            version_source=lambda: version[0],
            rollout_timeout=240.0,
        )
        tg.start_soon(pause)
        results = await _rollouts(vllm_url, route, served_tokenizer, transport, options)
    seconds = time.monotonic() - started
    sent_at = [round(t - started, 2) for t in transport.sent_at]
    kept: list[int] = []
    abort_chunk_tokens: list[int] = []
    for result in results:
        prompt, requests = _requests(result, transport.exchanges, route)
        finishes = [finish for _, _, _, finish in requests]
        # Aborted at the pause, then resumed to the end of the budget.
        assert len(requests) >= 2 and finishes[:-1] == ["abort"] * (len(requests) - 1), finishes
        assert finishes[-1] in ("length", "stop")
        state = result.managed_state or {}
        assert state["resumes"] == len(requests) - 1 == result.timings[0]["resumes"]
        sent = _check_trajectory(result, route, prompt, requests)
        aborted = len(requests[0][1])
        assert BEFORE_PAUSE <= aborted < len(sent)
        kept.append(aborted)
        # Tokens before the pause are version 0's, after it version 1's (read at dispatch).
        completions = [s for s in state["segments"] if s["kind"] == "completion"]
        assert [(s["end"] - s["start"], s["version"]) for s in completions] == [
            (aborted, 0),
            (len(sent) - aborted, 1),
        ]
        assert state["policy_versions"] == [0, 1]
        # vLLM ends an aborted stream with a chunk saying so (with 0 or 1 ids, by timing).
        finish, ids = _final_chunk(_raw_of(transport, requests[0][0]))
        assert finish == "abort"
        abort_chunk_tokens.append(len(ids))
    print(
        f"\n[abort, {route}] {ROLLOUTS} rollouts x {MAX_TOKENS} tokens in {seconds:.1f} s; "
        f"tokens kept at the abort {kept} (ids in the abort chunk {abort_chunk_tokens}); "
        f"pause took {report['pause_seconds']:.3f} s; chunks at pause {report['chunks_at_pause']}; "
        f"requests sent at {sent_at} s"
    )


@pytest.mark.parametrize("route", ["vllm", "completions"])
async def test_keep_pause_holds_the_streams_and_continues_them(
    pausable: str, served_tokenizer: Tokenizer, route: str
) -> None:
    vllm_url = pausable
    transport = _TimedTransport()
    report: dict[str, object] = {}

    async def pause() -> None:
        report.update(await _pause_mid_stream(vllm_url, transport, "keep"))

    started = time.monotonic()
    async with PolledPause(vllm_url + "/is_paused") as probe, anyio.create_task_group() as tg:
        options = AgentOptions(
            max_turns=1,
            max_tokens=MAX_TOKENS,
            pause_probe=probe,
            pause_timeout=30.0,
            rollout_timeout=240.0,
        )
        tg.start_soon(pause)
        results = await _rollouts(vllm_url, route, served_tokenizer, transport, options)
    seconds = time.monotonic() - started
    held = report["chunks_at_pause"]
    assert isinstance(held, list)
    # The pause landed mid-stream: the streams were held, then went on after /resume.
    assert all(0 < n < MAX_TOKENS for n in held), held
    for result in results:
        prompt, requests = _requests(result, transport.exchanges, route)
        assert len(requests) == 1  # the stream just went on: no resume
        assert requests[0][3] in ("length", "stop")
        state = result.managed_state or {}
        assert state["resumes"] == 0 and "resumes" not in result.timings[0]
        _check_trajectory(result, route, prompt, requests)
        assert [s["kind"] for s in state["segments"]] == ["prompt", "completion"]
    assert seconds > PAUSED_SECONDS
    print(
        f"\n[keep, {route}] {ROLLOUTS} rollouts x {MAX_TOKENS} tokens in {seconds:.1f} s "
        f"(paused {PAUSED_SECONDS:g} s); pause took {report['pause_seconds']:.3f} s; "
        f"chunks at pause {report['chunks_at_pause']}; "
        f"requests sent at {[round(t - started, 2) for t in transport.sent_at]} s"
    )


async def test_abort_requests_without_a_pause_resumes_at_once(
    pausable: str, served_tokenizer: Tokenizer
) -> None:
    """``POST /abort_requests`` (dev mode) aborts in-flight requests but does not pause: the
    probe says "not paused", so each turn is resumed at once with its prefix."""
    vllm_url, route = pausable, "vllm"
    transport = _TimedTransport()
    aborted: list[object] = []

    async def abort() -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0)) as http:
            await _all_streaming(transport)
            response = await http.post(vllm_url + "/abort_requests", json={})
        assert response.status_code == 200, response.text
        aborted.append(response.json())

    started = time.monotonic()
    async with PolledPause(vllm_url + "/is_paused") as probe, anyio.create_task_group() as tg:
        options = AgentOptions(
            max_turns=1,
            max_tokens=MAX_TOKENS,
            pause_probe=probe,
            pause_timeout=30.0,
            rollout_timeout=240.0,
        )
        tg.start_soon(abort)
        results = await _rollouts(vllm_url, route, served_tokenizer, transport, options)
    seconds = time.monotonic() - started
    print(
        f"\n[abort_requests] server answered {aborted}; finishes "
        f"{[streamed(bytes(raw), route)[2] for _, raw in transport.exchanges]}; chunks "
        f"{[_chunks(raw) for _, raw in transport.exchanges]}"
    )
    kept = []
    for result in results:
        prompt, requests = _requests(result, transport.exchanges, route)
        finishes = [finish for _, _, _, finish in requests]
        assert len(requests) == 2 and finishes[0] == "abort", finishes
        assert (result.managed_state or {})["resumes"] == 1
        sent = _check_trajectory(result, route, prompt, requests)
        kept.append(len(requests[0][1]))
        assert BEFORE_PAUSE <= kept[-1] < len(sent)
    print(
        f"\n[abort_requests] {ROLLOUTS} rollouts x {MAX_TOKENS} tokens in {seconds:.1f} s; "
        f"server answered {aborted}; tokens kept at the abort {kept}; requests sent at "
        f"{[round(t - started, 2) for t in transport.sent_at]} s"
    )

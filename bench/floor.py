"""How far hermes_async is from the floor: the least work the same 3-turn exchange needs.

The workload and the server are ``bench/peers.py``'s (N rollouts, two tool calls and an answer
each, the scripted server in its own process). The floor is a client that does only what the
exchange cannot do without, over the same event loop (anyio on asyncio) and the same sockets:

* a pool of kept-alive connections, at most ``--connections`` requests in flight;
* per turn: the request body encoded (orjson), written with a fixed HTTP/1.1 head; the
  response framed by httptools (the parser hermes_async's client uses) and its JSON decoded;
* ``floor-chat``: the non-streamed chat completion; the reply message and a tool message
  (fixed text) are appended to the next request's messages;
* ``floor-token``: the streamed ``/inference/v1/generate`` response, each event's ids
  appended; the next prompt is prompt + sampled ids + the tool-response suffix ids.

No tools run, nothing is checked, no tool call is parsed, nothing is rendered or tokenized:
the first prompt's ids and the suffixes' come from one hermes_async Phase 2 rollout made before
the clock (the suffix does not depend on the rollout).

* ``floor-phase2``: ``floor-token`` plus the work a Phase 2 client cannot hand to a server, done
  once per turn with the fastest pieces at hand: the completion decoded (tiktoken); its one
  tool call found with ``str.find`` and its JSON decoded (orjson), the least parse of this
  workload's well-formed calls (no streaming, no other format, no fault named); the turn
  rendered through the chat template (hermes_async's built-in renderer, incremental); the new
  suffix encoded (tiktoken). Still no tools, no checks, no limits. Its distance
  from ``floor-chat`` is the least a Phase 2 rollout can cost beyond a chat rollout here, so
  ``(hermes-chat + floor-phase2 - floor-chat) / hermes-chat`` bounds Phase 2 / chat from below
  (printed when the four sides ran). The sides ``hermes-chat`` and
``hermes-token`` are ``bench/peers.py``'s; each side runs in its own client process, rounds
alternate, and the ratios hermes / floor per rollout are printed.

    PYTHONPATH=. .venv/bin/python bench/floor.py                     # N = 100, 1000
    PYTHONPATH=. .venv/bin/python bench/floor.py --sides floor-token,hermes-token --sizes 1000
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # (this folder's peers.py: the workload, the server, the harness)

SIDES = ("floor-chat", "hermes-chat", "floor-token", "hermes-token", "floor-phase2")
PAIRS = (("hermes-chat", "floor-chat"), ("hermes-token", "floor-token"))


class Pool:
    """Kept-alive connections to one host; at most ``limit`` requests in flight."""

    def __init__(self, base_url: str, limit: int) -> None:
        import anyio

        host_port = base_url.removeprefix("http://").rstrip("/")
        self.host, _, port = host_port.partition(":")
        self.port = int(port)
        self.limiter = anyio.CapacityLimiter(limit)
        self.idle: list[Any] = []

    async def post(self, path: str, body: bytes) -> list[bytes]:
        """POST ``body``; the response body's pieces as they were read."""
        import anyio
        import httptools

        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        pieces: list[bytes] = []
        done: list[bool] = []

        class Sink:
            def on_body(self, data: bytes) -> None:
                pieces.append(data)

            def on_message_complete(self) -> None:
                done.append(True)

        async with self.limiter:
            stream = self.idle.pop() if self.idle else await anyio.connect_tcp(self.host, self.port)
            await stream.send(head + body)
            parser = httptools.HttpResponseParser(Sink())
            while not done:
                parser.feed_data(await stream.receive())
            self.idle.append(stream)
        return pieces

    async def aclose(self) -> None:
        for stream in self.idle:
            await stream.aclose()


async def _sample(pool: Pool, prompt: list[int]) -> list[int]:
    """One streamed ``/inference/v1/generate`` request: the sampled ids of its events."""
    import orjson

    body = {
        "token_ids": prompt,
        "sampling_params": {"max_tokens": peers.MAX_TOKENS, "logprobs": 0},
        "stream": True,
    }
    pieces = await pool.post("/inference/v1/generate", orjson.dumps(body))
    ids: list[int] = []
    for event in b"".join(pieces).split(b"\n\n"):
        if event.startswith(b"data: {"):
            for choice in orjson.loads(event[6:])["choices"]:  # none in a usage event
                ids += choice["token_ids"]
    return ids


class Floor:
    """The floor client of one phase (``chat`` or ``token``)."""

    def __init__(self, args: argparse.Namespace, phase: str) -> None:
        self.args, self.phase = args, phase
        self.hermes = peers.Hermes(args, "token")
        self.schemas = list(self.hermes.tools.schemas)
        self.prompt, self.suffixes, self.last = self.hermes.run(self._reference)
        if phase == "phase2":
            tokenizer = self.hermes.tokenizer
            special = tokenizer.special_tokens
            self.stop_ids = {
                tokenizer.eos_token_id,
                special["<|im_end|>"],
                special["<|endoftext|>"],
            }

    async def _reference(self) -> tuple[list[int], list[list[int]], list[int]]:
        """Prompt ids, tool-response suffix ids and the last completion of one Phase 2 rollout."""
        from hermes_async import run_rollout

        async with self.hermes.open(1) as (client, setup):
            scored = await run_rollout(
                client,
                [{"role": "user", "content": "Do task reference."}],
                self.hermes.tools,
                setup=setup,
                options=self.hermes.options,
            )
        assert peers.Hermes.completed(scored), scored.result
        state = scored.result.managed_state
        tokens = state["nodes"][0]["tokens"]
        parts: dict[str, list[list[int]]] = {"prompt": [], "suffix": [], "completion": []}
        for segment in state["segments"]:
            parts[segment["kind"]].append(tokens[segment["start"] : segment["end"]])
        return parts["prompt"][0], parts["suffix"], parts["completion"][-1]

    async def _chat(self, pool: Pool, i: int) -> bool:
        import orjson

        messages: list[Any] = [{"role": "user", "content": f"Do task {i}."}]
        message: Any = None
        for turn in range(peers.TOOL_CALLS + 1):
            body = {
                "model": "default",
                "messages": messages,
                "tools": self.schemas,
                "max_tokens": peers.MAX_TOKENS,
            }
            pieces = await pool.post("/v1/chat/completions", orjson.dumps(body))
            message = orjson.loads(b"".join(pieces))["choices"][0]["message"]
            if turn < peers.TOOL_CALLS:
                call = message["tool_calls"][0]
                content = f"step {turn + 1} done"
                messages += [
                    message,
                    {"role": "tool", "tool_call_id": call["id"], "content": content},
                ]
        return bool(message is not None and message["content"] == peers.FINAL_ANSWER)

    async def _token(self, pool: Pool, i: int) -> bool:
        prompt = self.prompt
        ids: list[int] = []
        for turn in range(peers.TOOL_CALLS + 1):
            ids = await _sample(pool, prompt)
            if turn < peers.TOOL_CALLS:
                prompt = prompt + ids + self.suffixes[turn]
        return ids == self.last

    async def _phase2(self, pool: Pool, i: int) -> bool:
        import orjson

        from hermes_async.inference.rendering import ChatRenderer

        tokenizer = self.hermes.tokenizer
        stops = self.stop_ids
        messages: list[Any] = [{"role": "user", "content": "Do task reference."}]
        renderer = ChatRenderer(tokenizer, self.schemas)
        text = renderer.render(messages, add_generation_prompt=True)
        prompt, ids, same = self.prompt, [], True
        for turn in range(peers.TOOL_CALLS + 1):
            ids = await _sample(pool, prompt)
            completion = tokenizer.decode([t for t in ids if t not in stops])
            # The least parse of this workload's one well-formed call: find it, decode its JSON.
            start = completion.find("<tool_call>\n")
            if turn == peers.TOOL_CALLS:
                return same and start < 0 and ids == self.last
            end = completion.index("\n</tool_call>", start)
            call = orjson.loads(completion[start + 12 : end])
            messages += [
                {
                    "role": "assistant",
                    "content": completion[:start].rstrip("\n"),
                    "tool_calls": [
                        {"id": f"call_{i}_{turn}", "type": "function", "function": call}
                    ],
                },
                {
                    "role": "tool",
                    "tool_call_id": f"call_{i}_{turn}",
                    "content": f"step {turn + 1} done",
                },
            ]
            full = renderer.render(messages, add_generation_prompt=True)
            # The template renders the call as it was sampled (this workload's calls are): the
            # suffix is what follows the prompt and the sampled text.
            suffix = tokenizer.encode(full[len(text) + len(tokenizer.decode(ids)) :])
            same = same and suffix == self.suffixes[turn]
            prompt, text = prompt + ids + suffix, full
        return False

    async def batch(self, n: int) -> int:
        import anyio

        one = {"chat": self._chat, "token": self._token, "phase2": self._phase2}[self.phase]
        pool = Pool(self.args.base_url, self.args.connections)
        completed = 0

        async def rollout(i: int) -> None:
            nonlocal completed
            ok = await one(pool, i)  # (not `completed += await ...`: that reads before awaiting)
            completed += ok

        try:
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(rollout, i)
        finally:
            await pool.aclose()
        return completed

    def prepare(self, n: int, label: str) -> Callable[[], int]:
        return lambda: int(self.hermes.run(self.batch, n))


def client(args: argparse.Namespace) -> None:
    if args.client.startswith("floor-"):
        prepare = Floor(args, args.client.removeprefix("floor-")).prepare
        print(json.dumps(peers.measure(prepare, args)), flush=True)
    else:
        peers.client(args)


def main(args: argparse.Namespace) -> int:
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        raise SystemExit(f"unknown side(s) {unknown}; known: {', '.join(SIDES)}")
    for n, results in peers.compare(__file__, sides, args).items():
        peers.report(n, results, sides[0])
        for ours, floor in PAIRS:
            a = peers.median_of(results.get(ours, []), "cpu_s")
            b = peers.median_of(results.get(floor, []), "cpu_s")
            if a is not None and b is not None:
                print(
                    f"  {ours} / {floor}: {a / n * 1e3:.3f} / {b / n * 1e3:.3f} ms per rollout"
                    f" = {a / b:.2f}x"
                )
        ms = {side: peers.median_of(results.get(side, []), "cpu_s") for side in SIDES}
        if all(ms[side] is not None for side in ("hermes-chat", "floor-chat", "floor-phase2")):
            chat, floor_chat, least = ms["hermes-chat"], ms["floor-chat"], ms["floor-phase2"]
            print(
                f"  Phase 2's least own work: floor-phase2 - floor-chat = "
                f"{(least - floor_chat) / n * 1e3:.3f} ms per rollout; the least Phase 2 / chat: "
                f"(hermes-chat + that) / hermes-chat = {(chat + least - floor_chat) / chat:.2f}x"
            )
            if ms["hermes-token"] is not None:
                token = ms["hermes-token"]
                print(
                    f"  hermes-token / hermes-chat = {token / chat:.2f}x; "
                    f"hermes-token / floor-phase2 = {token / least:.2f}x"
                )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    peers.add_arguments(parser, SIDES)
    ns = parser.parse_args()
    if ns.serve:
        peers.serve(ns.model_latency)
    elif ns.client:
        client(ns)
    else:
        sys.exit(main(ns))

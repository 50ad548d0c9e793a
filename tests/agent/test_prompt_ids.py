"""The first prompt's ids: encoded once per distinct text and tokenizer, never kept stale."""

from __future__ import annotations

import collections
import gc
import re
from collections.abc import Sequence
from functools import partial
from typing import Any

import anyio
import pytest

from hermes_async.agent import AgentOptions, RolloutSetup, run_group
from hermes_async.agent._prompt_ids import MIN_CHARS, PROMPT_IDS, PromptIds
from hermes_async.agent._reasoning import TemplateKwargsTokenizer
from hermes_async.agent._start_ramp import FIRST_PROMPTS_PER_PASS
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.inference.tokenizer import QwenTokenizer, load_tokenizer
from hermes_async.testing import ScriptedModelServer, open_app_endpoint
from hermes_async.tools.registry import get_tool_definitions
from tests.support import TOKENIZER

LONG = "A long system prompt that many rollouts share. " * 60
assert len(LONG) > MIN_CHARS


class Counting:
    """A tokenizer that counts its encodes (everything else is the real one's)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.encoded: list[str] = []

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        self.encoded.append(text)
        result: list[int] = self._inner.encode(text, allow_special=allow_special)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)


def test_the_same_text_is_encoded_once_per_tokenizer() -> None:
    cache = PromptIds(max_entries=2)
    tok = Counting(load_tokenizer())
    first = cache.encode(tok, LONG)  # type: ignore[arg-type]
    again = cache.encode(tok, LONG)  # type: ignore[arg-type]
    assert list(first) == list(again) == tok._inner.encode(LONG)
    assert tok.encoded == [LONG] and (cache.hits, cache.misses) == (1, 1)
    other = Counting(load_tokenizer())
    cache.encode(other, LONG)  # type: ignore[arg-type]
    assert other.encoded == [LONG]  # another tokenizer's ids are its own
    # The loop's template-switch wrapper shares its tokenizer's entries.
    wrapped = TemplateKwargsTokenizer(tok, {"enable_thinking": False})  # type: ignore[arg-type]
    cache.encode(wrapped, LONG)
    assert tok.encoded == [LONG]


def test_share_hands_out_the_first_equal_text_and_one_id_array() -> None:
    cache = PromptIds()
    tok = load_tokenizer()
    first_text, first_ids = cache.share(tok, LONG)
    copy = LONG[:10] + LONG[10:]  # equal, another object
    assert copy == LONG and copy is not LONG
    text, ids = cache.share(tok, copy)
    assert text is first_text is LONG and ids is first_ids
    short = "Short prompt."
    assert cache.share(tok, short)[0] is short  # not cached: the caller's own text


def test_short_texts_and_a_disabled_cache_always_encode() -> None:
    tok = Counting(load_tokenizer())
    cache = PromptIds()
    cache.encode(tok, "short")  # type: ignore[arg-type]
    cache.encode(tok, "short")  # type: ignore[arg-type]
    off = PromptIds(max_entries=0)
    off.encode(tok, LONG)  # type: ignore[arg-type]
    off.encode(tok, LONG)  # type: ignore[arg-type]
    assert tok.encoded == ["short", "short", LONG, LONG]
    assert (cache.misses, off.misses) == (0, 0)


def test_least_recently_used_entries_go_first_and_tokenizers_are_not_kept_alive() -> None:
    cache = PromptIds(max_entries=2)
    tok = Counting(load_tokenizer())
    texts = [LONG + str(i) for i in range(3)]
    for text in (texts[0], texts[1], texts[0], texts[2]):  # texts[1] is the oldest when 2 comes
        cache.encode(tok, text)  # type: ignore[arg-type]
    cache.encode(tok, texts[0])  # type: ignore[arg-type]
    cache.encode(tok, texts[1])  # type: ignore[arg-type]
    assert tok.encoded == [texts[0], texts[1], texts[2], texts[1]]
    dying = QwenTokenizer()
    cache.encode(dying, LONG)
    assert cache.misses == 5  # texts 0, 1, 2, 1 again, then the dying tokenizer
    del dying
    gc.collect()
    # The entry holds no strong reference: a tokenizer built later (possibly at the same
    # address) encodes for itself.
    fresh = Counting(QwenTokenizer())
    cache.encode(fresh, LONG)  # type: ignore[arg-type]
    assert fresh.encoded == [LONG]


@pytest.mark.anyio
async def test_a_group_encodes_its_shared_prompt_once() -> None:
    tok = Counting(load_tokenizer())
    server = ScriptedModelServer(lambda request: "Done.", tokenizer=load_tokenizer())
    messages = [{"role": "system", "content": LONG}, {"role": "user", "content": "Go."}]
    PROMPT_IDS.clear()
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
    ):
        group = await run_group(
            client,
            messages,
            get_tool_definitions(["terminal", "file"]),
            size=4,
            options=AgentOptions(max_tokens=32),
            setup=RolloutSetup(tokenizer=tok),
        )
    prompts = [text for text in tok.encoded if LONG in text]
    assert len(prompts) == 1, f"the shared prompt was encoded {len(prompts)} times"
    served: list[Sequence[int]] = [r.prompt_ids for r in server.requests]
    expected = load_tokenizer().encode(prompts[0])
    assert len(served) == 4 and all(list(ids) == expected for ids in served)
    assert all(list(r.tokens[: len(expected)]) == expected for r in group.rollouts)


@pytest.mark.anyio
async def test_rollouts_started_at_once_render_a_few_first_prompts_per_loop_pass() -> None:
    n = FIRST_PROMPTS_PER_PASS * 6
    passes = 0
    at_pass: list[int] = []  # the loop pass of each first-prompt encode
    seen: set[str] = set()
    inner = TOKENIZER

    class Ticking(Counting):
        def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
            task = re.search(r"Do task \d+\.", text)
            if task and task[0] not in seen:  # the rollout's first prompt
                seen.add(task[0])
                at_pass.append(passes)
            return super().encode(text, allow_special=allow_special)

    tok = Ticking(inner)
    server = ScriptedModelServer(lambda request: "Done.", tokenizer=inner)
    started = anyio.Event()

    async def ticker() -> None:
        nonlocal passes
        started.set()
        while True:
            await anyio.lowlevel.checkpoint()
            passes += 1

    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        VLLMGenerateClient(base_url, transport=transport) as client,
        anyio.create_task_group() as outer,
    ):
        outer.start_soon(ticker)
        await started.wait()
        setup = RolloutSetup(tokenizer=tok)
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(
                    partial(
                        run_group,
                        client,
                        [{"role": "user", "content": f"Do task {i}."}],
                        get_tool_definitions(["terminal"]),
                        size=1,
                        options=AgentOptions(max_tokens=8),
                        setup=setup,
                    )
                )
        outer.cancel_scope.cancel()
    assert len(at_pass) == n
    per_pass = collections.Counter(at_pass)
    # Without the gate every rollout encodes its first prompt in the pass it starts in. The
    # ticker's count is one pass off at most (trio shuffles the order within a pass): a count
    # may hold two passes' worth.
    assert max(per_pass.values()) <= 2 * FIRST_PROMPTS_PER_PASS, per_pass
    assert len(per_pass) >= n // (2 * FIRST_PROMPTS_PER_PASS)

"""Incremental chat-template rendering changes nothing a rollout produces, only its CPU.

The same scripted rollouts (every family, long runs, calls cut by ``max_tokens``, templates
that break the history check) run with the previous full rendering
(``incremental_rendering=False``) and with the incremental one; the tokens, masks, logprobs,
segment boundaries, messages and template checks must be identical, and the incremental run must
actually have rendered fewer messages.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from hermes_async.inference.families import FamilyTokenizer
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.parsers import _engine
from tests.agent.test_loop_families import CASES, SCRIPTS, rollout, tokenizer_for

pytestmark = pytest.mark.anyio


class CountingTokenizer:
    """Delegates to a family tokenizer; counts the messages each rendering was given."""

    def __init__(self, inner: FamilyTokenizer) -> None:
        self._inner = inner
        self.rendered: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)

    @property
    def chat_template_source(self) -> str | None:
        return self._inner.chat_template_source

    def apply_chat_template(
        self,
        messages: Sequence[JSONObject],
        tools: Sequence[JSONObject] | None = None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, JSON] | None = None,
    ) -> str:
        self.rendered.append(len(messages))
        return self._inner.apply_chat_template(
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
        )


def long_script(name: str) -> list[str]:
    """Eight tool turns and the answer (the family's two call turns, four times)."""
    texts = SCRIPTS.get(name) or SCRIPTS["qwen3-nothink"]
    return [*texts[:2] * 4, texts[2]]


def without_call_ids(messages: list[JSONObject]) -> list[JSONObject]:
    """The messages with the loop's random call ids numbered in order of appearance."""
    names: dict[str, str] = {}
    out: list[JSONObject] = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**c, "id": names.setdefault(c["id"], f"id{len(names)}")}
                for c in message["tool_calls"]
            ]
        if "tool_call_id" in message:
            message["tool_call_id"] = names.setdefault(message["tool_call_id"], f"id{len(names)}")
        out.append(message)
    return out


def outputs(result: Any) -> dict[str, Any]:
    return {
        "managed_state": result.managed_state,
        "messages": without_call_ids(result.messages),
        "template_checks": result.template_checks,
        "template_mismatches": result.template_mismatches,
        "finished_naturally": result.finished_naturally,
        "turns_used": result.turns_used,
        "tool_errors": result.tool_errors,
    }


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families")


@pytest.fixture(params=list(CASES))
def case(request: pytest.FixtureRequest, family_dirs: Path) -> tuple[str, FamilyTokenizer]:
    name = str(request.param)
    return name, tokenizer_for(name, family_dirs)  # loaded outside the event loop (blocking)


@pytest.mark.parametrize("cut", [False, True], ids=["whole", "cut-by-max-tokens"])
async def test_rollouts_are_identical_with_full_and_incremental_rendering(
    case: tuple[str, FamilyTokenizer], cut: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, tok = case
    kwargs: dict[str, Any] = {"max_turns": 12}
    if cut:
        kwargs["max_tokens"] = 9  # calls cut off: user notices, length checks
    runs = {}
    counts = {}
    for incremental in (False, True):
        counting = CountingTokenizer(tok)
        # Call ids are random and Kimi K2's template renders them: the same ids in both runs.
        ids = (f"call_{n:024x}" for n in itertools.count())
        monkeypatch.setattr(_engine, "new_call_id", functools.partial(next, ids))
        result, server, _rec = await rollout(
            counting,  # type: ignore[arg-type]
            long_script(name),
            incremental_rendering=incremental,
            **kwargs,
        )
        runs[incremental] = outputs(result)
        runs[incremental]["prompts"] = [r.prompt_ids for r in server.requests]
        counts[incremental] = sum(counting.rendered)
    assert runs[True] == runs[False]
    assert runs[False]["turns_used"] >= (1 if cut else 9)
    if cut and name == "hermes":  # calls really were cut: the model was told
        assert any(m["role"] == "user" for m in runs[False]["messages"][2:])
    if not cut and name not in ("deepseek_v31-think", "qwen3-nothink"):
        # (those two re-render history every turn: windows are tried, then a full rendering)
        assert counts[True] < counts[False]

"""One Phase 2 turn: stream tokens, decode incrementally, parse, dispatch sealed calls early.

:class:`Phase2Turn` holds the per-turn state of the agent loop's token path, and nothing else:
the ids and logprobs exactly as sampled, a UTF-8-safe incremental decoder, and a fresh streaming
parser. The loop feeds it each :class:`~hermes_async.inference.generate.TokenDelta`; every tool
call the parser *seals* is handed to the turn's :class:`~hermes_async._loop_tools.TurnToolRunner`
at once (early dispatch) — so a tool runs while the model is still writing the next call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hermes_async.inference.generate import TokenDelta
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.jsontypes import JSONObject
from hermes_async.parsers.types import (
    ParserEvent,
    ToolCallInvalid,
    ToolCallSealed,
    ToolCallTruncated,
)

if TYPE_CHECKING:
    from hermes_async._loop_tools import TurnToolRunner

__all__ = ["Phase2Turn", "split_think"]

_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


def split_think(content: str) -> tuple[str, str | None]:
    """Split a leading ``<think>...</think>`` block off ``content``.

    Returns:
        ``(content without the block, reasoning or None)``. A ``<think>`` that is never closed
        (the model ran out of tokens while thinking) is all reasoning.
    """
    match = _THINK.match(content)
    if match:
        return content[match.end() :], match.group(1).strip("\n") or None
    stripped = content.lstrip()
    if stripped.startswith("<think>") and "</think>" not in stripped:
        return "", stripped[len("<think>") :].strip("\n") or None
    return content, None


class Phase2Turn:
    """State of one streamed completion.

    Args:
        tokenizer: Decodes the stream.
        parser_name: Tool-call parser for this turn.
        tool_schemas: Offered tools (parsers type parameters from them).
        early_dispatch: Submit calls as soon as they are sealed; else at :meth:`finish`.
    """

    def __init__(
        self,
        *,
        tokenizer: Tokenizer,
        parser_name: str,
        tool_schemas: Sequence[JSONObject],
        early_dispatch: bool,
    ) -> None:
        from hermes_async.parsers import get_parser

        self.parser = get_parser(parser_name, tools=list(tool_schemas) or None, tokenizer=tokenizer)
        self.decoder = tokenizer.incremental_decoder()
        self.early_dispatch = early_dispatch
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.ttft: float | None = None
        self.finish_reason: str | None = None
        self.content = ""
        # End-of-turn ids are sampled (and trained on) but are not text for the parser.
        self._stop_ids = {tokenizer.eos_token_id}
        endoftext = tokenizer.special_tokens.get("<|endoftext|>")
        if endoftext is not None:
            self._stop_ids.add(endoftext)
        self._held: list[ToolCallSealed | ToolCallInvalid | ToolCallTruncated] = []

    def feed(self, delta: TokenDelta, runner: TurnToolRunner, elapsed: float) -> None:
        """Take one delta: keep its ids, decode, parse, and submit sealed calls."""
        if self.ttft is None and delta.token_ids:
            self.ttft = elapsed
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        ids = [i for i in delta.token_ids if i not in self._stop_ids]
        text = self.decoder.decode(ids)
        if text:
            self._handle(self.parser.feed(text, ids), runner)

    def finish(self, runner: TurnToolRunner) -> None:
        """End of stream: flush the decoder, close the parser, submit what is left."""
        tail = self.decoder.flush()
        if tail:
            self._handle(self.parser.feed(tail, None), runner)
        result = self.parser.finish()
        self._handle(result.final_events, runner)
        for event in self._held:
            self._submit(event, runner)
        self._held.clear()
        self.content = result.content or ""

    def _handle(self, events: Sequence[ParserEvent], runner: TurnToolRunner) -> None:
        for event in events:
            if isinstance(event, ToolCallSealed | ToolCallInvalid | ToolCallTruncated):
                if self.early_dispatch:
                    self._submit(event, runner)
                else:
                    self._held.append(event)

    @staticmethod
    def _submit(
        event: ToolCallSealed | ToolCallInvalid | ToolCallTruncated, runner: TurnToolRunner
    ) -> None:
        if isinstance(event, ToolCallSealed):
            runner.submit(event.id, event.name, event.arguments)
        else:
            # Malformed or cut off: kept in order, never executed; the model is told why.
            runner.reject(event.id, event.name or "", event.raw, event.message)

"""Tokenizer protocol (implementations: built-in offline Qwen via tiktoken, and HF).

The agent loop never re-tokenizes sampled text: it keeps the ids the server sampled and only
tokenizes what *it* renders (the prompt, the tool-response suffix). So the protocol is small:
encode/decode, special tokens, an incremental decoder for streams, and the chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from hermes_async.jsontypes import JSONObject

__all__ = ["IncrementalDecoder", "Tokenizer"]


@runtime_checkable
class IncrementalDecoder(Protocol):
    """Decodes a token stream piece by piece, UTF-8 safe.

    A character whose bytes are split across tokens is emitted once, whole, when its last byte
    arrives; ``flush`` emits what is left (undecodable bytes replaced) at end of stream.
    """

    def decode(self, token_ids: Sequence[int]) -> str:
        """Feed more ids; return the text that is now complete."""
        ...

    def flush(self) -> str:
        """End of stream: return any pending text."""
        ...


@runtime_checkable
class Tokenizer(Protocol):
    """What the loop, the parsers and the scripted server need from a tokenizer."""

    @property
    def name(self) -> str:
        """A short identifier (hub name, directory, or ``"qwen-offline"``)."""
        ...

    @property
    def eos_token_id(self) -> int:
        """End-of-turn id the server stops on (``<|im_end|>`` for ChatML models)."""
        ...

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special / added token text -> id (``"<tool_call>"`` -> 151657, ...)."""
        ...

    def __len__(self) -> int:
        """Vocabulary size including added tokens."""
        ...

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Token ids of ``text``; with ``allow_special`` special-token text maps to its id."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens spelled out)."""
        ...

    def incremental_decoder(self) -> IncrementalDecoder:
        """A fresh decoder for one stream."""
        ...

    def apply_chat_template(
        self,
        messages: Sequence[JSONObject],
        tools: Sequence[JSONObject] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """Render ``messages`` (and tool schemas) to the model's prompt text."""
        ...

"""Tokenizer protocol and the two implementations: built-in offline Qwen (tiktoken) and HF.

The agent loop never re-tokenizes sampled text: it keeps the ids the server sampled and only
tokenizes what *it* renders (the prompt, the tool-response suffix). So the protocol is small:
encode/decode, special tokens, an incremental decoder for streams, and the chat template.

Implementations:

- :class:`QwenTokenizer` (``"qwen-offline"``, the default): real Qwen2.5/Qwen3 ids with no hub
  access, plus the project's ChatML + hermes ``<tool_call>`` chat template (its exact text
  contract, including what separates an assistant turn from the next one, is documented in
  :mod:`hermes_async.inference._chat_template`).
- :class:`~hermes_async.inference.hf.HFTokenizer`: any ``transformers`` tokenizer from a local
  directory or a hub name (needs the ``atropos`` extra).

:func:`load_tokenizer` picks one from a name. Loading is **blocking** (reading vocabularies,
0.3 s for ``qwen-offline``, about a second for an HF directory): call it at setup time, before
the event loop runs rollouts, or wrap it yourself in ``anyio.to_thread.run_sync`` behind a
limiter. The returned objects are safe to share between concurrent rollouts (they hold no
per-stream state; each stream gets its own :meth:`Tokenizer.incremental_decoder`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from hermes_async.inference._qwen import QWEN_OFFLINE_NAME, QwenTokenizer
from hermes_async.jsontypes import JSON, JSONObject

__all__ = [
    "QWEN_OFFLINE_NAME",
    "IncrementalDecoder",
    "QwenTokenizer",
    "Tokenizer",
    "load_tokenizer",
]


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
        chat_template_kwargs: Mapping[str, JSON] | None = None,
    ) -> str:
        """Render ``messages`` (and tool schemas) to the model's prompt text.

        ``chat_template_kwargs`` are extra template variables (Qwen3's ``enable_thinking``);
        templates that do not use them ignore them. The loop passes them only when reasoning
        options are configured, so a tokenizer written before they existed keeps working.
        """
        ...


def load_tokenizer(name_or_path: str | None = None) -> Tokenizer:
    """Load a tokenizer by name (blocking; call at setup time).

    Args:
        name_or_path: ``None`` or ``"qwen-offline"`` for the built-in offline Qwen tokenizer; an
            existing directory for an HF tokenizer saved there (``tokenizer.json`` /
            ``tokenizer_config.json``); anything else is an HF hub name (needs network, or a
            local HF cache with ``HF_HUB_OFFLINE=1``).

    Returns:
        A :class:`Tokenizer`.

    Raises:
        ConfigError: The HF path is needed but ``transformers`` is missing (install the
            ``atropos`` extra), or the directory / hub name cannot be loaded.
    """
    if name_or_path is None or name_or_path == QWEN_OFFLINE_NAME:
        return QwenTokenizer()
    from hermes_async.inference.hf import HFTokenizer

    return HFTokenizer.from_pretrained(name_or_path)

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

Layout: the protocols live in ``_tokenizer_base`` (with the base the built-in tokenizers
share), the implementations in ``_qwen`` and :mod:`~hermes_async.inference.hf`, which import it;
this module imports all of them and nothing imports it back, so there is no import circle.
"""

from __future__ import annotations

from hermes_async.inference._qwen import QWEN_OFFLINE_NAME, QwenTokenizer
from hermes_async.inference._tokenizer_base import IncrementalDecoder, Tokenizer
from hermes_async.inference.hf import HFTokenizer

__all__ = (
    "QWEN_OFFLINE_NAME",
    "IncrementalDecoder",
    "QwenTokenizer",
    "Tokenizer",
    "load_tokenizer",
)

# Shown where they are meant to be imported from (they live in private modules).
for _public in (IncrementalDecoder, QwenTokenizer, Tokenizer):
    _public.__module__ = __name__
del _public


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
    return HFTokenizer.from_pretrained(name_or_path)

"""Tokenizer protocol and the two implementations: built-in offline Qwen (tiktoken) and HF.

The loop tokenizes only what it renders, never sampled text, so the protocol is small.
Tokenizers are shared across rollouts; each stream gets its own incremental decoder.
Nothing imports this module back, so there is no import circle.
"""

from __future__ import annotations

from hermes_async.inference._qwen import QWEN_OFFLINE_NAME, QwenTokenizer
from hermes_async.inference._tokenizer_base import IncrementalDecoder, Tokenizer
from hermes_async.inference.families import FamilyTokenizer, is_family_dir
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

    ``None`` or ``"qwen-offline"`` is the built-in tokenizer; a directory is an HF tokenizer
    saved there (a family directory gives a ``FamilyTokenizer``); anything else is an HF hub
    name (network, or a local cache with ``HF_HUB_OFFLINE=1``).

    Raises:
        ConfigError: ``transformers`` is missing (the ``atropos`` extra), or loading failed.
    """
    if name_or_path is None or name_or_path == QWEN_OFFLINE_NAME:
        return QwenTokenizer()
    if is_family_dir(name_or_path):
        return FamilyTokenizer.from_directory(name_or_path)
    return HFTokenizer.from_pretrained(name_or_path)

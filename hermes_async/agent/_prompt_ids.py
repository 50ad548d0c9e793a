"""A rollout's first prompt, encoded once per distinct text instead of once per rollout.

The rollouts of a group share their prompt (the same messages and tool schemas render to the
same text), and encoding it is the costly half of starting a Phase 2 rollout: 3.1 ms for a
3,700-token prompt with 16 tool schemas, against 0.13 ms to render it (Qwen tokenizer, this
2-core box), paid on the event loop's thread by every member of the group. The ids of a
rendered prompt depend only on the tokenizer and the text, so :class:`PromptIds` keeps the last
few as compact arrays and hands the same ids to every rollout whose prompt renders the same.
``bench/prompt_ids.py`` measures it.

What is cached: prompts of at least :data:`MIN_CHARS` characters and at most
:data:`_MAX_CHARS`, for tokenizers that can be referenced weakly (the
cache never keeps a tokenizer alive), keyed by the tokenizer object and the exact text; at most
``max_entries`` of them, least recently used dropped first. The caller gets an ``array('i')``
it must not change: ``Trajectory`` keeps it as its prompt segment, so the rollouts of a group
hold one array between them, and :meth:`PromptIds.share` also hands out the first equal text,
so they hold one prompt string (an 8,900-token prompt: 36 KB of ids and 29 KB of text per
rollout otherwise). Tokenizers' ``encode`` must be a pure function of the text, which every
tokenizer the project ships is.
"""

from __future__ import annotations

import collections
import weakref
from array import array
from collections.abc import Sequence
from typing import Any

from hermes_async.agent._reasoning import TemplateKwargsTokenizer
from hermes_async.inference.tokenizer import Tokenizer

__all__ = ("MIN_CHARS", "PROMPT_IDS", "PromptIds")

#: Shorter prompts are encoded every time (a few microseconds; not worth an entry). A 723-character
#: prompt (one tool schema) takes 28 us to encode and 0.08 us to hash for the lookup.
MIN_CHARS = 256
#: Longer prompts are encoded every time too (an entry must stay small).
_MAX_CHARS = 200_000  # 32 entries: at most ~13 MB (text + ids)


class PromptIds:
    """A small LRU of encoded prompts (see the module docstring).

    Args:
        max_entries: Prompts kept; 0 turns the cache off.

    Attributes:
        hits: Encodings saved so far.
        misses: Prompts encoded (and kept) so far.
    """

    __slots__ = ("_entries", "hits", "max_entries", "misses")

    def __init__(self, max_entries: int = 32) -> None:
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[
            tuple[int, str], tuple[weakref.ref[Any], str, array[int]]
        ] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    def encode(self, tokenizer: Tokenizer, text: str) -> Sequence[int]:
        """``tokenizer.encode(text)``, from the cache when the same tokenizer encoded the same
        text recently."""
        return self.share(tokenizer, text)[1]

    def share(self, tokenizer: Tokenizer, text: str) -> tuple[str, Sequence[int]]:
        """``(text, ids)``: the text as the cache first saw it (an equal string, so that
        equal prompts are held once) and :meth:`encode`'s ids; ``text`` itself when not
        cached."""
        if self.max_entries <= 0 or not MIN_CHARS <= len(text) <= _MAX_CHARS:
            return text, tokenizer.encode(text)
        # The loop's wrapper for chat-template switches encodes with the tokenizer it wraps.
        owner: Any = (
            tokenizer.inner if isinstance(tokenizer, TemplateKwargsTokenizer) else tokenizer
        )
        key = (id(owner), text)
        entries = self._entries
        entry = entries.get(key)
        if entry is not None and entry[0]() is owner:
            entries.move_to_end(key)
            self.hits += 1
            return entry[1], entry[2]
        ids = tokenizer.encode(text)
        try:
            ref = weakref.ref(owner)
        except TypeError:  # not weakly referable: never cached, never kept alive
            return text, ids
        cached = array("i", ids)
        # A dead tokenizer's entry under a reused id is replaced.
        entries[key] = (ref, text, cached)
        self.misses += 1
        while len(entries) > self.max_entries:
            entries.popitem(last=False)
        return text, cached

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        self._entries.clear()


#: The process's cache, used by the token turns.
PROMPT_IDS = PromptIds()

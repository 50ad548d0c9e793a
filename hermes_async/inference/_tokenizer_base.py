"""The tokenizer protocols and the base the built-in tokenizers share.

Apart from the implementations so that ``_qwen.py`` and ``hf.py`` import it and nothing
imports them back; :mod:`hermes_async.inference.tokenizer` re-exports it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

from hermes_async.jsontypes import JSON, JSONObject

__all__ = ("IncrementalDecoder", "Messages", "Tokenizer", "TokenizerBase")

#: Chat messages (OpenAI shape) and tool definitions, as the chat template takes them.
Messages: TypeAlias = Sequence[JSONObject]
_ToolSpecs: TypeAlias = Sequence[JSONObject] | None


@runtime_checkable
class IncrementalDecoder(Protocol):
    """Decodes a token stream piece by piece, UTF-8 safe: a split character comes out whole.

    A decoder whose text always spells special tokens (``<tool_call>``...) may say so with a
    class attribute ``spells_special_tokens = True``: the loop then gives the parser no ids
    to find markers by (``ToolCallParser.feed``).
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
        messages: Messages,
        tools: _ToolSpecs = None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, JSON] | None = None,
    ) -> str:
        """Render ``messages`` (and tool schemas) to the model's prompt text.

        ``chat_template_kwargs`` (Qwen3's ``enable_thinking``) are passed only when reasoning
        options are set, so an older tokenizer keeps working.
        """
        ...


@dataclass(frozen=True, slots=True)
class RenderRequest:
    """What :meth:`TokenizerBase._render` renders: the conversation, the tool schemas, whether
    to open the assistant's turn, and extra template variables (``enable_thinking``)."""

    messages: list[JSONObject]
    tools: list[JSONObject] | None
    generation: bool
    variables: dict[str, JSON]


class TokenizerBase(ABC):
    """What the built-in tokenizers share: name, end-of-turn id, ``repr``, the template call.

    Subclasses implement the rest of :class:`Tokenizer`; rendering goes to :meth:`_render`.
    """

    # __weakref__: caches keyed by a tokenizer never keep it alive (agent/_prompt_ids.py).
    __slots__ = ("__weakref__", "_eos_token_id", "_name")

    def __init__(self, name: str, eos_token_id: int) -> None:
        self._name = name
        self._eos_token_id = eos_token_id

    @property
    def name(self) -> str:
        """A short identifier (hub name, directory, or ``"qwen-offline"``)."""
        return self._name

    @property
    def eos_token_id(self) -> int:
        """End-of-turn id the server stops on (``<|im_end|>`` for ChatML models)."""
        return self._eos_token_id

    @abstractmethod
    def __len__(self) -> int:
        """Vocabulary size including added tokens."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._name!r}, vocab={len(self)})"

    def apply_chat_template(
        self,
        messages: Messages,
        tools: _ToolSpecs = None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, JSON] | None = None,
    ) -> str:
        """Render the conversation with this tokenizer's chat template (text, not ids).

        Raises:
            ValueError: A malformed message list (a ``ConfigError`` when there is no template).
        """
        return self._render(
            RenderRequest(
                list(messages),
                list(tools) if tools else None,
                add_generation_prompt,
                dict(chat_template_kwargs or {}),
            )
        )

    @abstractmethod
    def _render(self, request: RenderRequest) -> str:
        """Render with this tokenizer's template (see :meth:`apply_chat_template`)."""

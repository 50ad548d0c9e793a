"""The tokenizer protocols and the base the built-in tokenizers share.

Kept apart from the implementations so that they import it and nothing imports them back:
``_qwen.py`` and ``hf.py`` build on this module, and the public
:mod:`hermes_async.inference.tokenizer` imports all three (it re-exports the protocols and
:class:`~hermes_async.inference.tokenizer.QwenTokenizer`, and holds ``load_tokenizer``). No
import circle, no import inside a function to hide one.
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
        messages: Messages,
        tools: _ToolSpecs = None,
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

    Subclasses set the name and id in ``__init__`` and implement the rest of
    :class:`Tokenizer`; :meth:`apply_chat_template` hands the rendering to :meth:`_render`.

    Args:
        name: What :attr:`name` reports.
        eos_token_id: What :attr:`eos_token_id` reports.
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

        ``chat_template_kwargs`` become template variables (``enable_thinking``); a template
        without such a switch ignores them.

        Raises:
            ValueError: A malformed message list (a ``ConfigError`` when the tokenizer has no
                template at all).
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

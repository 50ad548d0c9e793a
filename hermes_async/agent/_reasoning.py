"""Reasoning options: how ``thinking_mode`` / ``reasoning_effort`` / ``max_reasoning_tokens``
reach the model.

Pure functions, atroposlib's mapping: Phase 1 sends request fields, Phase 2 sets the chat
template's switch (``enable_thinking``). Details: docs/architecture.md, "Reasoning options".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hermes_async.inference.rendering import chat_template_source
from hermes_async.inference.tokenizer import IncrementalDecoder, Tokenizer
from hermes_async.jsontypes import JSON, JSONObject

__all__ = (
    "TemplateKwargsTokenizer",
    "check_reasoning",
    "reasoning_request_fields",
    "thinking_template_kwargs",
)

#: The effort levels atroposlib accepts.
_REASONING_EFFORTS: tuple[str, ...] = ("none", "minimal", "low", "medium", "high", "xhigh")


def check_reasoning(effort: str | None, max_tokens: int | None) -> None:
    """Validate the options.

    Raises:
        ValueError: An unknown effort, or a budget that is not a positive integer.
    """
    if effort is not None and effort not in _REASONING_EFFORTS:
        raise ValueError(
            f"reasoning_effort {effort!r} is not one of {', '.join(_REASONING_EFFORTS)}"
        )
    if max_tokens is not None and (isinstance(max_tokens, bool) or max_tokens < 1):
        raise ValueError(f"max_reasoning_tokens must be a positive integer, got {max_tokens!r}")


def _reasoning_active(thinking_mode: bool, effort: str | None, max_tokens: int | None) -> bool:
    """Whether reasoning is configured at all (atroposlib's rule)."""
    return bool(thinking_mode) or effort is not None or max_tokens is not None


def reasoning_request_fields(
    thinking_mode: bool,
    effort: str | None,
    max_tokens: int | None,
    *,
    base_url: str | None = None,
) -> dict[str, Any] | None:
    """The Phase 1 ``extra_body`` fields for the options, or ``None`` when not active."""
    if not _reasoning_active(thinking_mode, effort, max_tokens):
        return None
    if base_url and "api.openai.com" in base_url:
        return {"reasoning_effort": effort or "medium"}
    reasoning: dict[str, Any] = {"enabled": True}
    if effort is not None:
        reasoning["effort"] = effort
    elif max_tokens is not None:
        reasoning["max_tokens"] = max_tokens
    return {"reasoning": reasoning}


def thinking_template_kwargs(
    thinking_mode: bool, effort: str | None, max_tokens: int | None
) -> dict[str, JSON]:
    """The Phase 2 chat-template variables for the options (empty when not configured)."""
    if not _reasoning_active(thinking_mode, effort, max_tokens):
        return {}
    return {"enable_thinking": effort != "none"}


class TemplateKwargsTokenizer:
    """A tokenizer whose chat template always gets ``kwargs`` (e.g. ``enable_thinking``).

    The loop wraps once, so the prompt, every suffix and the template check use the same switch.
    """

    __slots__ = ("_inner", "_kwargs")

    def __init__(self, inner: Tokenizer, kwargs: Mapping[str, JSON]) -> None:
        self._inner = inner
        self._kwargs = dict(kwargs)

    @property
    def inner(self) -> Tokenizer:
        return self._inner

    @property
    def chat_template_source(self) -> str | None:
        return chat_template_source(self._inner)

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def eos_token_id(self) -> int:
        return self._inner.eos_token_id

    @property
    def special_tokens(self) -> dict[str, int]:
        return self._inner.special_tokens

    def __len__(self) -> int:
        return len(self._inner)

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        return self._inner.encode(text, allow_special=allow_special)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._inner.decode(token_ids)

    def incremental_decoder(self) -> IncrementalDecoder:
        return self._inner.incremental_decoder()

    def apply_chat_template(
        self,
        messages: Sequence[JSONObject],
        tools: Sequence[JSONObject] | None = None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, JSON] | None = None,
    ) -> str:
        """Render with the wrapped tokenizer, the fixed ``kwargs`` added."""
        merged = {**self._kwargs, **(chat_template_kwargs or {})}
        return self._inner.apply_chat_template(
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=merged,
        )

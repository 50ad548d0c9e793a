"""Incremental chat-template rendering: a growing conversation rendered turn by turn.

:class:`ChatRenderer` returns exactly the full rendering's text, but renders only a window
around the new messages where the template is proven to allow it (:func:`windowed_templates`);
it falls back to a full rendering whenever the window cannot decide the text. Design,
measurements and fallbacks: docs/decisions/035-incremental-rendering.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hermes_async._exports import fixup_module_metadata
from hermes_async.inference._chat_template import default_chat_template
from hermes_async.inference._tokenizer_base import Tokenizer
from hermes_async.inference.families import FAMILIES
from hermes_async.jsontypes import JSON, JSONObject

__all__ = (
    "ChatRenderer",
    "RendererStatistics",
    "WindowRule",
    "chat_template_source",
    "window_rule",
    "windowed_templates",
)


#: Messages a window may hold before its start moves up to the latest anchor. Larger: fewer
#: turns that render the window twice; smaller: shorter renderings. 8 is about four tool turns.
_WINDOW_MESSAGES = 8


@dataclass(frozen=True, slots=True)
class WindowRule:
    """What a template needs for window rendering.

    Attributes:
        call_ids_count_calls: A call without ``native_id`` renders an id counting every earlier
            call (Kimi K2): it needs a full rendering.
        user_rewrites_history: A new ``user`` message changes earlier assistant turns (Qwen3):
            it needs a full rendering.
        tools_in_header: The tool list is rendered in the header only, so windows leave it out.
    """

    name: str
    call_ids_count_calls: bool = False
    user_rewrites_history: bool = False
    tools_in_header: bool = True


def _shipped() -> dict[str, WindowRule]:
    rules = {default_chat_template(): WindowRule("hermes")}
    for fam in FAMILIES.values():
        if fam.template is not None:
            rules[fam.chat_template()] = WindowRule(
                fam.name,
                call_ids_count_calls=fam.name == "kimi_k2",
                user_rewrites_history=fam.name == "qwen3",
            )
    return rules


# Read at import (the family templates are small package files), never on the event loop.
_RULES: Mapping[str, WindowRule] = _shipped()


def windowed_templates() -> Mapping[str, WindowRule]:
    """The template sources proven to render by window, with their rules (the shipped ones)."""
    return dict(_RULES)


def chat_template_source(tokenizer: Tokenizer) -> str | None:
    """The Jinja source ``tokenizer`` renders with, if it says (``None``: render in full)."""
    source = getattr(tokenizer, "chat_template_source", None)
    return source if isinstance(source, str) else None


def window_rule(tokenizer: Tokenizer) -> WindowRule | None:
    """The window rule of ``tokenizer``'s template, or ``None`` (render in full)."""
    source = chat_template_source(tokenizer)
    return _RULES.get(source) if source is not None else None


@dataclass(frozen=True, slots=True)
class RendererStatistics:
    """How a :class:`ChatRenderer`'s renderings were made.

    Attributes:
        full: Renderings of the whole conversation (the first, fallbacks, unruled templates).
        fallbacks: Full renderings made because a window could not decide the text.
    """

    windowed: int
    full: int
    fallbacks: int


class ChatRenderer:
    """Render one growing conversation with ``tokenizer``'s chat template, turn by turn.

    Args:
        tools: The tool schemas, the same on every call.
        incremental: ``False`` renders the whole conversation every time (for comparison).
    """

    __slots__ = (
        "_anchor",
        "_fallbacks",
        "_full",
        "_generation",
        "_messages",
        "_rule",
        "_text",
        "_tokenizer",
        "_tools",
        "_window_start",
        "_window_text",
        "_windowed",
    )

    def __init__(
        self,
        tokenizer: Tokenizer,
        tools: Sequence[JSONObject] | None = None,
        *,
        incremental: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._tools = list(tools) if tools else None
        self._rule = window_rule(tokenizer) if incremental else None
        self._text = ""
        self._generation = False
        # The message objects of the previous rendering (compared by identity) and its anchor.
        self._messages: list[JSONObject] = []
        self._anchor = 0
        # The last window's start and text (rendered with a generation prompt, for the messages
        # of the previous call): the next call's "old" window when it starts there too.
        self._window_start = 0
        self._window_text: str | None = None
        self._windowed = self._full = self._fallbacks = 0

    @property
    def rule(self) -> WindowRule | None:
        """The template's window rule (``None``: every rendering is a full one)."""
        return self._rule

    def statistics(self) -> RendererStatistics:
        return RendererStatistics(self._windowed, self._full, self._fallbacks)

    def share(self, text: str) -> None:
        """Hold ``text`` for the last rendering when equal: a group keeps one prompt string."""
        if text == self._text:
            self._text = text

    def render(
        self,
        messages: Sequence[JSONObject],
        *,
        add_generation_prompt: bool,
        chat_template_kwargs: Mapping[str, JSON] | None = None,
    ) -> str:
        """The template's rendering of ``messages`` (exactly the full rendering's text).

        Args:
            messages: The previous call's messages plus new ones at the end (anything else is
                rendered in full).
            chat_template_kwargs: Extra template variables, the same on every call.

        Raises:
            ValueError: As ``apply_chat_template`` (a malformed message list).
        """
        text = None
        if self._rule is not None and self._generation and len(messages) > len(self._messages):
            text = self._window(messages, add_generation_prompt, chat_template_kwargs)
        if text is None:
            self._window_text = None
            text = self._tokenizer.apply_chat_template(
                messages,
                self._tools,
                add_generation_prompt=add_generation_prompt,
                chat_template_kwargs=chat_template_kwargs,
            )
            self._full += 1
            start = 0
        else:
            self._windowed += 1
            start = len(self._messages)
        if self._rule is not None:
            self._remember(messages, start)
        self._generation = add_generation_prompt
        self._text = text
        return text

    def _remember(self, messages: Sequence[JSONObject], start: int) -> None:
        """Keep the messages and their anchor: the last non-``tool`` message after the first."""
        anchor = self._anchor if start else 0
        for index in range(max(start, 1), len(messages)):
            if messages[index].get("role") != "tool":
                anchor = index
        self._anchor = anchor
        self._messages = list(messages)

    def _window(
        self,
        messages: Sequence[JSONObject],
        generation: bool,
        variables: Mapping[str, JSON] | None,
    ) -> str | None:
        """The rendering from a window, or ``None`` when only a full one can decide it."""
        assert self._rule is not None
        seen = self._messages
        k, anchor = len(seen), max(self._anchor, 1)
        if any(a is not b for a, b in zip(seen, messages, strict=False)):
            return None
        new_messages = messages[k:]
        if self._rule.call_ids_count_calls and _has_unnamed_call(new_messages):
            return None
        if self._rule.user_rewrites_history and any(m.get("role") == "user" for m in new_messages):
            return None
        head = list(messages[:1])
        render = self._tokenizer.apply_chat_template
        tools = None if self._rule.tools_in_header else self._tools
        # Any start that is not a tool result works; keeping the previous one lets its rendering
        # serve as this call's "old" window (one rendering a turn instead of two), until the
        # window holds WINDOW_MESSAGES messages: then it moves up to the latest anchor.
        old = self._window_text
        start = self._window_start
        if old is None or len(messages) - start > _WINDOW_MESSAGES:
            start = anchor
            old = render(
                [*head, *messages[start:k]],
                tools,
                add_generation_prompt=True,
                chat_template_kwargs=variables,
            )
        new = render(
            [*head, *messages[start:]],
            tools,
            add_generation_prompt=generation,
            chat_template_kwargs=variables,
        )
        if not new.startswith(old):
            self._fallbacks += 1
            return None
        self._window_start = start
        self._window_text = new if generation else None
        return self._text + new[len(old) :]


def _has_unnamed_call(messages: Sequence[JSONObject]) -> bool:
    for message in messages:
        for call in message.get("tool_calls") or ():
            if not isinstance(call, dict) or not isinstance(call.get("native_id"), str):
                return True
    return False


fixup_module_metadata(__name__, globals())

"""The project's ChatML + hermes ``<tool_call>`` chat template and a sandboxed Jinja2 renderer.

The renderer mirrors transformers' ``apply_chat_template`` environment. Invariant: for an
assistant message ``messages[k]``, ``render(messages[:k], add_generation_prompt=True)`` is
a prefix of ``render(messages)``. The text contract: docs/architecture.md.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import NoReturn

import jinja2
import jinja2.ext
import jinja2.sandbox

from hermes_async.errors import ConfigError
from hermes_async.inference._chatml import render_builtin
from hermes_async.jsontypes import JSON, JSONObject

__all__ = [
    "ASSISTANT_TURN_END",
    "GENERATION_PROMPT",
    "TURN_SEPARATOR",
    "default_chat_template",
    "render_chat_template",
]

#: Text the built-in template puts at the start of the model's turn.
GENERATION_PROMPT = "<|im_start|>assistant\n"
#: Text that ends every turn, assistant turns included.
ASSISTANT_TURN_END = "<|im_end|>\n"
#: Text between an assistant turn's ``<|im_end|>`` and the next ``<|im_start|>``.
TURN_SEPARATOR = "\n"


# Read at import (a small package file), so that no rollout reads it on the event loop.
_DEFAULT_TEMPLATE = (
    resources.files("hermes_async.inference")
    .joinpath("chat_template.jinja")
    .read_text(encoding="utf-8")
)


def default_chat_template() -> str:
    """The built-in ChatML + hermes ``<tool_call>`` template's Jinja source."""
    return _DEFAULT_TEMPLATE


def _tojson(
    value: JSON,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Same signature and output as transformers' chat-template ``tojson`` (no HTML escaping,
    # unlike Jinja's built-in filter), so both render identical tool lists.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


@functools.cache
def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
        undefined=jinja2.Undefined,
        autoescape=False,
        keep_trailing_newline=False,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(
            f"chat template does not compile: {exc.message} (line {exc.lineno}); "
            "fix the template or use the built-in one"
        ) from exc


def render_chat_template(
    messages: Sequence[JSONObject],
    tools: Sequence[JSONObject] | None = None,
    *,
    add_generation_prompt: bool = True,
    template: str | None = None,
    variables: Mapping[str, JSON] | None = None,
) -> str:
    """Render OpenAI-style ``messages`` (and tool schemas) with a chat template.

    Args:
        tools: Listed in the system turn; ``None`` or empty: no tool section.
        template: Jinja source; ``None`` uses the built-in template.
        variables: Extra template variables (e.g. ``bos_token``).

    Raises:
        ConfigError: The template does not compile.
        ValueError: Rendering failed (a malformed message, or ``raise_exception``).
    """
    if template is None or template == _DEFAULT_TEMPLATE:
        # The built-in template, written out in Python (exactly its text; ``None`` for a
        # message shape it leaves to Jinja). The template uses no extra variables.
        text = render_builtin(messages, list(tools) if tools else None, add_generation_prompt)
        if text is not None:
            return text
    compiled = _compile(default_chat_template() if template is None else template)
    context: dict[str, JSON] = dict(variables or {})
    context.update(
        messages=list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
    )
    try:
        return compiled.render(**context)
    except jinja2.TemplateError as exc:
        raise ValueError(f"chat template rendering failed: {exc}") from exc
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"chat template rendering failed on a malformed message list ({exc!r}); "
            "every message needs a 'role' and a 'content'"
        ) from exc

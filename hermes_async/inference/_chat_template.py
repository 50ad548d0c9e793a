"""The project's ChatML + hermes ``<tool_call>`` chat template and a sandboxed Jinja2 renderer.

The template text lives in ``chat_template.jinja`` next to this module (it is also written into
the ``tokenizer_config.json`` of the HF tokenizer directory, so transformers renders the same
text). The renderer mirrors the Jinja environment of transformers' ``apply_chat_template``
(an ``ImmutableSandboxedEnvironment`` with ``trim_blocks``, ``lstrip_blocks``, the
``loopcontrols`` extension, a ``tojson`` filter that does *not* HTML-escape and keeps non-ASCII
characters, and ``raise_exception``), so any HF-style template renders the same here and there.

Text contract of the built-in template (what the agent loop relies on)
----------------------------------------------------------------------

Every turn is ``<|im_start|>{role}\\n{body}<|im_end|>\\n``. Literally::

    <|im_start|>system
    {system content}\\n\\n# Tools ... <tools>\\n{tool JSON}\\n...</tools> ... </tool_call><|im_end|>
    <|im_start|>user
    {user content}<|im_end|>
    <|im_start|>assistant
    I'll look.
    <tool_call>
    {"name": "terminal", "arguments": {"command": "ls"}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    {first tool result}
    </tool_response>
    <tool_response>
    {second tool result}
    </tool_response><|im_end|>
    <|im_start|>assistant
    {generation starts here}

- **System turn**: rendered when the first message is a system message or tools are given; the
  tool list (each tool object as given, one ``tojson`` line) follows the system content after a
  blank line. No default system prompt is invented.
- **Assistant turn**: ``<|im_start|>assistant\\n`` + optional reasoning + content + tool calls +
  ``<|im_end|>\\n``. Each tool call is ``<tool_call>\\n{"name": <json string>, "arguments":
  <arguments>}\\n</tool_call>``; the arguments string of an OpenAI message is inserted verbatim
  (a dict is ``tojson``-ed); calls are separated from the content and from each other by one
  ``\\n`` (no separator when the content is empty and it is the first call). A tool call that
  carries a string ``raw`` (the agent loop's Phase 2 messages: the call's JSON exactly as the
  model wrote it, e.g. compact ``{"name":"t","arguments":{}}``) renders as
  ``<tool_call>\\n{raw}\\n</tool_call>``, so the rendering is the model's own text.
- **Separator after an assistant turn**: exactly ``"\\n"`` follows the assistant's
  ``<|im_end|>``, then the next turn's ``<|im_start|>``. So after the model stopped on
  ``<|im_end|>`` (id 151645, included in the sampled ids), the loop's suffix text for the next
  turn is ``"\\n" + <next turns> + "<|im_start|>assistant\\n"`` -- exactly
  ``render(messages)[len(render(messages[:k])):]`` and the generation prompt. Because special
  tokens are hard boundaries for the tokenizer, ``encode(prefix) + encode(suffix) ==
  encode(prefix + suffix)`` whenever the cut is right after ``<|im_end|>``. If the model stopped
  for another reason (length), its ids do not end with ``<|im_end|>`` and the loop must add it.
- **Tool results**: consecutive ``tool`` messages are grouped into ONE user turn, each as
  ``\\n<tool_response>\\n{content}\\n</tool_response>``; the turn closes with ``<|im_end|>\\n``
  after the last tool message of the run.
- **Reasoning**: an assistant message with a non-empty string ``reasoning_content`` renders
  ``<think>\\n{reasoning stripped of leading/trailing newlines}\\n</think>\\n\\n`` before its content
  (content's leading newlines stripped) -- the Qwen3 layout. Unlike Qwen3's own template it is
  kept in *every* assistant turn, never dropped from older turns: dropping it would break the
  prefix property below.
- **Prefix property**: for every ``k`` where ``messages[k]`` is an assistant message,
  ``render(messages[:k], add_generation_prompt=True)`` is a prefix of ``render(messages)``.
- Content may be a string, ``None``, or a list of ``{"type": "text", "text": ...}`` parts
  (joined without separator; other part types are dropped).
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
        messages: ``{"role", "content", "tool_calls"?, "reasoning_content"?}`` dicts.
        tools: Tool schemas (OpenAI ``{"type": "function", "function": {...}}`` objects), listed
            in the system turn; ``None`` or empty renders no tool section.
        add_generation_prompt: Append ``<|im_start|>assistant\\n`` for the model's turn.
        template: Jinja source; ``None`` uses the built-in template.
        variables: Extra template variables (e.g. ``bos_token``).

    Returns:
        The prompt text.

    Raises:
        ConfigError: The template does not compile.
        ValueError: Rendering failed (a malformed message, or ``raise_exception`` called).
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

"""Shared test helpers: render calls per format, stream at any split, compare ignoring ids."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence

from hermes_async.jsontypes import JSONObject
from hermes_async.parsers import (
    ArgumentsDelta,
    ContentDelta,
    ParseResult,
    ParserEvent,
    ToolCallInvalid,
    ToolCallSealed,
    ToolCallStart,
    ToolCallTruncated,
    get_parser,
    list_parsers,
)

ALL_NAMES = list_parsers()

DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"


def _dump(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _xml_value(value: object) -> str:
    return value if isinstance(value, str) else _dump(value)


def render_hermes(name: str, args: JSONObject) -> str:
    return "<tool_call>" + _dump({"name": name, "arguments": args}) + "</tool_call>"


def render_longcat(name: str, args: JSONObject) -> str:
    return "<longcat_tool_call>" + _dump({"name": name, "arguments": args}) + "</longcat_tool_call>"


def render_mistral(name: str, args: JSONObject) -> str:
    return "[TOOL_CALLS]" + name + _dump(args)


def render_llama(name: str, args: JSONObject) -> str:
    return " " + _dump({"name": name, "parameters": args}) + " "


def render_qwen3_coder(name: str, args: JSONObject) -> str:
    params = "".join(f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def render_deepseek_v3(name: str, args: JSONObject) -> str:
    return (
        f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n{_dump(args)}\n```"
        f"{DS_CALL_END}{DS_CALLS_END}"
    )


def render_deepseek_v3_1(name: str, args: JSONObject) -> str:
    return f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}{name}{DS_SEP}{_dump(args)}{DS_CALL_END}{DS_CALLS_END}"


def render_deepseek_v4(name: str, args: JSONObject) -> str:
    return (
        "<｜DSML｜tool_calls_begin｜>\n<｜DSML｜tool_call_begin｜>"
        f"{name}\n```json\n{_dump(args)}\n```\n<｜DSML｜tool_call_end｜>\n<｜DSML｜tool_calls_end｜>"
    )


def render_kimi(name: str, args: JSONObject) -> str:
    return (
        "<|tool_calls_section_begin|><|tool_call_begin|>"
        f"functions.{name}:0<|tool_call_argument_begin|>{_dump(args)}"
        "<|tool_call_end|><|tool_calls_section_end|>"
    )


def render_glm(name: str, args: JSONObject) -> str:
    pairs = "".join(
        f"<arg_key>{k}</arg_key><arg_value>{_xml_value(v)}</arg_value>\n" for k, v in args.items()
    )
    return f"<tool_call>{name}\n{pairs}</tool_call>"


RENDER: dict[str, Callable[[str, JSONObject], str]] = {
    "hermes": render_hermes,
    "qwen": render_hermes,
    "longcat": render_longcat,
    "mistral": render_mistral,
    "llama3_json": render_llama,
    "llama4_json": render_llama,
    "qwen3_coder": render_qwen3_coder,
    "deepseek_v3": render_deepseek_v3,
    "deepseek_v3_1": render_deepseek_v3_1,
    "deepseek_v31": render_deepseek_v3_1,
    "deepseek_v4": render_deepseek_v4,
    "deepseek_dsml": render_deepseek_v4,
    "kimi_k2": render_kimi,
    "glm45": render_glm,
    "glm47": render_glm,
}

#: Marker spellings and fragments per format, used to salt random text with near-misses.
ATOMS: dict[str, list[str]] = {
    "hermes": ["<tool_call>", "</tool_call>", "{", '"name"', "}"],
    "longcat": ["<longcat_tool_call>", "</longcat_tool_call>", "{", "}"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[", "]", "{", "}"],
    "llama3_json": ["<|python_tag|>", "{", "}", '{"name": "x", "parameters": ', ";"],
    "qwen3_coder": [
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "</function>",
        "<parameter=",
        "</parameter>",
        ">",
    ],
    "deepseek_v3": [DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP, "```json\n"],
    "deepseek_v4": [
        "<｜DSML｜tool_calls_begin｜>",
        "<｜DSML｜tool_call_begin｜>",
        "< | DSML | tool_call_end >",
        "<|DSML|tool_calls_end|>",
        "```",
    ],
    "kimi_k2": [
        "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<|tool_calls_section_end|>",
    ],
    "glm45": [
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    ],
}
ATOMS["qwen"] = ATOMS["hermes"]
ATOMS["llama4_json"] = ATOMS["llama3_json"]
ATOMS["deepseek_v3_1"] = ATOMS["deepseek_v31"] = ATOMS["deepseek_v3"]
ATOMS["deepseek_dsml"] = ATOMS["deepseek_v4"]
ATOMS["glm47"] = ATOMS["glm45"]
for _name in ATOMS:
    ATOMS[_name] = [*ATOMS[_name], "<think>", "</think>"]


def call_key(result: ParseResult) -> tuple[object, ...]:
    """Everything in a result except the random ids."""
    return (
        result.content,
        [(c.index, c.name, c.arguments, c.native_id, c.type) for c in result.tool_calls or []],
        [(c.index, c.name, c.raw, c.reason) for c in result.invalid_calls],
        [(c.index, c.name, c.raw) for c in result.truncated_calls],
        result.tool_calls is None,
    )


def normalize(events: Iterable[ParserEvent]) -> list[tuple[object, ...]]:
    """Events without ids, adjacent content / argument fragments merged."""
    out: list[tuple[object, ...]] = []
    for event in events:
        if isinstance(event, ContentDelta):
            if out and out[-1][0] == "content" and out[-1][2] == event.reasoning:
                out[-1] = ("content", str(out[-1][1]) + event.text, event.reasoning)
            else:
                out.append(("content", event.text, event.reasoning))
        elif isinstance(event, ArgumentsDelta):
            if out and out[-1][0] == "args" and out[-1][1] == event.index:
                out[-1] = ("args", event.index, str(out[-1][2]) + event.fragment)
            else:
                out.append(("args", event.index, event.fragment))
        elif isinstance(event, ToolCallStart):
            out.append(("start", event.index, event.name))
        elif isinstance(event, ToolCallSealed):
            out.append(("sealed", event.index, event.name, event.arguments, event.native_id))
        elif isinstance(event, ToolCallInvalid):
            out.append(("invalid", event.index, event.name, event.raw, event.reason))
        elif isinstance(event, ToolCallTruncated):
            out.append(("truncated", event.index, event.name, event.raw))
    return out


def check_ids(events: Sequence[ParserEvent]) -> None:
    """Every index has one id; ids are unique across indices."""
    by_index: dict[int, str] = {}
    for event in events:
        if isinstance(event, ContentDelta | ArgumentsDelta):
            continue
        assert by_index.setdefault(event.index, event.id) == event.id
    assert len(set(by_index.values())) == len(by_index)


def stream(
    name: str,
    chunks: Iterable[str | tuple[str, Sequence[int]]],
    *,
    tools: Sequence[JSONObject] | None = None,
    tokenizer: object = None,
) -> tuple[list[ParserEvent], ParseResult]:
    parser = get_parser(name, tools=tools, tokenizer=tokenizer)  # type: ignore[arg-type]
    events: list[ParserEvent] = []
    for chunk in chunks:
        if isinstance(chunk, tuple):
            events += parser.feed(chunk[0], chunk[1])
        else:
            events += parser.feed(chunk)
    result = parser.finish()
    events += result.final_events
    check_ids(events)
    return events, result


def split_at(text: str, cuts: Iterable[int]) -> list[str]:
    points = sorted({c for c in cuts if 0 < c < len(text)})
    pieces, last = [], 0
    for point in points:
        pieces.append(text[last:point])
        last = point
    pieces.append(text[last:])
    return pieces


def assert_invariant(
    name: str, text: str, cuts: Iterable[int] = (), tools: Sequence[JSONObject] | None = None
) -> ParseResult:
    """parse(text) == streaming at the given cuts == streaming one character at a time."""
    whole_events, whole = stream(name, [text], tools=tools)
    expected_events = normalize(whole_events)
    assert call_key(get_parser(name, tools=tools).parse(text)) == call_key(whole)
    for chunks in (split_at(text, cuts), list(text)):
        events, result = stream(name, chunks, tools=tools)
        assert call_key(result) == call_key(whole), chunks
        assert normalize(events) == expected_events, chunks
    return whole


class FakeTokenizer:
    """Specials get small ids; every other character is its own token (10_000 + code point)."""

    def __init__(self, specials: Sequence[str]) -> None:
        self.special_tokens = {s: i + 1 for i, s in enumerate(dict.fromkeys(specials))}
        self._by_id = {i: s for s, i in self.special_tokens.items()}
        ordered = sorted(self.special_tokens, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(s) for s in ordered))

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._by_id.get(i) or chr(i - 10_000) for i in ids)

    def tokens(self, text: str) -> list[tuple[str, list[int]]]:
        """(text, [id]) per token: specials whole, other characters one by one."""
        out: list[tuple[str, list[int]]] = []
        last = 0
        for m in self._pattern.finditer(text):
            out += [(c, [10_000 + ord(c)]) for c in text[last : m.start()]]
            out.append((m.group(), [self.special_tokens[m.group()]]))
            last = m.end()
        out += [(c, [10_000 + ord(c)]) for c in text[last:]]
        return out

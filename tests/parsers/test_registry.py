"""Registry, result shapes and the engine's public contract."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermes_async.errors import ConfigError, UnknownParserError
from hermes_async.parsers import (
    ContentDelta,
    ParseResult,
    ToolCall,
    ToolCallParser,
    ToolCallSealed,
    get_parser,
    list_parsers,
)
from tests.parsers.helpers import ALL_NAMES, RENDER, FakeTokenizer, stream

EXPECTED_NAMES = [
    "deepseek_dsml",
    "deepseek_v3",
    "deepseek_v31",
    "deepseek_v3_1",
    "deepseek_v4",
    "glm45",
    "glm47",
    "hermes",
    "kimi_k2",
    "llama3_json",
    "llama4_json",
    "longcat",
    "mistral",
    "qwen",
    "qwen3_coder",
]


def test_registered_names_are_the_reference_ones_plus_deepseek_v4() -> None:
    assert list_parsers() == EXPECTED_NAMES


@pytest.mark.parametrize("catch", [KeyError, ConfigError, UnknownParserError])
def test_unknown_name_lists_the_available_ones(catch: type[Exception]) -> None:
    # A ConfigError (operator mistake) that reference code, which catches KeyError, still sees.
    with pytest.raises(
        catch,
        match=r"unknown tool-call parser 'hermez'; available: deepseek_dsml, .*qwen3_coder; "
        r"register another with @hermes_async.parsers.register_parser",
    ) as info:
        get_parser("hermez")
    assert isinstance(info.value, UnknownParserError)
    assert info.value.name == "hermez" and info.value.available == tuple(EXPECTED_NAMES)


def test_each_call_returns_a_fresh_parser() -> None:
    first, second = get_parser("hermes"), get_parser("hermes")
    assert first is not second
    first.feed("<tool_call>")
    assert second.parse("plain") == ParseResult("plain", None)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_plain_text_is_returned_unchanged_with_no_calls(name: str) -> None:
    text = "Just an answer.\n  With spacing and <b>tags</b>.  "
    content, calls = get_parser(name).parse(text)
    assert (content, calls) == (text, None)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_calls_are_openai_shaped_with_unique_ids(name: str) -> None:
    text = "Sure." + RENDER[name]("terminal", {"command": "ls"}) + RENDER[name]("ping", {})
    result = get_parser(name).parse(text)
    assert result.content == "Sure."
    assert result.tool_calls is not None
    assert [
        (c.type, c.function.name, json.loads(c.function.arguments)) for c in result.tool_calls
    ] == [
        ("function", "terminal", {"command": "ls"}),
        ("function", "ping", {}),
    ]
    ids = [c.id for c in result.tool_calls]
    assert len(set(ids)) == 2
    other = get_parser(name).parse(text).tool_calls
    assert other is not None and not set(ids) & {c.id for c in other}
    assert result.tool_calls[0].to_dict() == {
        "id": ids[0],
        "type": "function",
        "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
    }


def test_ids_have_the_documented_shapes() -> None:
    (call,) = get_parser("hermes").parse(RENDER["hermes"]("ping", {})).tool_calls or []
    assert call.id.startswith("call_") and len(call.id) == 5 + 24
    (call,) = get_parser("mistral").parse(RENDER["mistral"]("ping", {})).tool_calls or []
    assert len(call.id) == 9 and call.id.isalnum()


def test_feed_after_finish_is_a_programming_error() -> None:
    parser = get_parser("hermes")
    parser.feed("hello")
    result = parser.finish()
    assert parser.finish() is result
    with pytest.raises(ValueError, match=r"feed\(\) after finish\(\) on a 'hermes' parser"):
        parser.feed("more")


def test_events_and_results_are_frozen_and_slotted() -> None:
    event = ContentDelta("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.text = "y"  # type: ignore[misc]
    assert not hasattr(event, "__dict__")
    call = ToolCallSealed(0, "call_x", "ping", "{}")
    assert isinstance(call.call, ToolCall) and call.call.name == "ping"
    assert not hasattr(ParseResult(None, None), "__dict__")


def test_sealed_event_carries_everything_needed_to_dispatch() -> None:
    parser = get_parser("hermes")
    events = parser.feed('<tool_call>{"name": "terminal", "arguments": {"command": "ls"}}')
    sealed = [e for e in events if isinstance(e, ToolCallSealed)]
    assert [(e.index, e.name, e.arguments) for e in sealed] == [
        (0, "terminal", '{"command": "ls"}')
    ]
    assert sealed[0].id.startswith("call_")
    final = parser.finish()
    assert final.tool_calls is not None and final.tool_calls[0].id == sealed[0].id


def test_parse_does_not_touch_the_streaming_state() -> None:
    parser = get_parser("hermes")
    parser.feed("<tool_call>{")
    assert parser.parse("x").content == "x"
    parser.feed('"name": "a", "arguments": {}}</tool_call>')
    assert [c.name for c in parser.finish().tool_calls or []] == ["a"]


def test_held_back_text_stays_shorter_than_a_marker() -> None:
    # Linear work: each feed scans its chunk plus at most a marker's length of old text.
    parser = get_parser("kimi_k2")
    text = "x" * 50 + RENDER["kimi_k2"]("ping", {"data": "y" * 5000}) + "z" * 50
    longest = len("<|tool_calls_section_begin|>")
    for ch in text:
        parser.feed(ch)
        assert len(parser._held) < longest
    assert parser.finish().tool_calls is not None


def test_special_id_with_empty_text_is_recognized() -> None:
    tokenizer = FakeTokenizer(["<tool_call>", "</tool_call>"])
    chunks = [("Hi", [10_000 + ord("H"), 10_000 + ord("i")]), ("", [1])]
    chunks += [(c, [10_000 + ord(c)]) for c in '{"name": "ping", "arguments": {}}']
    chunks += [("", [2]), ("!", [10_000 + ord("!")])]
    events, result = stream("hermes", chunks, tokenizer=tokenizer)
    assert [c.name for c in result.tool_calls or []] == ["ping"]
    assert result.content == "Hi\n!"
    assert all("tool_call" not in e.text for e in events if isinstance(e, ContentDelta))


def test_parser_type_is_public() -> None:
    assert isinstance(get_parser("glm47"), ToolCallParser)
    assert get_parser("qwen").name == "hermes"


# ------------------------------------------------------------------ user parsers (reference API)


@pytest.fixture
def registry() -> Iterator[dict[str, type[ToolCallParser]]]:
    """PARSER_REGISTRY, restored after the test."""
    from hermes_async.parsers import PARSER_REGISTRY

    saved = dict(PARSER_REGISTRY)
    yield PARSER_REGISTRY
    PARSER_REGISTRY.clear()
    PARSER_REGISTRY.update(saved)


def test_registry_maps_names_to_classes_like_the_reference(
    registry: dict[str, type[ToolCallParser]],
) -> None:
    from hermes_async.parsers import PARSER_REGISTRY, get_parser

    assert sorted(PARSER_REGISTRY) == EXPECTED_NAMES
    assert all(issubclass(cls, ToolCallParser) for cls in PARSER_REGISTRY.values())
    assert PARSER_REGISTRY["qwen"] is PARSER_REGISTRY["hermes"]
    assert PARSER_REGISTRY["hermes"].__name__ == "HermesParser"
    # The reference constructed a registry class with no arguments.
    parser = PARSER_REGISTRY["mistral"]()
    assert parser.name == "mistral"
    assert type(get_parser("deepseek_v31")) is PARSER_REGISTRY["deepseek_v3_1"]


def test_a_user_parser_joins_the_registry_with_stacked_aliases(
    registry: dict[str, type[ToolCallParser]],
) -> None:
    from hermes_async.parsers import (
        PARSER_REGISTRY,
        Format,
        JsonCallSpec,
        get_parser,
        list_parsers,
        register_parser,
    )

    @register_parser("my_format")
    @register_parser("my_format_alias")
    class MyParser(ToolCallParser):
        FORMAT = Format(
            name="my_format", call_open=("<call>",), body=JsonCallSpec(close=("</call>",))
        )

    assert PARSER_REGISTRY["my_format"] is MyParser is PARSER_REGISTRY["my_format_alias"]
    assert {"my_format", "my_format_alias"} <= set(list_parsers())
    text = 'Sure.<call>{"name": "ping", "arguments": {"n": 1}}</call> done'
    for name in ("my_format", "my_format_alias"):
        whole = get_parser(name).parse(text)
        assert isinstance(get_parser(name), MyParser)
        assert whole.content == "Sure.\ndone"
        assert [(c.name, c.arguments) for c in whole.tool_calls or []] == [("ping", '{"n": 1}')]
        _, streamed = stream(name, list(text))
        assert [(c.name, c.arguments) for c in streamed.tool_calls or []] == [("ping", '{"n": 1}')]


class _ReferenceStyle(ToolCallParser):
    """How a reference parser looked: parse() by hand, no format."""

    def parse(self, text: str) -> ParseResult:
        return ParseResult(text, None)


class _NoFormat(ToolCallParser):
    pass


class _NeedsArg(ToolCallParser):
    from hermes_async.parsers.hermes import HERMES as FORMAT

    def __init__(self, required: int) -> None:
        super().__init__()


def _format_with(**changes: object) -> object:
    from hermes_async.parsers.hermes import HERMES

    return dataclasses.replace(HERMES, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda: _ReferenceStyle, r"_ReferenceStyle overrides parse\(\)"),
        (lambda: _NoFormat, r"_NoFormat.FORMAT is None, not a Format"),
        (lambda: object, r"<class 'object'> is not a ToolCallParser subclass"),
        (lambda: _NeedsArg, r"_NeedsArg\(tools=..., tokenizer=...\) must work"),
        (
            lambda: type("Bad", (ToolCallParser,), {"FORMAT": _format_with(body=object())}),
            r"does not implement new\(sink\) -> Body and spellings\(\)",
        ),
        (
            lambda: type("Bad", (ToolCallParser,), {"FORMAT": _format_with(call_open=("",))}),
            r"needs call_open markers, and no marker may be empty",
        ),
    ],
    ids=["parse-only", "no-format", "not-a-parser", "constructor", "bad-body", "empty-marker"],
)
def test_a_class_outside_the_engine_contract_is_refused_at_registration(
    registry: dict[str, type[ToolCallParser]], make: Callable[[], type], problem: str
) -> None:
    from hermes_async.parsers import register_parser

    with pytest.raises(TypeError, match=problem) as info:
        register_parser("broken")(make())
    # The message says what to write instead.
    assert "cannot register 'broken'" in str(info.value)
    assert "FORMAT = Format(" in str(info.value) and "feed(text) + finish()" in str(info.value)
    assert "broken" not in registry


def test_register_parser_needs_a_name() -> None:
    from hermes_async.parsers import register_parser

    with pytest.raises(TypeError, match="needs a non-empty name string, got ''"):
        register_parser("")


def test_a_body_that_never_consumes_cannot_hang_or_raise(
    registry: dict[str, type[ToolCallParser]],
) -> None:
    """The engine, not the body, guarantees progress (a user format may bring its own body)."""
    from hermes_async.parsers import Format, register_parser
    from hermes_async.parsers._bodies import Body, CallSink

    class Stuck(Body):
        def consume(self, s: str, i: int, eof: bool) -> int:
            return i  # never consumes, never changes state

        def at_eof(self) -> None:
            self.done = True

    @dataclasses.dataclass(frozen=True)
    class StuckSpec:
        def new(self, sink: CallSink) -> Body:
            sink.begin()
            return Stuck(sink, (), 0)

        def spellings(self) -> tuple[str, ...]:
            return ()

    @register_parser("stuck")
    class StuckParser(ToolCallParser):
        FORMAT = Format(name="stuck", call_open=("<go>",), body=StuckSpec())

    text = "a<go>xyz<go>!"
    whole = get_parser("stuck").parse(text)
    _, streamed = stream("stuck", list(text))
    for result in (whole, streamed):
        # Each stuck call is abandoned as invalid and its next character is content.
        assert result.content == "a\nxyz\n!"
        assert [c.reason for c in result.invalid_calls] == [
            "the parser could not read this call"
        ] * 2


def test_parsers_import_neither_the_inference_layer_nor_http() -> None:
    """The parsers' own imports, with the root package's eager re-exports stubbed out."""
    code = textwrap.dedent(
        """
        import importlib.util, sys, types
        spec = importlib.util.find_spec("hermes_async")
        root = types.ModuleType("hermes_async")
        root.__path__ = list(spec.submodule_search_locations)
        sys.modules["hermes_async"] = root
        import hermes_async.parsers
        assert hermes_async.parsers.get_parser("hermes").parse("x").content == "x"
        print(" ".join(sorted(sys.modules)))
        """
    )
    loaded = _run(code)
    assert "hermes_async.parsers" in loaded
    assert not _forbidden(loaded)


def test_importing_hermes_async_parsers_leaves_http_unloaded() -> None:
    assert not _forbidden(_run("import sys, hermes_async.parsers; print(' '.join(sys.modules))"))


def _run(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    return set(out.stdout.split())


def _forbidden(modules: set[str]) -> list[str]:
    """HTTP libraries, the async stack, and the inference layer (its HTTP modules included)."""
    roots = {
        "httpx",
        "httpcore",
        "h11",
        "httptools",
        "orjson",
        "anyio",
        "sniffio",
        "jinja2",
        "tiktoken",
    }
    return sorted(
        m for m in modules if m.split(".")[0] in roots or m.startswith("hermes_async.inference")
    )

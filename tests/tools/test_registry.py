from __future__ import annotations

import functools
import json
import random

import anyio
import pytest

from hermes_async.errors import ConfigError, ToolArgumentsError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools._arguments import coerce_arguments, decode_arguments
from hermes_async.tools.registry import (
    Tool,
    ToolRegistry,
    ToolRuntime,
    builtin_registry,
    dispatch,
    get_tool_definitions,
)
from hermes_async.tools.toolsets import (
    DISTRIBUTIONS,
    TOOLSETS,
    resolve_toolsets,
    sample_toolsets_from_distribution,
)

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]

SCHEMA: JSONObject = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1},
        "x": {"type": "number"},
        "flag": {"type": "boolean"},
        "paths": {"type": "array", "items": {"type": "string"}},
        "opts": {"type": "object", "properties": {"depth": {"type": "integer"}}},
        "name": {"type": "string"},
        "maybe": {"type": ["integer", "null"]},
    },
    "required": ["name"],
}


async def _echo(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    return {"args": args, "task_id": runtime.task_id}


async def _boom(args: JSONObject, runtime: ToolRuntime) -> str:
    raise RuntimeError("kaput")


async def _slow(args: JSONObject, runtime: ToolRuntime) -> str:
    await anyio.sleep(10)
    return "never"


def _registry() -> ToolRegistry:
    return ToolRegistry(
        [
            Tool("echo", "Echo.", SCHEMA, _echo, toolset="terminal"),
            Tool("boom", "Raises.", {"type": "object", "properties": {}}, _boom, "terminal"),
            Tool("slow", "Sleeps.", {"type": "object", "properties": {}}, _slow, "terminal"),
        ]
    )


# ---------------------------------------------------------------- toolsets and definitions


def test_reference_toolsets() -> None:
    assert TOOLSETS["terminal"].tools == ("terminal", "process")
    assert TOOLSETS["file"].tools == ("read_file", "write_file", "patch", "search_files")
    assert TOOLSETS["web"].tools == ("web_search", "web_extract")
    assert TOOLSETS["todo"].tools == ("todo",)
    assert set(resolve_toolsets(["debugging"])) == {
        "terminal",
        "process",
        "web_search",
        "web_extract",
        "read_file",
        "write_file",
        "patch",
        "search_files",
    }
    assert resolve_toolsets(["terminal_tools"]) == ["terminal", "process"]
    assert resolve_toolsets(["debugging"], ["web"]) == [
        "terminal",
        "process",
        "read_file",
        "write_file",
        "patch",
        "search_files",
    ]


def test_unknown_toolset_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown toolset 'termnal'; valid toolsets: .*terminal"):
        get_tool_definitions(["termnal"])
    with pytest.raises(ValueError, match="unknown toolset 'nope'"):
        get_tool_definitions(None, ["nope"])


def test_definitions_only_registered_tools() -> None:
    defs = get_tool_definitions(["todo", "vision"])
    assert defs.valid_names == {"todo"}
    assert [s["function"]["name"] for s in defs.schemas] == ["todo"]
    _schemas, names = defs  # unpacks like a tuple
    assert names == {"todo"}
    assert "todo" in builtin_registry()


def test_unavailable_tool_left_out() -> None:
    reg = ToolRegistry(
        [Tool("echo", "Echo.", SCHEMA, _echo, toolset="terminal", available=lambda: False)]
    )
    assert reg.definitions(["terminal"]).valid_names == set()
    with pytest.raises(ValueError, match="already registered"):
        reg.register(Tool("echo", "Echo.", SCHEMA, _echo, toolset="terminal"))


@pytest.mark.parametrize(
    ("parameters", "where"),
    [
        ({"type": "nope"}, r"at \$\.type: .*'type' takes one of array, boolean"),
        ({"type": "object", "properties": {"n": {"type": "integr"}}}, r"\$\.properties\.n\.type"),
        ({"type": "object", "required": "n"}, r"at \$\.required: 'n' is not of type 'array'"),
        ({"type": "string"}, "must describe an object"),
        ([{"type": "object"}], "must be a JSON Schema object"),
        ({"type": "object", "enum": {1, 2}}, "must be JSON"),
    ],
)
def test_a_broken_parameters_schema_is_refused_when_registered(
    parameters: object, where: str
) -> None:
    # Before: accepted, and the first call raised jsonschema's UnknownType out of dispatch().
    tool = Tool("broken", "Broken.", parameters, _echo, toolset="terminal")  # type: ignore[arg-type]
    reg = ToolRegistry()
    with pytest.raises(ConfigError, match="tool 'broken': parameters") as caught:
        reg.register(tool)
    assert caught.match(where)
    assert "broken" not in reg
    with pytest.raises(ConfigError):  # the same schema again: refused again, not cached
        ToolRegistry([tool])


def test_schemas_without_a_root_type_or_with_object_in_a_list_are_accepted() -> None:
    reg = ToolRegistry(
        [
            Tool("any", "Any.", {}, _echo, toolset="terminal"),
            Tool("maybe", "Maybe.", {"type": ["object", "null"]}, _echo, toolset="terminal"),
        ]
    )
    assert {"any", "maybe"} <= set(reg.names())


def test_every_builtin_tool_schema_passes_the_check() -> None:
    registry = builtin_registry()
    assert len(list(registry.names())) >= 15
    for tool in registry:
        ToolRegistry([tool])  # raises ConfigError for a broken one


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"name": ""}, "non-empty string"),
        ({"name": " echo"}, "surrounding whitespace"),
        ({"name": "echo\n"}, "control characters"),
        ({"name": 3}, "non-empty string"),
        ({"toolset": ""}, "toolset must be a non-empty string"),
        ({"handler": None}, "handler must be an async function"),
        ({"max_result_size_chars": -1}, "max_result_size_chars must be a number >= 0"),
        ({"max_result_size_chars": True}, "max_result_size_chars must be a number >= 0"),
    ],
)
def test_malformed_tool_fields_raise_config_error(fields: dict[str, object], match: str) -> None:
    base: dict[str, object] = {
        "name": "echo",
        "description": "Echo.",
        "parameters": SCHEMA,
        "handler": _echo,
        "toolset": "terminal",
    }
    with pytest.raises(ConfigError, match=match):
        Tool(**{**base, **fields})  # type: ignore[arg-type]
    exempt = Tool(**{**base, "max_result_size_chars": None})  # type: ignore[arg-type]
    assert exempt.max_result_size_chars is None


def test_a_duplicate_name_is_a_config_error() -> None:
    reg = ToolRegistry([Tool("echo", "Echo.", SCHEMA, _echo, toolset="terminal")])
    with pytest.raises(ConfigError, match="'echo' is already registered"):
        reg.register(Tool("echo", "Echo.", SCHEMA, _echo, toolset="terminal"))


# ---------------------------------------------------------------- distributions


def test_every_reference_distribution_present() -> None:
    assert set(DISTRIBUTIONS) == {
        "default",
        "image_gen",
        "research",
        "science",
        "development",
        "safe",
        "balanced",
        "minimal",
        "terminal_only",
        "terminal_web",
        "creative",
        "reasoning",
        "browser_use",
        "browser_only",
        "browser_tasks",
        "terminal_tasks",
        "mixed_tasks",
    }
    for dist in DISTRIBUTIONS.values():
        assert set(dist.toolsets) <= set(TOOLSETS), dist.name
    assert DISTRIBUTIONS["terminal_tasks"].toolsets["web"] == 97


def test_sampling_is_seeded_and_deterministic() -> None:
    a = [sample_toolsets_from_distribution("balanced", random.Random(7)) for _ in range(5)]
    b = [sample_toolsets_from_distribution("balanced", random.Random(7)) for _ in range(5)]
    assert a == b
    rng1, rng2 = random.Random(42), random.Random(42)
    seq1 = [sample_toolsets_from_distribution("research", rng1) for _ in range(50)]
    seq2 = [sample_toolsets_from_distribution("research", rng2) for _ in range(50)]
    assert seq1 == seq2
    assert len({tuple(s) for s in seq1}) > 1  # it does vary between groups


def test_sampling_frequencies_follow_percentages() -> None:
    rng = random.Random(0)
    counts = {"web": 0, "terminal": 0}
    for _ in range(2000):
        chosen = sample_toolsets_from_distribution("research", rng)
        for k in counts:
            counts[k] += k in chosen
    assert 0.86 < counts["web"] / 2000 < 0.94
    assert 0.07 < counts["terminal"] / 2000 < 0.14


def test_empty_sample_falls_back_to_most_likely() -> None:
    class Always99(random.Random):
        def random(self) -> float:
            return 0.9999

    assert sample_toolsets_from_distribution("research", Always99()) == ["web"]
    assert sample_toolsets_from_distribution("reasoning", Always99()) == ["moa"]


def test_unknown_distribution() -> None:
    with pytest.raises(ValueError, match=r"unknown toolset distribution 'x'; valid .*balanced"):
        sample_toolsets_from_distribution("x", random.Random(0))


# ---------------------------------------------------------------- argument coercion


def test_coercions() -> None:
    args = coerce_arguments(
        SCHEMA,
        {
            "n": "5",
            "x": "2.5",
            "flag": "true",
            "paths": "a.txt",
            "opts": '{"depth": "3"}',
            "name": "keep me",
            "maybe": "null",
            "extra": "untouched",
        },
    )
    assert args == {
        "n": 5,
        "x": 2.5,
        "flag": True,
        "paths": ["a.txt"],
        "opts": {"depth": 3},
        "name": "keep me",
        "maybe": None,
        "extra": "untouched",
    }
    assert coerce_arguments(SCHEMA, {"paths": '["a", "b"]', "n": 3.0, "flag": "False"}) == {
        "paths": ["a", "b"],
        "n": 3,
        "flag": False,
    }


def test_decode_arguments() -> None:
    assert decode_arguments(None) == {}
    assert decode_arguments("  ") == {}
    assert decode_arguments({"a": 1}) == {"a": 1}
    assert decode_arguments('{"a": 1}') == {"a": 1}
    # Double-encoded: decoded once more, not passed on as a string.
    assert decode_arguments(json.dumps(json.dumps({"a": 1}))) == {"a": 1}


DEEP = "[" * 1_000 + "]" * 1_000


@pytest.mark.parametrize(
    "raw",
    [
        '{"x": ' + DEEP + "}",
        json.dumps('{"x": ' + DEEP + "}"),  # deep JSON inside a double-encoded string
        "[" * 100_000,
        '{"x": ' + "[" * 65 + "]" * 65 + "}",
    ],
    ids=["deep", "double-encoded", "unclosed", "just-over-the-limit"],
)
def test_decode_arguments_refuses_deep_nesting_as_a_model_error(raw: str) -> None:
    # Before: RecursionError (json.loads recurses once per level), out of dispatch.
    with pytest.raises(ToolArgumentsError, match=r"nested deeper than 64 levels|must be a JSON"):
        decode_arguments(raw)


def test_decode_arguments_accepts_nesting_up_to_the_limit() -> None:
    raw = '{"x": ' + "[" * 63 + "]" * 63 + ', "s": "' + "[" * 500 + '"}'
    assert decode_arguments(raw)["s"] == "[" * 500  # brackets in strings do not count


@pytest.mark.parametrize(
    "raw",
    [
        '{"x": "\\ud800"}',
        '{"x": "a\\udfffb", "\\udc00": 1}',
        '{"x": "\ud800"}',  # the surrogate itself, not an escape
        json.dumps(json.dumps({"x": "\ud800"})),
        b'{"x": "\xff\xfe"}',  # invalid UTF-8
        {"x": "\ud800", "y": ["\udfff"]},
    ],
    ids=["escape", "escape-in-key", "raw", "double-encoded", "invalid-utf8", "mapping"],
)
def test_decoded_arguments_are_encodable_as_utf8_json(raw: str | bytes | JSONObject) -> None:
    args = decode_arguments(raw)
    text = json.dumps(args, ensure_ascii=False)
    text.encode("utf-8")  # before: UnicodeEncodeError (surrogates not allowed)
    assert "\ufffd" in text


def test_decode_arguments_refuses_deep_mappings_and_non_finite_numbers() -> None:
    deep: list[object] = []
    for _ in range(2_000):
        deep = [deep]
    with pytest.raises(ToolArgumentsError, match="nested deeper than 64 levels"):
        decode_arguments({"x": deep})
    with pytest.raises(ToolArgumentsError, match="out of range for a JSON number"):
        decode_arguments('{"x": 1e999}')
    with pytest.raises(ToolArgumentsError, match="NaN is not valid JSON"):
        decode_arguments({"x": float("nan")})


async def test_dispatch_turns_deep_nesting_into_a_model_visible_error() -> None:
    out = await dispatch(
        "echo", '{"name": "a", "opts": ' + DEEP + "}", ToolRuntime("t"), registry=_registry()
    )
    assert out.error is not None and "nested deeper than 64 levels" in out.error
    assert json.loads(out.content) == {"error": out.error}


async def test_dispatch_success_and_coercion() -> None:
    rt = ToolRuntime("task-1")
    out = await dispatch("echo", '{"name": "a", "n": "2"}', rt, registry=_registry())
    assert out.error is None
    assert json.loads(out.content) == {"args": {"name": "a", "n": 2}, "task_id": "task-1"}


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        ('{"name": 1', r"Invalid JSON in tool arguments: .*Please retry with valid JSON"),
        ('["a"]', r"must be a JSON object .*got list"),
        ('"just text"', r"must be a JSON object .*got str"),
        ("{}", r"Invalid arguments for tool 'echo': arguments: 'name' is a required property"),
        ('{"name": "a", "n": "many"}', r"field 'n': 'many' is not of type 'integer'"),
        ('{"name": "a", "n": 0}', r"field 'n': 0 is less than the minimum of 1"),
        ('{"name": "a", "opts": {"depth": "deep"}}', r"field 'opts.depth': 'deep' is not"),
    ],
)
async def test_dispatch_bad_arguments_are_model_visible(args: str, pattern: str) -> None:
    out = await dispatch("echo", args, ToolRuntime("t"), registry=_registry())
    assert out.error is not None
    assert set(json.loads(out.content)) == {"error"}
    assert json.loads(out.content)["error"] == out.error
    import re

    assert re.search(pattern, out.error), out.error


async def test_dispatch_unknown_and_not_offered() -> None:
    reg = _registry()
    out = await dispatch("nope", "{}", ToolRuntime("t"), registry=reg)
    assert out.error == "Unknown tool 'nope'"
    assert "Available tools: ['boom', 'echo', 'slow']" in out.content
    out = await dispatch("boom", "{}", ToolRuntime("t"), registry=reg, valid_names={"echo"})
    assert out.error == "Unknown tool 'boom'"


async def test_dispatch_echoes_a_lone_surrogate_name_encodably() -> None:
    # The "Unknown tool" message repeats the name the model wrote; a lone surrogate in it
    # used to make the next request body unencodable.
    out = await dispatch("ter\ud800minal", "{}", ToolRuntime("t"), registry=_registry())
    assert out.error == "Unknown tool 'ter\ufffdminal'"
    out.content.encode("utf-8")
    json.loads(out.content)


async def test_dispatch_handler_exception_is_contained() -> None:
    out = await dispatch("boom", "{}", ToolRuntime("t"), registry=_registry())
    assert out.error == "Tool execution failed: RuntimeError: kaput"
    assert json.loads(out.content) == {"error": out.error}


async def test_dispatch_timeout() -> None:
    out = await dispatch("slow", "{}", ToolRuntime("t"), registry=_registry(), timeout=0.05)
    assert out.error == "Tool 'slow' timed out after 0.05 seconds and was cancelled"


async def test_dispatch_cancellation_propagates() -> None:
    rt = ToolRuntime("t")
    with anyio.move_on_after(0.05) as scope:
        await dispatch("slow", "{}", rt, registry=_registry())
        pytest.fail("not cancelled")
    assert scope.cancelled_caught
    assert rt.limits.tool_calls.statistics().in_use == 0


@pytest.mark.parametrize("name", ["memory", "session_search"])
async def test_not_available_in_rl(name: str) -> None:
    out = await dispatch(name, "{}", ToolRuntime("t"))
    assert "not available in RL environments" in out.content
    assert out.error is not None


async def test_dispatch_respects_tool_calls_limiter() -> None:
    from hermes_async.limits import Limits

    limits = Limits(tool_calls=2)
    peak = 0
    current = 0

    async def track(args: JSONObject, runtime: ToolRuntime) -> str:
        nonlocal peak, current
        current += 1
        peak = max(peak, current)
        await anyio.sleep(0.01)
        current -= 1
        return "ok"

    reg = ToolRegistry([Tool("t", "T.", {"type": "object"}, track, "terminal")])
    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(
                functools.partial(dispatch, registry=reg),
                "t",
                "{}",
                ToolRuntime(f"r{i}", limits=limits),
            )
    assert peak == 2
    assert limits.tool_calls.statistics().acquisitions == 8


def test_custom_toolsets_and_tools_in_static_toolsets() -> None:
    reg = ToolRegistry(
        [
            Tool("echo", "Echo.", SCHEMA, _echo, toolset="terminal"),
            Tool("mine", "Mine.", SCHEMA, _echo, toolset="my_tools"),
        ]
    )
    assert reg.definitions(["terminal"]).valid_names == {"echo"}
    assert reg.definitions(["debugging"]).valid_names == {"echo"}
    assert reg.definitions(["my_tools"]).valid_names == {"mine"}
    assert reg.definitions().valid_names == {"echo", "mine"}
    assert reg.definitions(None, ["my_tools"]).valid_names == {"echo"}
    assert reg.definitions(None, ["debugging"]).valid_names == {"mine"}
    with pytest.raises(ValueError, match="unknown toolset 'other'"):
        reg.definitions(["other"])


async def _add(args: JSONObject, runtime: ToolRuntime) -> str:
    return str(int(args["a"]) + int(args["b"]))


ADD = Tool(
    "add",
    "Add two integers.",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    _add,
    "math",
)


def test_a_custom_tool_offered_without_its_registry_is_refused_before_any_rollout() -> None:
    # The first-hour pitfall: the tool is registered and offered, but the loop would run tools
    # from the built-in registry, and every call would be "Unknown tool 'add'", blamed on the
    # model. Refused when the loop is built instead, naming the fix.
    from hermes_async.agent import HermesAgentLoop
    from hermes_async.inference import ChatClient

    registry = ToolRegistry([*builtin_registry(), ADD])
    schemas, names = get_tool_definitions(["terminal", "math"], registry=registry)
    assert "add" in names
    client = ChatClient("http://127.0.0.1:9/v1", model="m")
    with pytest.raises(ConfigError, match=r"not in the built-in tools: \['add'\].*registry="):
        HermesAgentLoop(client, schemas, names)
    loop = HermesAgentLoop(client, schemas, names, registry=registry)  # passed: fine
    assert loop.registry is registry
    with pytest.raises(
        ConfigError, match=r"registry passed as registry=: \['process', 'terminal'\]"
    ):
        HermesAgentLoop(client, schemas, names, registry=ToolRegistry([ADD]))


async def test_run_group_refuses_a_custom_tool_without_its_registry() -> None:
    from hermes_async.agent import run_group
    from hermes_async.inference import ChatClient

    registry = ToolRegistry([*builtin_registry(), ADD])
    tools = get_tool_definitions(["math"], registry=registry)
    async with ChatClient("http://127.0.0.1:9/v1", model="m") as client:
        with pytest.raises(ConfigError, match=r"\['add'\]"):
            await run_group(client, [{"role": "user", "content": "1 + 2?"}], tools, size=2)

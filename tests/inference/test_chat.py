"""Phase 1 chat client: SDK-shaped results, streaming assembly by index, extra_body, faults."""

from __future__ import annotations

import contextlib
import json
import time

import anyio
import httpx
import pytest
from hypothesis import given, settings, strategies as st

from hermes_async.inference import (
    ChatClient,
    ChatCompletion,
    ChatStreamAssembler,
    HTTPOptions,
    ServerProtocolError,
    ServerStatusError,
    ServerTimeoutError,
    StreamInterruptedError,
)
from hermes_async.inference._errors import DECODE_FAILURES
from hermes_async.jsontypes import JSON
from hermes_async.testing.http import open_app_endpoint
from hermes_async.testing.scripted_server import (
    MALFORMED_LINE,
    Fault,
    FixedScript,
    ScriptedModelServer,
)
from tests.support import FAST, TOKENIZER

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
TWO_CALLS = (
    "<think>I should look around first.</think>Checking both.\n"
    '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls -la /tmp && echo \\"done\\""}}\n</tool_call>\n'
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "/etc/hostname", "limit": 10}}\n</tool_call>'
)
MESSAGES = [{"role": "user", "content": "Look around."}]


def make_server(texts: list[str], **kwargs: object) -> ScriptedModelServer:
    return ScriptedModelServer(
        FixedScript(texts, repeat=True), tokenizer=TOKENIZER, max_chunk_tokens=2, **kwargs
    )  # type: ignore[arg-type]


# ------------------------------------------------------------------ assembler (no I/O)


def test_assembler_joins_tool_call_fragments_by_index_even_interleaved() -> None:
    asm = ChatStreamAssembler()
    chunks = [
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "thin"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "king"}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "b",
                                "type": "function",
                                "function": {"name": "read_file", "arguments": ""},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "a",
                                "function": {"name": "terminal", "arguments": '{"comm'},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 1, "function": {"arguments": '{"path": "x"}'}}]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{"index": 0, "function": {"arguments": 'and": "ls"}'}}]
                    },
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
    ]
    for chunk in chunks:
        asm.feed(chunk)
    result = asm.result()
    message = result.choices[0].message
    assert result.id == "c1" and result.model == "m"
    assert message.content == "Hi"
    assert message.reasoning_content == "thinking"
    assert message.tool_calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("a", "terminal", '{"command": "ls"}'),
        ("b", "read_file", '{"path": "x"}'),
    ]
    assert result.choices[0].finish_reason == "tool_calls"
    assert result.usage is not None and result.usage.total_tokens == 7
    assert asm.finished


def test_assembler_multiple_choices_and_openrouter_reasoning() -> None:
    asm = ChatStreamAssembler()
    asm.feed(
        {
            "choices": [
                {"index": 1, "delta": {"content": "B"}},
                {"index": 0, "delta": {"reasoning": "r"}},
            ]
        }
    )
    asm.feed({"choices": [{"index": 0, "delta": {"content": "A"}, "finish_reason": "stop"}]})
    assert not asm.finished
    asm.feed({"choices": [{"index": 1, "delta": {}, "finish_reason": "length"}]})
    result = asm.result()
    assert [(c.index, c.message.content, c.finish_reason) for c in result.choices] == [
        (0, "A", "stop"),
        (1, "B", "length"),
    ]
    assert result.choices[0].message.reasoning == "r"
    assert result.choices[0].message.tool_calls is None


def test_from_dict_is_sdk_shaped_and_model_dump_round_trips() -> None:
    data = {
        "id": "x",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "t",
                            "type": "function",
                            "function": {"name": "f", "arguments": {"a": 1}},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
    }
    completion = ChatCompletion.from_dict(data)
    call = completion.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.arguments == '{"a": 1}'  # an object is encoded, as the SDK shape wants
    dumped = completion.model_dump()
    assert dumped["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"


def test_request_body_merges_extra_body_last_at_top_level() -> None:
    client = ChatClient("http://h/v1", model="m")
    body = client.request_body(
        messages=MESSAGES,
        temperature=0.5,
        max_tokens=None,
        extra_body={"reasoning": {"enabled": True}, "temperature": 1.0, "return_token_ids": True},
    )
    assert body == {
        "model": "m",
        "messages": MESSAGES,
        "temperature": 1.0,
        "reasoning": {"enabled": True},
        "return_token_ids": True,
        "stream": False,
    }
    streaming = client.request_body(messages=MESSAGES, stream=True)
    assert streaming["stream_options"] == {"include_usage": True}
    with pytest.raises(TypeError, match="does not support 'extra_headers'"):
        client.request_body(messages=MESSAGES, extra_headers={"x": "y"})


# ------------------------------------------------------------------ against the scripted server


@pytest.mark.parametrize("loopback", [False, True], ids=["inproc", "loopback"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_tool_calls_content_and_reasoning(stream: bool, loopback: bool) -> None:
    server = make_server([TWO_CALLS])
    async with (
        open_app_endpoint(server, loopback=loopback) as (base_url, transport),
        ChatClient(base_url + "/v1", transport=transport) as client,
    ):
        response = await client.chat_completion(messages=MESSAGES, tools=TOOLS, stream=stream)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking both."
    assert choice.message.reasoning_content == "I should look around first."
    calls = choice.message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["terminal", "read_file"]
    assert json.loads(calls[0].function.arguments) == {"command": 'ls -la /tmp && echo "done"'}
    assert json.loads(calls[1].function.arguments) == {"path": "/etc/hostname", "limit": 10}
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert response.usage is not None and response.usage.completion_tokens > 0
    assert server.requests[0].body["stream"] is stream
    # The streamed arguments really arrived in fragments.
    if stream:
        assert len(server.requests[0].completion_ids) > 10


async def test_streaming_and_whole_responses_agree() -> None:
    server = make_server(["Plain answer with ünïcödé and 漢字."])
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        ChatClient(base_url + "/v1", transport=transport) as client,
    ):
        whole = await client.chat_completion(messages=MESSAGES)
        streamed = await client.chat_completion(messages=MESSAGES, stream=True)
        async with client.stream_chat(messages=MESSAGES) as chunks:
            raw = [chunk async for chunk in chunks]
            via_stream = chunks.completion()
    for response in (whole, streamed, via_stream):
        assert response.choices[0].message.content == "Plain answer with ünïcödé and 漢字."
        assert response.choices[0].message.tool_calls is None
        assert response.choices[0].finish_reason == "stop"
    assert len(raw) > 3


async def test_extra_body_reaches_the_server_at_top_level() -> None:
    server = make_server(["ok"])
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        ChatClient(base_url + "/v1", model="policy", transport=transport) as client,
    ):
        await client.chat_completion(
            messages=MESSAGES, n=1, extra_body={"skip_special_tokens": False, "top_k": 20}
        )
    body = server.requests[0].body
    assert body["skip_special_tokens"] is False and body["top_k"] == 20
    assert body["model"] == "policy" and body["n"] == 1 and "extra_body" not in body


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_chat_fault_matrix_retries_and_errors(stream: bool) -> None:
    server = make_server(
        ["fine"],
        faults={
            1: Fault.http_error(503),
            2: Fault.rate_limited(0.05),
            4: Fault.http_error(422),
            5: Fault.disconnect(after_tokens=2),
            6: Fault.malformed(after_tokens=1),
        },
    )
    async with (
        open_app_endpoint(server, loopback=False) as (base_url, transport),
        ChatClient(base_url + "/v1", transport=transport, options=FAST, stream=stream) as client,
    ):
        ok = await client.chat_completion(messages=MESSAGES)
        assert ok.choices[0].message.content == "fine"
        assert len(server.requests) == 3
        with pytest.raises(ServerStatusError, match="HTTP 422") as info:
            await client.chat_completion(messages=MESSAGES)
        assert info.value.status == 422 and len(server.requests) == 4
        with pytest.raises(StreamInterruptedError, match="closed before the response"):
            await client.chat_completion(messages=MESSAGES)
        assert len(server.requests) == 5
        expected = MALFORMED_LINE if stream else None
        with pytest.raises(ServerProtocolError, match="not valid JSON") as bad:
            await client.chat_completion(messages=MESSAGES)
        if expected is not None:
            assert bad.value.line == expected
        assert len(server.requests) == 6


async def test_chat_stream_stall_times_out_and_disconnects() -> None:
    server = make_server(
        ["a long enough answer to stall in"], faults={1: Fault.stall(after_tokens=2)}
    )
    async with open_app_endpoint(server, loopback=True) as (base_url, transport):
        options = HTTPOptions(read_timeout=0.3)
        async with ChatClient(base_url + "/v1", transport=transport, options=options) as client:
            with pytest.raises(ServerTimeoutError, match=r"no data for 0\.3 s"):
                await client.chat_completion(messages=MESSAGES, stream=True)
        with anyio.fail_after(5):
            await server.requests[0].disconnected.wait()


async def test_chat_error_frame_and_unfinished_stream() -> None:
    frames = {
        "error": b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\ndata: {"error": {"message": "upstream overloaded"}}\n\n',
        "unfinished": b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n',
    }
    for name, body in frames.items():

        def handler(request: httpx.Request, body: bytes = body) -> httpx.Response:
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

        async with ChatClient("http://m/v1", transport=httpx.MockTransport(handler)) as client:
            pattern = "upstream overloaded" if name == "error" else "ended without \\[DONE\\]"
            with pytest.raises(StreamInterruptedError, match=pattern):
                await client.chat_completion(messages=MESSAGES, stream=True)


async def test_non_chat_json_is_a_protocol_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"object": "list", "data": []})

    async with ChatClient("http://m/v1", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(
            ServerProtocolError,
            match=r"/v1/chat/completions: unexpected response body: response has no .choices.",
        ):
            await client.chat_completion(messages=MESSAGES)


async def test_api_key_is_sent_as_bearer() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(
            200,
            json={
                "id": "1",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "k"}}],
            },
        )

    async with ChatClient(
        "http://m/v1", api_key="sk-test", transport=httpx.MockTransport(handler)
    ) as client:
        response = await client.chat_completion(messages=MESSAGES)
    assert seen == ["Bearer sk-test"]
    assert response.choices[0].message.content == "k"


# ------------------------------------------------------------------ encodable text


def test_lone_surrogates_in_a_completion_become_replacement_characters() -> None:
    # json.loads of "\ud800" gives a str no UTF-8 encoder accepts; echoed back in the next
    # request it used to fail that request with UnicodeEncodeError.
    data = json.loads(
        '{"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": '
        '"assistant", "content": "a \\ud800 b", "reasoning_content": "r \\udfff", '
        '"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "t\\ud800", '
        '"arguments": "{\\"x\\": \\"\\udc00\\"}"}}]}}]}'
    )
    message = ChatCompletion.from_dict(data).choices[0].message
    assert message.content == "a \ufffd b" and message.reasoning_content == "r \ufffd"
    call = message.tool_calls[0].function  # type: ignore[index]
    assert call.name == "t\ufffd" and call.arguments == '{"x": "\ufffd"}'
    json.dumps(ChatCompletion.from_dict(data).model_dump(), ensure_ascii=False).encode("utf-8")


def test_a_surrogate_pair_split_across_stream_chunks_is_joined() -> None:
    assembler = ChatStreamAssembler()
    for piece in ("smile \ud83d", "\ude00 and a lone \udfff"):
        assembler.feed({"choices": [{"index": 0, "delta": {"content": piece}}]})
    assembler.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    content = assembler.result().choices[0].message.content
    assert content == "smile \U0001f600 and a lone \ufffd"
    assert content is not None and content.encode("utf-8")


def test_a_request_body_is_always_encodable() -> None:
    from hermes_async.inference._http import encode_body as _encode_body

    body = {"messages": [{"role": "tool", "content": "x \ud800 y"}], "n": 1}
    assert json.loads(_encode_body(body)) == {
        "messages": [{"role": "tool", "content": "x \ufffd y"}],
        "n": 1,
    }
    assert _encode_body({"a": "é"}) == '{"a":"é"}'.encode()  # the common case: UTF-8, compact
    encoded = _encode_body(body)
    assert _encode_body(encoded) is encoded  # already encoded: sent as it is


def test_assembler_bounds_what_a_stream_may_grow() -> None:
    def content(text: str, index: int = 0) -> dict[str, object]:
        return {"choices": [{"index": index, "delta": {"content": text}}]}

    asm = ChatStreamAssembler(max_chars=10, max_tokens=3, max_choices=1)
    asm.feed(content("0123456789"))
    with pytest.raises(ValueError, match="11\\+ characters, more than its bound of 10"):
        asm.feed(content("x"))
    asm = ChatStreamAssembler(max_chars=10)  # tool names and arguments count too
    call = {"index": 0, "function": {"name": "terminal", "arguments": '{"a":1}'}}
    with pytest.raises(ValueError, match=r"15\+ characters, more than its bound of 10"):
        asm.feed({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    asm = ChatStreamAssembler(max_tokens=3)
    asm.feed({"choices": [{"index": 0, "token_ids": [1, 2], "delta": {}}]})
    with pytest.raises(ValueError, match="4 token ids in one choice, more than its bound of 3"):
        asm.feed({"choices": [{"index": 0, "token_ids": [3, 4], "delta": {}}]})
    asm = ChatStreamAssembler(max_choices=2)
    asm.feed(content("a", 0))
    asm.feed(content("b", 5))
    with pytest.raises(ValueError, match="more than the 2 choices asked for"):
        asm.feed(content("c", 1))
    asm = ChatStreamAssembler()  # empty calls under new indexes cost memory too
    with pytest.raises(ValueError, match="more than 1024 tool-call indexes"):
        for i in range(1025):
            asm.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i}]}}]})


async def test_a_stream_of_token_ids_alone_is_bounded_without_max_tokens() -> None:
    # No max_tokens and no text: the ids were kept without a bound, until the request deadline.
    chunk = {"choices": [{"index": 0, "delta": {}, "token_ids": [7] * 100}]}
    body = f"data: {json.dumps(chunk)}\n\n".encode() * 100

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    options = HTTPOptions(max_completion_chars=1000)
    transport = httpx.MockTransport(handler)
    async with ChatClient("http://m/v1", transport=transport, options=options) as client:
        with pytest.raises(
            ServerProtocolError,
            match=r"1100 token ids in one choice, more than its bound of 1000 "
            r"\(HTTPOptions\.max_completion_chars=1000",
        ):
            await client.chat_completion(messages=MESSAGES, stream=True)


def test_assembler_keeps_token_ids_in_linear_time() -> None:
    asm = ChatStreamAssembler()
    chunk = {"choices": [{"index": 0, "token_ids": [7], "delta": {}}]}
    start = time.perf_counter()
    for _ in range(20_000):  # list + list per chunk copied 200 M ids (seconds); extend: ms
        asm.feed(chunk)
    assert time.perf_counter() - start < 2.0
    assert asm.result().choices[0].token_ids == [7] * 20_000


@pytest.mark.parametrize(
    "chunk",
    [
        '{"created": 1e999, "choices": []}',  # int(inf): OverflowError
        '{"choices": [{"index": 1e999, "delta": {}}]}',
        '{"choices": [], "usage": {"prompt_tokens": 1e999}}',
        '{"error": ' + "[" * 900 + "]" * 900 + "}",  # its repr recurses past the limit
        '{"choices": [{"index": 0, "delta": {"content": ' + "[" * 900 + "]" * 900 + "}}]}",
    ],
)
async def test_any_undecodable_chunk_is_a_protocol_error(chunk: str) -> None:
    body = f"data: {chunk}\n\ndata: [DONE]\n\n".encode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async with ChatClient("http://m/v1", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises((ServerProtocolError, StreamInterruptedError)):
            await client.chat_completion(messages=MESSAGES, stream=True)


@pytest.mark.parametrize(
    "payload",
    [
        '{"choices": [{"index": 1e999, "message": {}}]}',
        '{"choices": [{"message": {"tool_calls": [{"function": {"name": "t", "arguments": '
        + "[" * 990
        + "]" * 990
        + "}}]}}]}",
        # str() of it for the span's finish_reasons recursed past the limit: a raw RecursionError
        '{"choices": [{"message": {}, "finish_reason": ' + "[" * 990 + "]" * 990 + "}]}",
    ],
)
async def test_any_undecodable_whole_response_is_a_protocol_error(payload: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=payload.encode())

    async with ChatClient("http://m/v1", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ServerProtocolError, match="unexpected response body"):
            await client.chat_completion(messages=MESSAGES)


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=4)
)
_KEYS = st.sampled_from(
    ["choices", "message", "delta", "content", "tool_calls", "function", "name", "arguments",
     "id", "index", "finish_reason", "usage", "prompt_tokens", "token_ids", "error", "role"]
)  # fmt: skip
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)
_CALL = _VALUES | st.fixed_dictionaries(
    {}, optional={"id": _VALUES, "function": _VALUES | st.dictionaries(_KEYS, _VALUES)}
)
_MESSAGE = st.fixed_dictionaries(
    {}, optional={"content": _VALUES, "tool_calls": _VALUES | st.lists(_CALL, max_size=2)}
)
_CHOICE = st.fixed_dictionaries(
    {"message": _MESSAGE, "delta": _MESSAGE},
    optional={"index": _VALUES, "finish_reason": _VALUES, "token_ids": _VALUES},
)
#: Near-valid chat bodies and stream chunks, with any value anywhere.
_CHAT_BODIES = st.fixed_dictionaries(
    {"choices": st.lists(_CHOICE, min_size=1, max_size=2) | _VALUES},
    optional={"usage": _VALUES, "error": _VALUES},
)


@settings(max_examples=100, deadline=None, derandomize=True)  # the same cases each run
@given(body=_CHAT_BODIES, chunks=st.lists(_CHAT_BODIES, max_size=3))
def test_any_chat_body_gives_a_completion_or_a_decode_failure(
    body: JSON, chunks: list[JSON]
) -> None:
    """Whatever JSON a server sends, the chat decoders give a completion whose finish reasons
    are strings or null, or raise what the client turns into a protocol error: never another
    exception (a raw one escaped the client when str() of a finish_reason failed later)."""
    results = []
    with contextlib.suppress(DECODE_FAILURES):
        results.append(ChatCompletion.from_dict(body))
    assembler = ChatStreamAssembler(max_chars=1000, max_tokens=50, max_choices=2)
    with contextlib.suppress(DECODE_FAILURES):
        for chunk in chunks:
            assembler.feed(chunk)
    results.append(assembler.result())
    for completion in results:
        completion.model_dump()
        assert all(isinstance(c.finish_reason, str | None) for c in completion.choices)

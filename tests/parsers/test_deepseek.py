"""deepseek_v3 / deepseek_v3_1 / deepseek_v4 (DSML): literal examples and robustness."""

from __future__ import annotations

import json

import pytest

from hermes_async.parsers import get_parser
from tests.parsers.helpers import assert_invariant

D3 = (
    "Let me run some commands.\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>terminal\n"
    '```json\n{"command": "ls"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>read_file\n'
    '```json\n{"path": "test.py"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
D31 = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>terminal<｜tool▁sep｜>{"command": "ls"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
D4 = (
    "<｜DSML｜tool_calls_begin｜>\n<｜DSML｜tool_call_begin｜>terminal\n```json\n"
    '{"command": "ls"}\n```\n<｜DSML｜tool_call_end｜>\n<｜DSML｜tool_calls_end｜>'
)


def calls(result: object) -> list[tuple[str, object]]:
    return [(c.name, json.loads(c.arguments)) for c in getattr(result, "tool_calls", None) or []]


def test_reference_example_v3() -> None:
    result = assert_invariant("deepseek_v3", D3, range(0, len(D3), 6))
    assert result.content == "Let me run some commands."
    assert calls(result) == [("terminal", {"command": "ls"}), ("read_file", {"path": "test.py"})]


@pytest.mark.parametrize("name", ["deepseek_v3_1", "deepseek_v31"])
def test_reference_example_v3_1(name: str) -> None:
    assert calls(assert_invariant(name, D31, range(0, len(D31), 4))) == [
        ("terminal", {"command": "ls"})
    ]


@pytest.mark.parametrize("name", ["deepseek_v4", "deepseek_dsml"])
def test_reference_example_v4_and_ascii_variants(name: str) -> None:
    assert calls(assert_invariant(name, D4, range(0, len(D4), 5))) == [
        ("terminal", {"command": "ls"})
    ]
    spaced = (
        "< | DSML | tool_calls_begin >\n< | DSML | tool_call_begin >terminal\n"
        '{"command": {"nested": [1, 2]}}\n< | DSML | tool_call_end >\n< | DSML | tool_calls_end >'
    )
    assert calls(assert_invariant(name, spaced, [7, 33])) == [
        ("terminal", {"command": {"nested": [1, 2]}})
    ]
    ascii_bars = D4.replace("｜", "|").replace("tool_call_begin", "tool▁call▁begin")
    assert calls(get_parser(name).parse(ascii_bars)) == [("terminal", {"command": "ls"})]


def test_unfenced_v3_and_closing_marker_inside_a_string() -> None:
    text = D31.replace('{"command": "ls"}', '{"command": "echo <｜tool▁call▁end｜>"}')
    assert calls(get_parser("deepseek_v3_1").parse(text)) == [
        ("terminal", {"command": "echo <｜tool▁call▁end｜>"})
    ]
    unfenced = D3.replace("```json\n", "").replace("\n```", "")
    assert len(calls(get_parser("deepseek_v3").parse(unfenced))) == 2


def test_missing_section_end_and_truncation() -> None:
    cut = D3[: D3.index("<｜tool▁calls▁end｜>")]
    assert len(calls(get_parser("deepseek_v3").parse(cut))) == 2
    result = get_parser("deepseek_v3").parse(D3[: D3.index('"path"') + 4])
    assert len(calls(result)) == 1 and result.truncated_calls[0].name == "read_file"


def test_invalid_arguments_do_not_drop_the_other_call() -> None:
    text = D3.replace('{"command": "ls"}', '{"command": ls}')
    result = get_parser("deepseek_v3").parse(text)
    assert calls(result) == [("read_file", {"path": "test.py"})]
    assert result.invalid_calls[0].name == "terminal"

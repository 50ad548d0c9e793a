from __future__ import annotations

import time

import pytest

from hermes_async.tools._fuzzy import ReplaceError, fuzzy_replace

CODE = """class A:
    def f(self):
        x = 1
        return x

    def g(self):
        y = 2
        return y
"""


def test_exact_unique() -> None:
    r = fuzzy_replace(CODE, "x = 1", "x = 10")
    assert (r.count, r.strategy) == (1, "exact")
    assert "        x = 10\n" in r.content


def test_multiple_matches_need_context_or_replace_all() -> None:
    with pytest.raises(ReplaceError, match=r"Found 2 matches.*more context.*replace_all"):
        fuzzy_replace(CODE, "return", "yield")
    r = fuzzy_replace(CODE, "return", "yield", replace_all=True)
    assert r.count == 2 and "return" not in r.content


def test_trailing_whitespace_difference() -> None:
    r = fuzzy_replace("a = 1  \nb = 2\n", "a = 1\nb = 2", "a = 3\nb = 4")
    assert r.strategy == "trailing_whitespace"
    assert r.content == "a = 3\nb = 4\n"


def test_indentation_flexible_reindents_new_string() -> None:
    r = fuzzy_replace(CODE, "def g(self):\n    y = 2", "def g(self):\n    y = 3\n    z = 4")
    assert r.strategy == "indentation"
    assert "    def g(self):\n        y = 3\n        z = 4\n        return y\n" in r.content


def test_whitespace_and_unicode_normalized() -> None:
    r = fuzzy_replace("call(a,  b)\n", "call(a, b)", "call(b, a)")
    assert (r.strategy, r.content) == ("whitespace_normalized", "call(b, a)\n")
    r = fuzzy_replace("s = \u201chello\u201d \u2014 x\n", 's = "hello" - x', "s = 1")
    assert (r.strategy, r.content) == ("unicode_normalized", "s = 1\n")


def test_escaped_newlines_in_old_string() -> None:
    r = fuzzy_replace("a\nb\nc\n", "a\\nb", "x\\ny")
    assert r.strategy == "escape_normalized"
    assert r.content == "x\ny\nc\n"


def test_block_anchor_tolerates_a_changed_middle() -> None:
    text = "start()\nalpha = compute(1, 2, 3)\nbeta = 2\nend()\n"
    r = fuzzy_replace(text, "start()\nalpha = compute(1, 2, 4)\nbeta = 2\nend()", "done()")
    assert (r.strategy, r.content) == ("block_anchor", "done()\n")


def test_crlf_file_keeps_line_endings() -> None:
    r = fuzzy_replace("a  \r\nb\r\n", "a\nb", "c\nd")
    assert r.content == "c\r\nd\r\n"


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        ("nope", "x", "Could not find old_string"),
        ("", "x", "old_string is empty"),
        ("x = 1", "x = 1", "identical"),
    ],
)
def test_errors(old: str, new: str, match: str) -> None:
    with pytest.raises(ReplaceError, match=match):
        fuzzy_replace(CODE, old, new)


def test_fuzzy_ambiguity_is_an_error_too() -> None:
    text = "  v = 1\n    v = 1\n"
    with pytest.raises(ReplaceError, match=r"Found 2 matches .*indentation"):
        fuzzy_replace(text, "v = 1 ", "v = 2")


def test_repetitive_file_is_searched_in_bounded_time() -> None:
    # Line matching compared a slice at every line (13 s here), and the block anchor ran
    # difflib at every line whose first and last lines fit (80 s for a 100,000-line file).
    content = "a\n" * 100_000
    start = time.thread_time()
    with pytest.raises(ReplaceError, match="Could not find"):
        fuzzy_replace(content, "a\n" * 20_000 + "b", "c")
    with pytest.raises(ReplaceError, match="Could not find"):
        fuzzy_replace(content[:80_000], "a\n" + "x" * 3_000 + "\na", "c")
    assert time.thread_time() - start < 1.0
    r = fuzzy_replace(content + "b\n", " a\n" * 20_000 + "b", "c")
    assert (r.content, r.strategy) == ("a\n" * 80_000 + "c\n", "indentation")

from __future__ import annotations

import time

import pytest

from hermes_async.tools._v4a import (
    Hunk,
    HunkLine,
    PatchApplyError,
    PatchParseError,
    apply_update,
    parse_patch,
)

SOURCE = """import os

def setup():
    x = 1
    return x

def main():
    setup()
    run(debug=True)
    return 0

def teardown():
    return x
"""


def test_parse_add_update_delete_and_hints() -> None:
    ops = parse_patch(
        "*** Begin Patch\n"
        "*** Update File: src/app.py\n"
        "@@ def main():\n"
        "     setup()\n"
        "-    run(debug=True)\n"
        "+    run(debug=False)\n"
        "@@ def teardown(): @@\n"
        "-    return x\n"
        "+    return None\n"
        "*** Add File: docs/new file.md\n"
        "+# Title\n"
        "+\n"
        "+body\n"
        "*** Delete File: old.txt\n"
        "*** End Patch\n"
    )
    assert [(op.kind, op.path) for op in ops] == [
        ("update", "src/app.py"),
        ("add", "docs/new file.md"),
        ("delete", "old.txt"),
    ]
    update = ops[0]
    assert [h.hint for h in update.hunks] == ["def main():", "def teardown():"]
    assert update.hunks[0].lines == (
        HunkLine(" ", "    setup()"),
        HunkLine("-", "    run(debug=True)"),
        HunkLine("+", "    run(debug=False)"),
    )
    assert ops[1].content == "# Title\n\nbody\n"


def test_parse_move_forms_and_lenient_markers() -> None:
    ops = parse_patch(
        "*** Update File: a.py\n*** Move to: b.py\n@@\n-x\n+y\n*** Move File: c.py -> d.py\n"
    )
    assert (ops[0].path, ops[0].move_to) == ("a.py", "b.py")
    assert (ops[1].path, ops[1].move_to, ops[1].hunks) == ("c.py", "d.py", ())


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("*** Begin Patch\n*** End Patch\n", "no file operation"),
        (
            "*** Begin Patch\n*** Add File: a.txt\nno plus here\n*** End Patch",
            "must start with '\\+'",
        ),
        ("*** Begin Patch\n*** Update File: a.txt\n*** End Patch", "has no hunk"),
        ("*** Begin Patch\nstray text\n*** Update File: a\n@@\n-a\n+b\n*** End Patch", "line 2"),
        ("*** Begin Patch\n*** Move to: x\n*** End Patch", "Move to"),
    ],
)
def test_parse_errors_say_what_is_wrong(text: str, match: str) -> None:
    with pytest.raises(PatchParseError, match=match):
        parse_patch(text)


def _hunk(*lines: str, hint: str | None = None, eof: bool = False) -> Hunk:
    return Hunk(hint, tuple(HunkLine(x[0], x[1:]) for x in lines), eof)  # type: ignore[arg-type]


def test_apply_multiple_hunks_in_order() -> None:
    out = apply_update(
        "app.py",
        SOURCE,
        [
            _hunk("     x = 1", "-    return x", "+    return x + 1"),
            _hunk("     setup()", "-    run(debug=True)", "+    run(debug=False)"),
        ],
    )
    assert "    return x + 1\n" in out
    assert "    run(debug=False)\n" in out
    assert out.count("\n") == SOURCE.count("\n")
    # teardown's identical "return x" was not touched.
    assert out.endswith("def teardown():\n    return x\n")


def test_hint_selects_among_repeated_blocks() -> None:
    out = apply_update(
        "app.py", SOURCE, [_hunk("-    return x", "+    return 42", hint="def teardown():")]
    )
    assert out.endswith("def teardown():\n    return 42\n")
    assert "def setup():\n    x = 1\n    return x\n" in out


def test_context_matches_despite_whitespace_and_quotes() -> None:
    text = "a = 1   \n    b = \u201cq\u201d\nc = 3\n"
    out = apply_update("f.py", text, [_hunk(" a = 1", ' b = "q"', "-c = 3", "+c = 4")])
    assert out == "a = 1   \n    b = \u201cq\u201d\nc = 4\n"


def test_pure_insertion_after_hint_and_at_end() -> None:
    out = apply_update("f.py", "a\nb\nc\n", [_hunk("+after b", hint="b")])
    assert out == "a\nb\nafter b\nc\n"
    out = apply_update("f.py", "a\nb\n", [_hunk("+tail")])
    assert out == "a\nb\ntail\n"
    assert apply_update("f.py", "", [_hunk("+only")]) == "only\n"


def test_end_of_file_anchor_prefers_last_occurrence() -> None:
    out = apply_update("f", "x\ny\nx\n", [_hunk("-x", "+z", eof=True)])
    assert out == "x\ny\nz\n"


def test_crlf_and_missing_final_newline_are_preserved() -> None:
    assert apply_update("f", "a\r\nb\r\n", [_hunk("-b", "+c")]) == "a\r\nc\r\n"
    assert apply_update("f", "a\nb", [_hunk("-b", "+c")]) == "a\nc"


def test_hunk_that_does_not_match_names_file_and_line() -> None:
    with pytest.raises(PatchApplyError, match=r"hunk 2 .*src/app\.py.*'    run\(debug=Maybe\)'"):
        apply_update(
            "src/app.py",
            SOURCE,
            [
                _hunk("-import os", "+import sys"),
                _hunk("     setup()", "-    run(debug=Maybe)", "+    run()"),
            ],
        )


def test_lines_present_but_not_consecutive() -> None:
    with pytest.raises(PatchApplyError, match=r"not consecutively.*first line: 'import os'"):
        apply_update("f.py", SOURCE, [_hunk(" import os", "-def main():", "+def start():")])


def test_parse_then_apply_roundtrip() -> None:
    (op,) = parse_patch(
        "*** Begin Patch\n*** Update File: app.py\n@@ def main():\n setup()\n"
        "-    run(debug=True)\n+    run(debug=False)\n+    log()\n\n*** End Patch"
    )
    # The context line " setup()" lost its indentation: matched ignoring surrounding whitespace.
    out = apply_update(op.path, SOURCE, op.hunks)
    assert "    setup()\n    run(debug=False)\n    log()\n    return 0\n" in out


def test_add_file_trailing_blank_lines_are_formatting() -> None:
    (op,) = parse_patch("*** Add File: a.txt\n+one\n\n+three\n\n\n*** End Patch")
    assert op.content == "one\n\nthree\n"


def test_long_space_runs_in_headers_parse_in_linear_time() -> None:
    # A lazy regex group before ``\s*$`` backtracked over such runs: 7 s for the hunk line,
    # 10 s for the header, on the event loop.
    path, hint = "a" + " " * 50_000 + "b", "x" + " " * 2_000 + "y"
    start = time.thread_time()
    (op,) = parse_patch(f"*** Update File: {path}\n@@ {hint} @@\n-x\n+y\n")
    assert time.thread_time() - start < 1.0
    assert op.path == path and op.hunks[0].hint == hint
    ops = parse_patch(f"*** Move File: {path} -> c\n@@\n-x\n+y\n*** Delete File: {path}  ")
    assert (ops[0].path, ops[0].move_to, ops[1].path) == (path, "c", path)


def test_long_hunk_in_a_repetitive_file_is_found_in_linear_time() -> None:
    # Comparing a slice at every line cost lines x hunk lines: 24 s here.
    content = "a\n" * 100_000 + "b\n"
    miss = Hunk(None, (*[HunkLine(" ", "a")] * 5_000, HunkLine("-", "c")))
    hit = Hunk(None, (*[HunkLine(" ", "a")] * 5_000, HunkLine("-", "b"), HunkLine("+", "c")))
    start = time.thread_time()
    with pytest.raises(PatchApplyError, match="this line is not in the file: 'c'"):
        apply_update("f", content, [miss])
    assert apply_update("f", content, [hit]) == "a\n" * 100_000 + "c\n"
    assert time.thread_time() - start < 1.0


def test_a_patch_that_would_search_too_much_is_refused_at_once() -> None:
    # Each hunk searches the whole file on the event loop: 1,000 hunks over 200,000 lines
    # took 42 s. Past MAX_PATCH_LINE_VISITS the patch is refused before any search.
    content = "".join(f"line {i}\n" for i in range(200_000))
    hunks = [
        Hunk(None, (HunkLine(" ", f"line {k * 1000}"), HunkLine("-", f"line {k * 1000 + 1}")))
        for k in range(20)
    ]
    start = time.thread_time()
    with pytest.raises(PatchApplyError, match=r"20 hunks over 200000 lines .* split it"):
        apply_update("big.txt", content, hunks)
    assert time.thread_time() - start < 0.5
    assert apply_update("big.txt", content, hunks[:10]).count("\n") == 200_000 - 10

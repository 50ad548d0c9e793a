from __future__ import annotations

import json
import shlex
import subprocess
import time

import pytest

from hermes_async.tools._search import (
    MAX_MATCH_CHARS,
    SearchRequest,
    build_search_script,
    parse_search_output,
    shell_path,
)


def _records(*rows: tuple[str, int, str, str]) -> str:
    return "\n".join(r if isinstance(r, str) else f"{r[0]}\0{r[1]}{r[3]}{r[2]}" for r in rows)


def test_truncated_result_is_valid_json_with_hint_inside() -> None:
    req = SearchRequest(pattern="x", limit=2)
    body = _records(("a.py", 1, "x1", ":"), ("a.py", 2, "x2", ":"), ("b.py", 9, "x3", ":"))
    result = parse_search_output(req, f"@engine grep\n@total 40\n{body}\n")
    text = json.dumps(result)
    assert json.loads(text) == {
        "total_count": 40,
        "matches": [
            {"path": "a.py", "line": 1, "content": "x1"},
            {"path": "a.py", "line": 2, "content": "x2"},
        ],
        "truncated": True,
        "hint": "Results truncated: showing matches 1-2 of 40. Use offset=2 to see more, or "
        "narrow the search (path, file_glob, a more specific pattern).",
    }


def test_paths_with_colons_dashes_and_digits() -> None:
    req = SearchRequest(pattern="x")
    body = _records(("dir:1-2/f 3:4.txt", 12, "a:b-c", ":"))
    result = parse_search_output(req, f"@engine rg\n@total 1\n./{body}\n")
    assert result["matches"] == [{"path": "dir:1-2/f 3:4.txt", "line": 12, "content": "a:b-c"}]


def test_context_lines_follow_the_selected_matches_only() -> None:
    req = SearchRequest(pattern="m", context=1, limit=1, offset=1)
    body = "\n".join(
        [
            "f\x001-c0",
            "f\x002:m1",
            "f\x003-c1",
            "--",
            "f\x009-c2",
            "f\x0010:m2",
            "f\x0011-c3",
        ]
    )
    result = parse_search_output(req, f"@engine grep\n@total 2\n{body}\n")
    assert result["matches"] == [
        {"path": "f", "line": 9, "content": "c2"},
        {"path": "f", "line": 10, "content": "m2"},
        {"path": "f", "line": 11, "content": "c3"},
    ]
    assert "truncated" not in result


def test_long_match_is_cut_and_offset_past_end_hints() -> None:
    req = SearchRequest(pattern="x")
    body = _records(("f", 1, "y" * (MAX_MATCH_CHARS + 50), ":"))
    (m,) = parse_search_output(req, f"@engine grep\n@total 1\n{body}\n")["matches"]
    assert m["content"] == "y" * MAX_MATCH_CHARS + "... [truncated]"
    far = parse_search_output(SearchRequest(pattern="x", offset=5), f"@total 1\n{body}\n")
    assert far["total_count"] == 1 and "past the last result" in far["hint"]


def test_files_target_sorted_newest_first_and_counts() -> None:
    req = SearchRequest(pattern="*.py", target="files")
    out = "@engine find\n10.5 ./old.py\n99.0 ./new.py\n50 ./a b.py\n"
    assert parse_search_output(req, out) == {
        "total_count": 3,
        "files": ["new.py", "a b.py", "old.py"],
    }
    req = SearchRequest(pattern="x", output_mode="count", limit=1)
    out = "@engine grep\nsrc/a:b.py:3\nc.py:0\nd.py:2\n"
    result = parse_search_output(req, out)
    assert result["total_count"] == 5 and result["counts"] == {"src/a:b.py": 3}
    assert result["truncated"] is True


@pytest.mark.parametrize(
    "path",
    ["plain.txt", "with space/and 'quote'.txt", 'dq"$(rm -rf x)`y`.txt', "ünï/cödé", "-rf"],
)
def test_shell_path_round_trips_through_the_shell(path: str) -> None:
    out = subprocess.run(
        ["sh", "-c", f"printf %s {shell_path(path)}"], capture_output=True, check=True
    )
    assert out.stdout.decode() == path


def test_shell_path_home() -> None:
    env = {"HOME": "/h o/me", "PATH": "/usr/bin:/bin"}
    for path, want in [("~", "/h o/me"), ("~/a b", "/h o/me/a b"), ("~x", "~x")]:
        out = subprocess.run(
            ["sh", "-c", f"printf %s {shell_path(path)}"], capture_output=True, check=True, env=env
        )
        assert out.stdout.decode() == want


def test_every_user_value_is_quoted() -> None:
    evil = "'; touch /tmp/pwned; echo '"
    req = SearchRequest(pattern=evil, path=evil, file_glob=evil)
    script = build_search_script(req)
    assert script.count(shlex.quote(evil)) >= 3
    assert "touch /tmp/pwned;" not in script.replace(shlex.quote(evil), "")


def test_context_lines_are_selected_in_linear_time() -> None:
    # Each context line was checked against every selected match: 6 s for a 1 MB output.
    rows = [("a", n, "t", ":" if n % 2 else "-") for n in range(1, 120_000)]
    req = SearchRequest(pattern="t", limit=1_000, context=20)
    start = time.thread_time()
    out = parse_search_output(req, "@engine grep\n" + _records(*rows))
    assert time.thread_time() - start < 1.0
    matches = out["matches"]
    assert isinstance(matches, list) and len(matches) == 1_000 + 999 + 10
    assert matches[-1] == {"path": "a", "line": 2_018, "content": "t"}

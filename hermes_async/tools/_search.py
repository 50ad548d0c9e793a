"""``search_files``: the shell command run inside the sandbox and the shaping of its output (pure).

One script per call, where the files are: ripgrep if present, else ``grep -r``, and
``find`` for names; user values pass through ``shlex.quote``. Content records are
``path\\0<line>:<text>``: a NUL, since paths may hold ``:``.
"""

from __future__ import annotations

import bisect
import shlex
from dataclasses import dataclass

from hermes_async.jsontypes import JSONObject

__all__ = [
    "MAX_MATCH_CHARS",
    "SearchRequest",
    "build_search_script",
    "parse_search_output",
    "shell_path",
]

#: A matched line longer than this is cut (minified files would otherwise flood the result).
MAX_MATCH_CHARS = 2_000
#: Upper bound on records read back from the sandbox for one page of results.
MAX_RECORD_LINES = 200_000
#: Bytes kept per output line inside the sandbox (4 bytes per char covers any UTF-8 text).
_LINE_BYTES = MAX_MATCH_CHARS * 4 + 4


def shell_path(path: str) -> str:
    """``path`` as one shell word, with a leading ``~`` / ``~/`` meaning ``$HOME`` (not ``~user``)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"/' + shlex.quote(rest) if rest else '"$HOME"/'
    return shlex.quote(path)


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """The validated arguments of one ``search_files`` call."""

    pattern: str
    target: str = "content"
    path: str = "."
    file_glob: str | None = None
    limit: int = 50
    offset: int = 0
    output_mode: str = "content"
    context: int = 0


def _name_test(pattern: str) -> str:
    """The ``find`` test for a file-name glob (``**/`` dropped; a ``/`` means a path glob)."""
    while pattern.startswith("**/"):
        pattern = pattern[3:]
    if "/" in pattern:
        if not pattern.startswith(("*", "/")):
            pattern = "*/" + pattern
        return "-path " + shlex.quote(pattern)
    return "-name " + shlex.quote(pattern or "*")


def build_search_script(req: SearchRequest) -> str:
    """The shell script that performs ``req`` inside the sandbox.

    It prints ``@engine`` and (content mode) ``@total`` lines, then the engine's capped
    records. ripgrep skips hidden and git-ignored files and uses Rust regexes; grep searches
    all but ``.git`` with POSIX ERE.
    """
    p = shell_path(req.path)
    missing = f'if [ ! -e {p} ]; then echo "@missing"; exit 0; fi\n'
    if req.target == "files":
        test = _name_test(req.pattern)
        prune = "\\( -name .git -type d -prune \\)"
        return (
            missing + "echo '@engine find'\n"
            f"if find {p} -maxdepth 0 -printf '' >/dev/null 2>&1; then\n"
            f"  find {p} {prune} -o -type f {test} -printf '%T@ %p\\n' 2>/dev/null"
            f" | head -n {MAX_RECORD_LINES}\n"
            "else\n"
            f"  find {p} {prune} -o -type f {test} -print 2>/dev/null | head -n {MAX_RECORD_LINES}\n"
            "fi\n"
        )
    pat = shlex.quote(req.pattern)
    glob = shlex.quote(req.file_glob) if req.file_glob else None
    rg_common = "rg --no-messages" + (f" --glob {glob}" if glob else "")
    grep_common = "grep -r -s -I -E --exclude-dir=.git" + (f" --include={glob}" if glob else "")
    ctx = max(0, req.context)
    if req.output_mode == "files_only":
        rg = f"{rg_common} -l -e {pat} -- {p} | head -n {MAX_RECORD_LINES}"
        grep = f"{grep_common} -l -e {pat} -- {p} | head -n {MAX_RECORD_LINES}"
        rg_total = grep_total = ""
    elif req.output_mode == "count":
        rg = f"{rg_common} -c --with-filename -e {pat} -- {p} | head -n {MAX_RECORD_LINES}"
        grep = f"{grep_common} -c -H -e {pat} -- {p} | grep -v ':0$' | head -n {MAX_RECORD_LINES}"
        rg_total = grep_total = ""
    else:
        wanted = (req.offset + req.limit + 1) * (2 * ctx + 2)
        cap = min(wanted, MAX_RECORD_LINES)
        c = f" -C {ctx}" if ctx else ""
        tail = f" | head -n {cap} | cut -b 1-{_LINE_BYTES}"
        rg = (
            f"{rg_common} --no-heading --line-number --with-filename --null{c} -e {pat} -- {p}"
            + tail
        )
        grep = f"{grep_common} -n -H -Z{c} -e {pat} -- {p}" + tail
        sum_ = "awk '{s+=$1} END {print \"@total \" s+0}'"
        rg_total = f"{rg_common} -c --no-filename -e {pat} -- {p} | {sum_}\n  "
        grep_total = f"{grep_common} -c -h -e {pat} -- {p} | {sum_}\n  "
    # Check the pattern first so a bad regex is reported (exit 2) rather than "no matches".
    return (
        missing + "if command -v rg >/dev/null 2>&1; then\n"
        f"  : | rg -e {pat} >/dev/null; [ $? -eq 2 ] && exit 2\n"
        "  echo '@engine rg'\n"
        f"  {rg_total}{rg}\n"
        "else\n"
        f"  : | grep -E -e {pat} >/dev/null; [ $? -eq 2 ] && exit 2\n"
        "  echo '@engine grep'\n"
        f"  {grep_total}{grep}\n"
        "fi\n"
    )


def _display_path(req: SearchRequest, path: str) -> str:
    if req.path in (".", "./") and path.startswith("./"):
        return path[2:]
    return path


def _cut(text: str) -> str:
    if len(text) > MAX_MATCH_CHARS:
        return text[:MAX_MATCH_CHARS] + "... [truncated]"
    return text


def _page_hint(req: SearchRequest, shown: int, total: int, what: str) -> str:
    first, last = req.offset + 1, req.offset + shown
    return (
        f"Results truncated: showing {what} {first}-{last} of {total}. "
        f"Use offset={req.offset + req.limit} to see more, or narrow the search "
        "(path, file_glob, a more specific pattern)."
    )


def _paged(req: SearchRequest, result: JSONObject, shown: int, total: int, what: str) -> None:
    if total > req.offset + shown and shown > 0:
        result["truncated"] = True
        result["hint"] = _page_hint(req, shown, total, what)
    elif shown == 0 and total > 0 and req.offset > 0:
        result["hint"] = f"offset={req.offset} is past the last result ({total} in total)."


def _files_page(req: SearchRequest, files: list[str]) -> JSONObject:
    """The result of a file listing: the requested page of ``files`` and the total."""
    page = files[req.offset : req.offset + req.limit]
    result: JSONObject = {"total_count": len(files)}
    if page:
        result["files"] = list(page)
    _paged(req, result, len(page), len(files), "files")
    return result


def parse_search_output(req: SearchRequest, stdout: str) -> JSONObject:
    """Turn the script's output into the tool's result object (always JSON-serializable).

    The pagination hint is a key of the object; the reference appended it after the JSON,
    which made the result invalid JSON.
    """
    lines = stdout.split("\n")
    if lines and lines[0] == "@missing":
        return {"total_count": 0, "error": f"Path not found: {req.path}"}
    body_start = 1 if lines and lines[0].startswith("@engine") else 0
    total: int | None = None
    if len(lines) > body_start and lines[body_start].startswith("@total "):
        try:
            total = int(lines[body_start].split()[1])
        except (IndexError, ValueError):
            total = None
        body_start += 1
    body = [x for x in lines[body_start:] if x]
    result: JSONObject
    if req.target == "files":
        entries: list[tuple[float, str]] = []
        for line in body:
            stamp, sep, path = line.partition(" ")
            try:
                mtime = float(stamp) if sep else None
            except ValueError:
                mtime = None
            if mtime is None:
                entries.append((0.0, line))
            else:
                entries.append((mtime, path))
        entries.sort(key=lambda e: (-e[0], e[1]))
        return _files_page(req, [_display_path(req, p) for _, p in entries])
    if req.output_mode == "files_only":
        return _files_page(req, [_display_path(req, x) for x in body])
    if req.output_mode == "count":
        counts: dict[str, int] = {}
        for line in body:
            path, sep, num = line.rpartition(":")
            if sep and num.isdigit() and int(num) > 0:
                counts[_display_path(req, path)] = int(num)
        items = list(counts.items())
        page_items = items[req.offset : req.offset + req.limit]
        result = {"total_count": sum(counts.values())}
        if page_items:
            result["counts"] = dict(page_items)
        _paged(req, result, len(page_items), len(items), "files")
        return result
    return _shape_matches(req, body, total)


def _shape_matches(req: SearchRequest, body: list[str], total: int | None) -> JSONObject:
    # (path, line, text, is_match, group)
    records: list[tuple[str, int, str, bool, int]] = []
    group = 0
    for line in body:
        if line == "--":
            group += 1
            continue
        path, nul, rest = line.partition("\0")
        if not nul:
            continue
        digits = 0
        while digits < len(rest) and rest[digits].isdigit():
            digits += 1
        if digits == 0 or digits >= len(rest) or rest[digits] not in ":-":
            continue
        records.append((path, int(rest[:digits]), rest[digits + 1 :], rest[digits] == ":", group))
    match_idx = [i for i, r in enumerate(records) if r[3]]
    selected = set(match_idx[req.offset : req.offset + req.limit])
    keep: list[int] = []
    if req.context > 0 and selected:
        # The selected matches' line numbers per (path, group), sorted: one bisect per
        # context line (a scan of all selected matches took seconds on a 1 MB output).
        chosen: dict[tuple[str, int], list[int]] = {}
        for i in sorted(selected):
            chosen.setdefault((records[i][0], records[i][4]), []).append(records[i][1])
        for nums in chosen.values():
            nums.sort()
        for i, (path, num, _, is_match, grp) in enumerate(records):
            if is_match:
                if i in selected:
                    keep.append(i)
                continue
            nums = chosen.get((path, grp), [])
            at = bisect.bisect_left(nums, num - req.context)
            if at < len(nums) and nums[at] <= num + req.context:
                keep.append(i)
    else:
        keep = sorted(selected)
    matches = [
        {
            "path": _display_path(req, records[i][0]),
            "line": records[i][1],
            "content": _cut(records[i][2]),
        }
        for i in keep
    ]
    found = total if total is not None else len(match_idx)
    found = max(found, len(match_idx))
    result: JSONObject = {"total_count": found}
    if matches:
        result["matches"] = matches
    _paged(req, result, len(selected), found, "matches")
    return result

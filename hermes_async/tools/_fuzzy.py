"""Find-and-replace for the ``patch`` tool's replace mode, tolerant of harmless differences (pure).

Strategies run from strictest to loosest; the first that finds a match decides, and a match
must be unique unless ``replace_all``. The strategies and why: docs/architecture.md, "Fuzzy
replace".
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hermes_async.tools._v4a import _PUNCT, _LineText

__all__ = ("ReplaceError", "fuzzy_replace")

#: Similarity the middle of a block must reach for the ``block_anchor`` strategy.
BLOCK_ANCHOR_MIN_SIMILARITY = 0.7
#: Characters the ``block_anchor`` strategy may compare in one call, over all the places it
#: tries; past it, it finds nothing. Its similarity test (difflib) is superlinear and runs on
#: the event loop: a 5,000-char middle tried at each line of a 100,000-line file took 80 s,
#: and one 20,000-char pair takes 0.5 s.
BLOCK_ANCHOR_MAX_CHARS = 40_000


class ReplaceError(ValueError):
    """No match, or several matches where one was required; the message is for the model."""


@dataclass(frozen=True, slots=True)
class _ReplaceResult:
    """The new content, how many places were replaced, and the strategy that matched."""

    content: str
    count: int
    strategy: str


_WS = re.compile(r"[ \t]+")


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _split_lines(text: str) -> list[str]:
    """Lines with their line endings, so offsets can be rebuilt exactly."""
    return text.splitlines(keepends=True)


def _core_lines(old: str) -> list[str]:
    lines = old.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


_LineNorm = Callable[[str], str]

_LINE_STRATEGIES: tuple[tuple[str, _LineNorm], ...] = (
    ("trailing_whitespace", lambda s: s.rstrip()),
    ("indentation", lambda s: s.strip()),
    ("whitespace_normalized", lambda s: _WS.sub(" ", s).strip()),
    ("unicode_normalized", lambda s: _WS.sub(" ", s.translate(_PUNCT)).strip()),
)


def _line_matches(
    file_lines: Sequence[str], old_lines: Sequence[str], norm: _LineNorm
) -> list[tuple[int, int]]:
    """Non-overlapping ``(first, end)`` line ranges where ``old_lines`` match under ``norm``."""
    n = len(old_lines)
    want = [norm(x) for x in old_lines]
    have = _LineText([norm(x.rstrip("\r\n")) for x in file_lines])
    found: list[tuple[int, int]] = []
    i = have.find(want)
    while i >= 0:
        found.append((i, i + n))
        i = have.find(want, i + n)
    return found


def _block_anchor(file_lines: Sequence[str], old_lines: Sequence[str]) -> list[tuple[int, int]]:
    n = len(old_lines)
    if n < 3:
        return []
    first, last = old_lines[0].strip(), old_lines[-1].strip()
    middle = "\n".join(x.strip() for x in old_lines[1:-1])
    have = [x.rstrip("\r\n").strip() for x in file_lines]
    ends = [0]  # ends[k]: length of the first k lines of ``have``, each with a newline
    for line in have:
        ends.append(ends[-1] + len(line) + 1)
    found = []
    work = 0
    for i in range(len(have) - n + 1):
        if have[i] == first and have[i + n - 1] == last:
            size = ends[i + n - 1] - ends[i + 1] - 1  # of the joined middle lines
            total = size + len(middle)
            if total and 2.0 * min(size, len(middle)) / total < BLOCK_ANCHOR_MIN_SIMILARITY:
                continue  # the lengths alone rule it out (difflib's real_quick_ratio)
            work += total
            if work > BLOCK_ANCHOR_MAX_CHARS:
                return []  # too costly to compare: no approximate match
            candidate = "\n".join(have[i + 1 : i + n - 1])
            ratio = difflib.SequenceMatcher(None, middle, candidate).ratio()
            if ratio >= BLOCK_ANCHOR_MIN_SIMILARITY:
                found.append((i, i + n))
    return found


def _reindent(new: str, old_indent: str, file_indent: str) -> str:
    if old_indent == file_indent:
        return new
    out = []
    for line in new.split("\n"):
        if line.strip() and line.startswith(old_indent):
            out.append(file_indent + line[len(old_indent) :])
        else:
            out.append(line)
    return "\n".join(out)


def _replace_line_ranges(
    content: str,
    file_lines: Sequence[str],
    ranges: Sequence[tuple[int, int]],
    old_lines: Sequence[str],
    new: str,
) -> str:
    offsets = [0]
    for line in file_lines:
        offsets.append(offsets[-1] + len(line))
    new_core = new[:-1] if new.endswith("\n") else new
    old_indent = _indent(old_lines[0])
    pieces = []
    pos = 0
    for first, end in ranges:
        start_off = offsets[first]
        last_line = file_lines[end - 1]
        end_off = offsets[end] - (len(last_line) - len(last_line.rstrip("\r\n")))
        pieces.append(content[pos:start_off])
        replacement = _reindent(new_core, old_indent, _indent(file_lines[first]))
        if "\r\n" in last_line:
            replacement = replacement.replace("\r\n", "\n").replace("\n", "\r\n")
        pieces.append(replacement)
        pos = end_off
    pieces.append(content[pos:])
    return "".join(pieces)


def _unescape(text: str) -> str:
    return text.replace("\\r\\n", "\n").replace("\\n", "\n").replace("\\t", "\t")


def _too_many(count: int, strategy: str) -> ReplaceError:
    how = "" if strategy == "exact" else f" (matching with {strategy.replace('_', ' ')})"
    return ReplaceError(
        f"Found {count} matches for old_string{how}; provide more context to make it unique, "
        "or set replace_all=true to replace every occurrence."
    )


def fuzzy_replace(content: str, old: str, new: str, *, replace_all: bool = False) -> _ReplaceResult:
    """Replace ``old`` by ``new`` in ``content`` with the first strategy that finds a match.

    Raises:
        ReplaceError: ``old`` is empty or equal to ``new``, not found, or found several times
            without ``replace_all``.
    """
    if old == "":
        raise ReplaceError(
            "old_string is empty; give the exact text to replace (use write_file to create "
            "or overwrite a whole file)."
        )
    if old == new:
        raise ReplaceError("old_string and new_string are identical; nothing would change.")

    count = content.count(old)
    if count:
        if count > 1 and not replace_all:
            raise _too_many(count, "exact")
        if replace_all:
            return _ReplaceResult(content.replace(old, new), count, "exact")
        return _ReplaceResult(content.replace(old, new, 1), 1, "exact")

    file_lines = _split_lines(content)
    attempts: list[tuple[str, str, str]] = [("", old, new)]
    if "\n" not in old and ("\\n" in old or "\\t" in old):
        attempts.append(("escape_normalized", _unescape(old), _unescape(new)))

    for prefix, old_try, new_try in attempts:
        if prefix and old_try in content:
            n = content.count(old_try)
            if n > 1 and not replace_all:
                raise _too_many(n, prefix)
            return _ReplaceResult(
                content.replace(old_try, new_try, -1 if replace_all else 1),
                n if replace_all else 1,
                prefix,
            )
        old_lines = _core_lines(old_try)
        if not old_lines:
            continue
        strategies: tuple[tuple[str, _LineNorm | None], ...] = (
            *_LINE_STRATEGIES,
            ("block_anchor", None),
        )
        for name, norm in strategies:
            if norm is None:
                ranges = _block_anchor(file_lines, old_lines)
            else:
                ranges = _line_matches(file_lines, old_lines, norm)
            if not ranges:
                continue
            label = f"{prefix}+{name}" if prefix else name
            if len(ranges) > 1 and not replace_all:
                raise _too_many(len(ranges), label)
            chosen = ranges if replace_all else ranges[:1]
            new_content = _replace_line_ranges(content, file_lines, chosen, old_lines, new_try)
            return _ReplaceResult(new_content, len(chosen), label)
    raise ReplaceError(
        "Could not find old_string in the file (tried exact, whitespace-, indentation- and "
        "punctuation-insensitive matching)."
    )

"""V4A patches: parse the text a model writes, apply its hunks to file contents (pure, no I/O)::

    *** Begin Patch
    *** Update File: src/app.py
    @@ def main():
    -    run(debug=True)
    +    run(debug=False)
    *** Delete File: old.txt
    *** End Patch

A hunk matches as consecutive lines, from the previous hunk or its ``@@`` hint, then
from the top, ever more lenient about whitespace and quotes.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

__all__ = [
    "FileOp",
    "Hunk",
    "HunkLine",
    "PatchApplyError",
    "PatchParseError",
    "apply_update",
    "parse_patch",
]


class PatchParseError(ValueError):
    """The patch text is not valid V4A; the message says which line and what was expected."""


#: Hunks x file lines one patch may search: each hunk searches the whole file, at up to four
#: levels of leniency, on the event loop (10 hunks over a 200,000-line file; ~1 s at worst).
MAX_PATCH_LINE_VISITS = 2_000_000


class PatchApplyError(ValueError):
    """A hunk does not match the file's current content; the message names file and line."""


@dataclass(frozen=True, slots=True)
class HunkLine:
    """One line of a hunk: ``kind`` is ``' '`` (context), ``'-'`` (removed) or ``'+'`` (added)."""

    kind: Literal[" ", "-", "+"]
    text: str


@dataclass(frozen=True, slots=True)
class Hunk:
    """A group of changes: an optional hint line, the lines, and an end-of-file anchor."""

    hint: str | None
    lines: tuple[HunkLine, ...]
    end_of_file: bool = False

    @property
    def old_lines(self) -> list[str]:
        """The lines the file must contain (context and removed, in order)."""
        return [line.text for line in self.lines if line.kind != "+"]

    @property
    def new_lines(self) -> list[str]:
        """The lines that replace them (context and added, in order)."""
        return [line.text for line in self.lines if line.kind != "-"]


@dataclass(frozen=True, slots=True)
class FileOp:
    """One file operation: ``hunks`` and ``move_to`` for an update, ``content`` for an add."""

    kind: Literal["add", "update", "delete"]
    path: str
    hunks: tuple[Hunk, ...] = ()
    content: str = ""
    move_to: str | None = None


_BEGIN = re.compile(r"^\*\*\*\s*Begin Patch\s*$")
_END = re.compile(r"^\*\*\*\s*End Patch\s*$")
_END_OF_FILE = re.compile(r"^\*\*\*\s*End of File\s*$")
# Only the fixed prefix of a header is a regex; its value is cut with str methods, since a
# lazy group before ``\s*$`` backtracks quadratically over a long run of spaces.
_UPDATE = re.compile(r"\*\*\*\s*Update File:")
_ADD = re.compile(r"\*\*\*\s*Add File:")
_DELETE = re.compile(r"\*\*\*\s*Delete File:")
_MOVE_TO = re.compile(r"\*\*\*\s*Move to:")
_MOVE_FILE = re.compile(r"\*\*\*\s*Move File:")


def _header(prefix: re.Pattern[str], stripped: str) -> str | None:
    """The value after a header ``prefix`` (``*** Update File: <value>``), or ``None``."""
    m = prefix.match(stripped)
    return (stripped[m.end() :].strip() or None) if m else None


def _move_file(stripped: str) -> tuple[str, str] | None:
    """``(from, to)`` of ``*** Move File: <from> -> <to>``, or ``None``."""
    value = _header(_MOVE_FILE, stripped)
    arrow = -1 if value is None else value.find("->", 1)
    if value is None or arrow < 0 or not value[arrow + 2 :].strip():
        return None
    return value[:arrow].strip(), value[arrow + 2 :].strip()


def _hunk_hint(line: str) -> str | None:
    """The hint of a ``@@ <hint> @@`` line ("" without one), or ``None`` if it is none."""
    if not line.startswith("@@"):
        return None
    hint = line[2:].strip()
    return hint[:-2].strip() if hint.endswith("@@") else hint


_FORMAT_HELP = (
    "Expected V4A: '*** Begin Patch', then '*** Update File: <path>' followed by hunks "
    "('@@' line, then lines starting with ' ', '-' or '+'), '*** Add File: <path>' followed by "
    "'+' lines, or '*** Delete File: <path>', and finally '*** End Patch'."
)


class _Builder:
    """Accumulates the operation being parsed."""

    def __init__(self) -> None:
        self.ops: list[FileOp] = []
        self.kind: Literal["add", "update", "delete"] | None = None
        self.path = ""
        self.move_to: str | None = None
        self.hunks: list[Hunk] = []
        self.hint: str | None = None
        self.lines: list[HunkLine] = []
        self.add_lines: list[str | None] = []  # None: a bare blank line (no '+')

    def close_hunk(self, *, end_of_file: bool = False) -> None:
        if self.lines:
            self.hunks.append(Hunk(self.hint, tuple(self.lines), end_of_file))
        self.hint = None
        self.lines = []

    def close_op(self) -> None:
        self.close_hunk()
        if self.kind == "update":
            self.ops.append(FileOp("update", self.path, tuple(self.hunks), move_to=self.move_to))
        elif self.kind == "add":
            while self.add_lines and self.add_lines[-1] is None:
                self.add_lines.pop()  # blank lines before the next marker are formatting
            body = [x or "" for x in self.add_lines]
            content = "\n".join(body) + ("\n" if body else "")
            self.ops.append(FileOp("add", self.path, content=content))
        self.kind = None
        self.hunks = []
        self.add_lines = []
        self.move_to = None

    def start(self, kind: Literal["add", "update", "delete"], path: str) -> None:
        self.close_op()
        if kind == "delete":
            self.ops.append(FileOp("delete", path))
            return
        self.kind = kind
        self.path = path


def parse_patch(text: str) -> list[FileOp]:
    """Parse V4A patch text into file operations.

    Also reads ``*** Add File:``, ``*** Move to:`` (a rename) and ``*** End of File`` (anchors
    a hunk at the end). Missing Begin/End markers, context lines without their space and
    ``\\ No newline at end of file`` are accepted, as the reference does.

    Raises:
        PatchParseError: No operation, an operation without path, an update without a hunk,
            or an ``Add File`` line without ``+``.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    start = 0
    for i, line in enumerate(lines):
        if _BEGIN.match(line.strip()):
            start = i + 1
            break
    b = _Builder()
    for number, line in enumerate(lines[start:], start=start + 1):
        stripped = line.strip()
        if _END.match(stripped):
            break
        if path := _header(_UPDATE, stripped):
            b.start("update", path)
        elif path := _header(_ADD, stripped):
            b.start("add", path)
        elif path := _header(_DELETE, stripped):
            b.start("delete", path)
        elif move := _move_file(stripped):
            b.start("update", move[0])
            b.move_to = move[1]
        elif path := _header(_MOVE_TO, stripped):
            if b.kind != "update":
                raise PatchParseError(
                    f"line {number}: '*** Move to:' must follow '*** Update File: <path>'. "
                    + _FORMAT_HELP
                )
            b.move_to = path
        elif _END_OF_FILE.match(stripped):
            if b.kind == "update":
                b.close_hunk(end_of_file=True)
        elif b.kind == "update" and (hint := _hunk_hint(line)) is not None:
            b.close_hunk()
            b.hint = hint or None
        elif b.kind == "update":
            if line.startswith("\\"):
                continue  # "\ No newline at end of file"
            if line[:1] in ("+", "-", " "):
                kind: Literal[" ", "-", "+"] = line[0]  # type: ignore[assignment]
                b.lines.append(HunkLine(kind, line[1:]))
            else:
                # A context line whose leading space the model dropped (or a blank line).
                b.lines.append(HunkLine(" ", line))
        elif b.kind == "add":
            if line.startswith("+"):
                b.add_lines.append(line[1:])
            elif line == "":
                b.add_lines.append(None)
            else:
                raise PatchParseError(
                    f"line {number}: every line of '*** Add File: {b.path}' must start with "
                    f"'+', got {line[:80]!r}"
                )
        elif stripped:
            raise PatchParseError(
                f"line {number}: unexpected {line[:80]!r} outside a file section. " + _FORMAT_HELP
            )
    b.close_op()
    if not b.ops:
        raise PatchParseError("the patch contains no file operation. " + _FORMAT_HELP)
    for op in b.ops:
        if not op.path:
            raise PatchParseError(f"a '*** {op.kind.title()} File:' line has no path")
        if op.kind == "update" and not op.hunks and op.move_to is None:
            raise PatchParseError(
                f"'*** Update File: {op.path}' has no hunk: add '@@' and lines starting with "
                "' ', '-' or '+'"
            )
    # Trailing blank context lines are usually an artifact of the model's formatting.
    return [_trim_op(op) for op in b.ops]


def _trim_op(op: FileOp) -> FileOp:
    if op.kind != "update":
        return op
    hunks = []
    for hunk in op.hunks:
        lines = list(hunk.lines)
        while lines and lines[-1].kind == " " and lines[-1].text.strip() == "":
            lines.pop()
        if lines:
            hunks.append(Hunk(hunk.hint, tuple(lines), hunk.end_of_file))
    return FileOp(op.kind, op.path, tuple(hunks), op.content, op.move_to)


# --------------------------------------------------------------------------------------------
# Applying


_PUNCT = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u201f": '"',
        "\u2010": "-",
        "\u2011": "-",
        "\u2012": "-",
        "\u2013": "-",
        "\u2014": "-",
        "\u2015": "-",
        "\u2212": "-",
        "\u00a0": " ",
        "\u2009": " ",
        "\u202f": " ",
    }
)

#: Line normalizations tried in order, strictest first.
_LEVELS: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("exact", lambda s: s),
    ("trailing whitespace", str.rstrip),
    ("surrounding whitespace", str.strip),
    ("unicode punctuation", lambda s: s.translate(_PUNCT).strip()),
)


def _past_newline(offset: int, length: int) -> int:
    return offset + length + 1


class _LineText:
    """Lines without newlines, joined so that a run of whole lines is found by ``str.find``.

    Comparing a slice at every index costs len(lines) x len(block) on a repetitive file
    (minutes for a 5,000-line block in a 100,000-line file); one ``find`` is linear.
    """

    def __init__(self, lines: Sequence[str]) -> None:
        self.count = len(lines)
        self.text = "\n" + "\n".join(lines) + "\n"
        # The offset of the newline before each line, summed in C (a Python loop and an index
        # of them cost 40 ms a hunk on a 200,000-line file).
        self.starts = list(accumulate(map(len, lines), _past_newline, initial=0))

    def find(self, block: Sequence[str], start: int = 0) -> int:
        """The first ``i >= start`` with ``lines[i : i + len(block)] == block``, or -1."""
        if not block or len(block) > self.count or start >= self.count:
            return -1
        if any("\n" in x for x in block):
            return -1  # no line holds a newline
        at = self.text.find("\n" + "\n".join(block) + "\n", self.starts[max(start, 0)])
        return -1 if at < 0 else bisect_left(self.starts, at)  # every newline starts a line


def _find_block(lines: Sequence[str], block: Sequence[str], start: int, *, eof: bool) -> int:
    """Index where ``block`` occurs in ``lines`` (searching from ``start``, then from 0), or -1."""
    n = len(block)
    for name, norm in _LEVELS:
        want = [norm(x) for x in block]
        if eof and len(lines) >= n and [norm(x) for x in lines[len(lines) - n :]] == want:
            return len(lines) - n
        normed = _LineText(lines if name == "exact" else list(map(norm, lines)))
        found = normed.find(want, start)
        if found < 0:
            found = normed.find(want)
        if found >= 0:
            return found
    return -1


def _find_hint(lines: Sequence[str], hint: str, start: int) -> int:
    target = hint.strip()
    for lo, hi in ((start, len(lines)), (0, start)):
        for i in range(lo, hi):
            if lines[i].strip() == target:
                return i
    for lo, hi in ((start, len(lines)), (0, start)):
        for i in range(lo, hi):
            if target in lines[i]:
                return i
    return -1


def _explain_miss(path: str, number: int, hunk: Hunk, lines: Sequence[str]) -> str:
    present = {x.strip() for x in lines}
    old = hunk.old_lines
    missing = next((x for x in old if x.strip() not in present), None)
    where = f"hunk {number}" + (f" (@@ {hunk.hint})" if hunk.hint else "")
    if missing is not None:
        detail = f"this line is not in the file: {missing!r}"
    else:
        detail = (
            f"its {len(old)} context/removed lines exist but not consecutively in this order "
            f"(first line: {old[0]!r})"
        )
    return (
        f"Could not apply {where} to {path}: {detail}. Use read_file to see the current "
        "content, then retry with context lines copied exactly."
    )


def apply_update(path: str, content: str, hunks: Sequence[Hunk]) -> str:
    """Apply ``hunks`` to ``content`` (the file named ``path``) and return the new content.

    ``\\r\\n`` endings and a missing final newline are kept.

    Raises:
        PatchApplyError: A hunk does not match; names the file, the hunk and the missing line.
    """
    crlf = "\r\n" in content
    text = content.replace("\r\n", "\n") if crlf else content
    trailing_newline = text.endswith("\n") or text == ""
    lines = (text[:-1] if text.endswith("\n") else text).split("\n") if text else []
    if len(hunks) * len(lines) > MAX_PATCH_LINE_VISITS:
        raise PatchApplyError(
            f"{path}: {len(hunks)} hunks over {len(lines)} lines is more than one patch may "
            f"search ({MAX_PATCH_LINE_VISITS:,} hunk-lines); split it into smaller patches, "
            "or rewrite the file with write_file"
        )
    cursor = 0
    for number, hunk in enumerate(hunks, start=1):
        old, new = hunk.old_lines, hunk.new_lines
        anchor = _find_hint(lines, hunk.hint, cursor) if hunk.hint else -1
        if not old:
            # Pure insertion: after the hint line, or at the end of the file.
            pos = anchor + 1 if anchor >= 0 and not hunk.end_of_file else len(lines)
        else:
            pos = _find_block(lines, old, anchor if anchor >= 0 else cursor, eof=hunk.end_of_file)
            if pos < 0:
                raise PatchApplyError(_explain_miss(path, number, hunk, lines))
        # Context lines keep the file's text (a fuzzy match must not rewrite what the model
        # meant to leave alone); removed lines go, added lines come from the hunk.
        replacement: list[str] = []
        j = pos
        for line in hunk.lines:
            if line.kind == "+":
                replacement.append(line.text)
            else:
                if line.kind == " ":
                    replacement.append(lines[j])
                j += 1
        lines[pos : pos + len(old)] = replacement
        cursor = pos + len(new)
    out = "\n".join(lines) + ("\n" if trailing_newline and lines else "")
    return out.replace("\n", "\r\n") if crlf else out

"""Accessibility snapshots for the model: stable ``@eN`` refs, a compact view, a length cap.

:class:`RefTable` renames Playwright's per-document refs (``f2e3``) to the reference's
``e1, e2, ...``, stable within a document. Pure, so tested without a browser.
"""

from __future__ import annotations

import re

__all__ = (
    "TRUNCATION_MARKER",
    "RefTable",
    "compact_snapshot",
    "cut_snapshot",
    "parse_ref",
)

#: Appended to a cut snapshot (the reference's marker).
TRUNCATION_MARKER = "\n\n[... content truncated ...]"

_REF = re.compile(r"\[ref=([A-Za-z0-9_-]+)\]")
_PREFIX = re.compile(r"^(.*?)e\d+$")
_MODEL_REF = re.compile(r"^\s*(?:\[ref=)?@?e(\d+)\]?\s*$")
_STRUCTURAL = frozenset({"generic", "group", "none", "presentation", "rowgroup"})
# "- generic [ref=e5]:" or "- group [active]" - a role, attributes in brackets, nothing else.
_BARE_NODE = re.compile(r"^- ([a-z]+)((?: \[[^\]\"]*\])*):?$")
_CURSOR = re.compile(r" \[cursor=[a-z-]+\]")
#: Refs remembered per document before the table starts over (a page that keeps adding
#: elements must not grow it without bound).
_MAX_REFS = 50_000


def parse_ref(ref: str) -> int | None:
    """The number in a model-written ref (``@e5``, ``e5``, ``[ref=e5]``), or ``None``."""
    match = _MODEL_REF.match(ref) if isinstance(ref, str) else None
    return int(match.group(1)) if match else None


class RefTable:
    """Stable ``eN`` names for Playwright's refs, one numbering per main document."""

    __slots__ = ("_document", "_next", "_to_model", "_to_page")

    def __init__(self) -> None:
        self._to_model: dict[str, int] = {}
        self._to_page: dict[int, str] = {}
        self._next = 1
        self._document: str | None = None

    def _reset(self, document: str | None) -> None:
        self._to_model.clear()
        self._to_page.clear()
        self._next = 1
        self._document = document

    def rewrite(self, snapshot: str) -> tuple[str, int]:
        """Rename the refs of ``snapshot``; return the new text and the number of elements.

        A new prefix on the first ref (the root element) means a new document: numbering restarts.
        """
        refs = _REF.findall(snapshot)
        document = None
        if refs:
            match = _PREFIX.match(refs[0])
            document = match.group(1) if match else refs[0]
        if document != self._document or len(self._to_model) > _MAX_REFS:
            self._reset(document)

        def rename(match: re.Match[str]) -> str:
            page_ref = match.group(1)
            number = self._to_model.get(page_ref)
            if number is None:
                number = self._next
                self._next += 1
                self._to_model[page_ref] = number
                self._to_page[number] = page_ref
            return f"[ref=e{number}]"

        return _REF.sub(rename, snapshot), len(set(refs))

    def resolve(self, ref: str) -> str | None:
        """Playwright's ref for a model-written ref, or ``None`` if it names no known element."""
        number = parse_ref(ref)
        return None if number is None else self._to_page.get(number)


def compact_snapshot(snapshot: str) -> str:
    """Drop unnamed layout containers (children move up a level) and cursor hints."""
    out: list[str] = []
    dropped: list[int] = []  # indents of the dropped ancestors of the current line
    for line in snapshot.splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        while dropped and indent <= dropped[-1]:
            dropped.pop()
        node = _BARE_NODE.match(stripped)
        if node is not None and node.group(1) in _STRUCTURAL:
            dropped.append(indent)
            continue
        shift = min(indent, 2 * len(dropped))
        out.append(" " * (indent - shift) + _CURSOR.sub("", stripped))
    return "\n".join(out)


def cut_snapshot(snapshot: str, max_chars: int) -> str:
    """``snapshot`` if it fits in ``max_chars``, else its head cut at a line end + the marker."""
    if len(snapshot) <= max_chars:
        return snapshot
    head = snapshot[:max_chars]
    newline = head.rfind("\n")
    if newline >= max_chars * 0.8:  # cut at a line end unless that loses too much
        head = head[:newline]
    return head + TRUNCATION_MARKER

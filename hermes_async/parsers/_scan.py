"""Incremental lexing primitives: marker search with partial-marker hold-back, JSON scanning.

Both work on one chunk at a time and keep whatever state they need between chunks, so the total
work for a stream is linear in its length: a chunk is scanned once, plus at most a marker's
length of held-back text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from hermes_async._json import MAX_JSON_DEPTH, scrub_text

__all__ = ["PARTIAL", "JsonScanner", "Markers"]

#: ``Markers.match_at`` result: the text ends inside a marker spelling; wait for more.
PARTIAL = "\x00partial"


class Markers:
    """Literal marker spellings mapped to roles; the longest spelling wins at one position."""

    __slots__ = ("_find", "_first", "_spellings", "max_len", "roles")

    def __init__(self, spellings: Mapping[str, str]) -> None:
        self.roles: dict[str, str] = dict(spellings)
        ordered = sorted(self.roles, key=len, reverse=True)
        self._spellings = tuple(ordered)
        self._find = re.compile("|".join(re.escape(s) for s in ordered))
        firsts = sorted({s[0] for s in ordered if len(s) > 1})
        self._first = (
            re.compile("[" + "".join(re.escape(c) for c in firsts) + "]") if firsts else None
        )
        self.max_len = max(len(s) for s in ordered)

    def search(self, s: str, i: int) -> re.Match[str] | None:
        """The earliest full marker in ``s[i:]``."""
        return self._find.search(s, i)

    def free_end(self, s: str, i: int, eof: bool) -> int:
        """How far ``s[i:]``, which holds no full marker, can be released (all of it at eof)."""
        return len(s) if eof else self.safe_end(s, i)

    def safe_end(self, s: str, i: int) -> int:
        """Index up to which ``s[i:]`` holds no start of a marker that may continue later.

        Assumes ``search`` found no full marker in ``s[i:]``.
        """
        first = self._first
        if first is None:
            return len(s)
        n = len(s)
        for m in first.finditer(s, max(i, n - self.max_len + 1)):
            tail = s[m.start() :]
            for spelling in self._spellings:
                if spelling.startswith(tail):
                    return m.start()
        return n

    def match_at(self, s: str, i: int, eof: bool = False) -> tuple[str, int] | str | None:
        """Which marker starts exactly at ``s[i]``: ``(role, end)``, :data:`PARTIAL`, or None.

        Before the end of the stream, a longer spelling the text may still complete wins over a
        shorter full match, so the answer does not depend on where a chunk ends.
        """
        partial = False
        for spelling in self._spellings:
            if s.startswith(spelling, i):
                if partial and not eof:
                    return PARTIAL
                return self.roles[spelling], i + len(spelling)
            if not partial and len(s) - i < len(spelling) and spelling.startswith(s[i:]):
                partial = True
        return PARTIAL if partial and not eof else None


_WS = " \t\r\n"
_SCALAR_START = "-0123456789tfnNI"
_STRING_STOP = re.compile(r'["\\]')
#: A JSON string body without these is its own value (no escape; no control character, which
#: JSON refuses unescaped).
_NEEDS_DECODING = re.compile(r"[\x00-\x1f\\]")
_DEEP_CACHE: dict[str, re.Pattern[str]] = {}

# States of the top-level (depth 1) object, tracked to find the name and arguments early.
_KEY_OR_END = 0
_KEY = 1
_COLON = 2
_VALUE = 3
_SCALAR = 4
_COMMA_OR_END = 5
# Roles of a string at depth 1.
_ROLE_KEY = 0
_ROLE_NAME = 1
_ROLE_VALUE = 2


def _deep_pattern(interrupts: str) -> re.Pattern[str]:
    pattern = _DEEP_CACHE.get(interrupts)
    if pattern is None:
        chars = '"{}[]' + interrupts
        pattern = re.compile("[" + "".join(re.escape(c) for c in chars) + "]")
        _DEEP_CACHE[interrupts] = pattern
    return pattern


class JsonScanner:
    """Finds where one JSON object ends, chunk by chunk, and spots its name and arguments.

    Tracks only depth, in-string and escape state, plus the top-level keys, so ``name`` is
    known once its string closes. Inside strings a regex jumps between quotes and
    backslashes, so ``</tool_call>`` in a string is text. ``json.loads`` validates at the end.

    The scan stops early (``stopped``) on a character that cannot continue the object, or on
    one of ``interrupts`` outside a string (``<`` starts a closing marker, never JSON). Past
    :data:`~hermes_async._json.MAX_JSON_DEPTH` it sets ``too_deep``: do not ``json.loads`` it.
    """

    __slots__ = (
        "_cap",
        "_deep",
        "_frag_all",
        "_interrupts",
        "_key",
        "_role",
        "_state",
        "args_keys",
        "args_seen",
        "depth",
        "done",
        "esc",
        "frags",
        "in_args",
        "in_str",
        "name",
        "name_keys",
        "parts",
        "stopped",
        "too_deep",
    )

    def __init__(
        self,
        *,
        name_keys: frozenset[str] = frozenset(),
        args_keys: frozenset[str] = frozenset(),
        interrupts: str = "",
        whole_is_arguments: bool = False,
    ) -> None:
        self.name_keys = name_keys
        self.args_keys = args_keys
        self._interrupts = interrupts
        self._deep = _deep_pattern(interrupts)
        self._frag_all = whole_is_arguments
        self.depth = 0
        self.in_str = False
        self.esc = False
        self.done = False
        self.stopped = False
        self.too_deep = False
        self.parts: list[str] = []
        self.frags: list[str] = []
        self.name: str | None = None
        self.args_seen = False
        self.in_args = False
        self._state = _KEY_OR_END
        self._role = _ROLE_VALUE
        self._key: str | None = None
        self._cap: list[str] | None = None

    def text(self) -> str:
        """Everything scanned so far."""
        return "".join(self.parts)

    def scan(self, s: str, i: int) -> int:
        """Consume ``s[i:]`` until the object is complete or the text runs out.

        Returns:
            The index after the last consumed character (at the offending one when ``stopped``).
        """
        n = len(s)
        start = i
        self.stopped = False
        # The hot state in locals (written back after the loop); searches bound once.
        depth, in_str, esc = self.depth, self.in_str, self.esc
        string_stop = _STRING_STOP.search
        deep = self._deep.search
        fs = i if self.in_args else -1
        cs = i if self._cap is not None else -1
        while i < n:
            if in_str:
                if esc:
                    esc = False
                    i += 1
                    continue
                m = string_stop(s, i)
                if m is None:
                    i = n
                    break
                j = m.start()
                if s[j] == "\\":
                    if j + 1 < n:
                        i = j + 2
                    else:
                        esc = True
                        i = n
                    continue
                in_str = False
                i = j + 1
                if depth == 1:
                    value: str | None = None
                    if self._cap is not None:
                        self._cap.append(s[cs:j])
                        cs = -1
                        raw = "".join(self._cap)
                        if _NEEDS_DECODING.search(raw) is None:  # what json.loads would give
                            value = scrub_text(raw)
                        else:
                            try:
                                value = scrub_text(json.loads('"' + raw + '"'))
                            except ValueError:
                                value = None
                        self._cap = None
                    if self._role == _ROLE_KEY:
                        self._key = value
                        self._state = _COLON
                    else:
                        if self._role == _ROLE_NAME and value is not None and self.name is None:
                            self.name = value
                        if self.in_args:
                            self._frag(s, fs, i)
                            fs = -1
                            self.in_args = False
                        self._state = _COMMA_OR_END
                continue
            if depth >= 2:
                m = deep(s, i)
                if m is None:
                    i = n
                    break
                j = m.start()
                c = s[j]
                if c == '"':
                    in_str = True
                elif c == "{" or c == "[":
                    depth += 1
                    if depth > MAX_JSON_DEPTH:
                        self.too_deep = True
                elif c == "}" or c == "]":
                    depth -= 1
                    if depth == 1:
                        if self.in_args:
                            self._frag(s, fs, j + 1)
                            fs = -1
                            self.in_args = False
                        self._state = _COMMA_OR_END
                else:  # an interrupt character outside a string
                    self.stopped = True
                    i = j
                    break
                i = j + 1
                continue
            c = s[i]
            state = self._state
            if c in _WS:
                if depth == 1 and state == _SCALAR:
                    self._end_scalar(s, fs, i)
                    fs = -1
                i += 1
                continue
            if depth == 0:
                if c == "{":
                    depth = 1
                    self._state = _KEY_OR_END
                    i += 1
                    continue
                self.stopped = True
                break
            if state == _SCALAR:
                if c == "," or c == "}":
                    self._end_scalar(s, fs, i)
                    fs = -1
                    state = _COMMA_OR_END
                elif c in self._interrupts or c in '"{[]':
                    self.stopped = True
                    break
                else:
                    i += 1
                    continue
            if c == "}" and state in (_KEY_OR_END, _COMMA_OR_END):
                depth = 0
                self.done = True
                i += 1
                break
            if state in (_KEY_OR_END, _KEY):
                if c == '"':
                    in_str = True
                    self._role = _ROLE_KEY
                    self._cap = []
                    cs = i + 1
                else:
                    self.stopped = True
                    break
            elif state == _COLON:
                if c != ":":
                    self.stopped = True
                    break
                self._state = _VALUE
            elif state == _VALUE:
                key = self._key
                if key is not None and key in self.args_keys:
                    self.args_seen = True
                    self.in_args = True
                    fs = i
                if c == '"':
                    in_str = True
                    if key is not None and key in self.name_keys and self.name is None:
                        self._role = _ROLE_NAME
                        self._cap = []
                        cs = i + 1
                    else:
                        self._role = _ROLE_VALUE
                elif c == "{" or c == "[":
                    depth = 2
                elif c in _SCALAR_START:
                    self._state = _SCALAR
                else:
                    self.in_args = False
                    self.stopped = True
                    break
            else:  # _COMMA_OR_END
                if c != ",":
                    self.stopped = True
                    break
                self._state = _KEY
            i += 1
        self.depth, self.in_str, self.esc = depth, in_str, esc
        if i > start:
            self.parts.append(s[start:i])
            if self._frag_all:
                self.frags.append(s[start:i])
            elif self.in_args and fs >= 0 and i > fs:
                self.frags.append(s[fs:i])
            if self._cap is not None and cs >= 0 and i > cs:
                self._cap.append(s[cs:i])
        return i

    def _frag(self, s: str, fs: int, end: int) -> None:
        if not self._frag_all and fs >= 0 and end > fs:
            self.frags.append(s[fs:end])

    def _end_scalar(self, s: str, fs: int, end: int) -> None:
        if self.in_args:
            self._frag(s, fs, end)
            self.in_args = False
        self._state = _COMMA_OR_END

"""The one streaming engine every tool-call format runs on.

A format is a :class:`Format`: a few marker spellings plus a call-body spec from
:mod:`hermes_async.parsers._bodies`. :class:`ToolCallParser` keeps all per-stream state,
lexes text outside calls in modes ``CONTENT``, ``THINK``, ``SECTION`` and ``CALL``, and
hands the text inside a call to a fresh body state machine.

Invariant: work per chunk is linear in the chunk plus at most one marker of held-back
text, however the stream is cut. :meth:`ToolCallParser.parse` is ``feed`` + ``finish`` on
a fresh parser, so the whole-text and streaming paths cannot disagree.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hermes_async._json import scrub_text
from hermes_async.jsontypes import JSONObject
from hermes_async.parsers._bodies import Body, BodySpec
from hermes_async.parsers._scan import Markers
from hermes_async.parsers._values import ToolSchemas, new_call_id, new_mistral_id
from hermes_async.parsers.types import (
    ArgumentsDelta,
    ContentDelta,
    FunctionCall,
    ParseResult,
    ParserEvent,
    ToolCall,
    ToolCallInvalid,
    ToolCallSealed,
    ToolCallStart,
    ToolCallTruncated,
)

if TYPE_CHECKING:  # typing only: importing the parsers must not import the inference layer
    from hermes_async.inference.tokenizer import Tokenizer

__all__ = ["Format", "ToolCallParser"]

_CONTENT, _THINK, _SECTION, _CALL = range(4)
#: Most chunks the deferred-scan fast path holds before scanning anyway (bounds how late an
#: argument preview fragment can be; at one token per chunk, about 540 characters; sealing is
#: never deferred: a `}` or a closing marker's first character wakes the scan at once).
_LAZY_MAX_CHUNKS = 128
#: The text re-lexed after rejected bare-JSON candidates is capped at this many times the
#: stream offset plus ``_RELEX_FREE_CHARS`` (see ``ToolCallParser.reject``).
_RELEX_FACTOR = 4
_RELEX_FREE_CHARS = 4096
#: A lexer step that consumes nothing must change state, and no chain of such steps is longer
#: than a few (content -> call -> object -> junk -> content); past this many in a row the engine
#: forces progress itself (see ``_force_progress``) rather than trust a body.
_MAX_STALLED_STEPS = 16


@dataclass(frozen=True, slots=True)
class Format:
    """A declarative description of one tool-call format.

    Attributes:
        drop: Markers removed from content without meaning (Llama's ``<|python_tag|>``).
        keep_call_open: The opening marker is part of the body (a bare ``{``).
        short_ids: 9-character alphanumeric ids (Mistral) instead of ``call_<24 hex>``.
        separators: Characters that alone do not make content once calls were found.
    """

    name: str
    body: BodySpec
    call_open: tuple[str, ...]
    section_open: tuple[str, ...] = ()
    section_close: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    think: tuple[str, str] | None = ("<think>", "</think>")
    keep_call_open: bool = False
    short_ids: bool = False
    separators: str = ""


@dataclass(frozen=True, slots=True)
class _Compiled:
    content: Markers
    content_first: re.Pattern[str]
    think_close: Markers | None
    section: Markers | None
    spellings: tuple[str, ...]


@functools.lru_cache(maxsize=64)
def _compile(fmt: Format) -> _Compiled:
    content: dict[str, str] = {}
    for spelling in fmt.drop:
        content[spelling] = "drop"
    for spelling in fmt.section_open:
        content[spelling] = "section"
    for spelling in fmt.call_open:
        content[spelling] = "call"
    think_close = None
    if fmt.think is not None:
        content[fmt.think[0]] = "think"
        think_close = Markers({fmt.think[1]: "close"})
    section = None
    if fmt.section_open:
        section = Markers(
            {**{s: "close" for s in fmt.section_close}, **{s: "call" for s in fmt.call_open}}
        )
    spellings = (
        *fmt.call_open,
        *fmt.section_open,
        *fmt.section_close,
        *fmt.drop,
        *(fmt.think or ()),
        *fmt.body.spellings(),
    )
    first = re.compile("[" + "".join(sorted({re.escape(s[0]) for s in content})) + "]")
    return _Compiled(Markers(content), first, think_close, section, spellings)


class _Attempt:
    __slots__ = ("id", "index", "name", "started")

    def __init__(self, call_id: str) -> None:
        self.id = call_id
        self.index: int | None = None
        self.name: str | None = None
        self.started = False


class ToolCallParser:
    """A streaming tool-call parser for one model output (one assistant turn).

    Feed decoded text as it arrives and call :meth:`finish` once; one parser per stream.
    Text must spell special tokens out; if your decoder drops them, pass ``token_ids`` and a
    ``tokenizer`` so markers that came only as ids are put back.

    Args:
        tools: OpenAI-style tool definitions; the XML formats type values from them.
        schemas: Pre-built schemas (internal; lets :meth:`parse` skip rebuilding them).

    Raises:
        TypeError: Neither ``fmt`` nor the class's :attr:`FORMAT`.
    """

    #: The format a registered subclass runs (None on this base class).
    FORMAT: ClassVar[Format | None] = None

    __slots__ = (
        "_attempt",
        "_body",
        "_c",
        "_call_at",
        "_calls",
        "_finished",
        "_held",
        "_id_floor",
        "_invalid",
        "_marker_ids",
        "_mode",
        "_new_id",
        "_next_index",
        "_offset",
        "_others",
        "_out",
        "_parent",
        "_pending",
        "_relex",
        "_relexed",
        "_result",
        "_segments",
        "_tokenizer",
        "_tools",
        "_truncated",
        "_wake",
        "_wake2",
        "format",
        "schemas",
    )

    def __init__(
        self,
        fmt: Format | None = None,
        *,
        tools: Sequence[JSONObject] | None = None,
        tokenizer: Tokenizer | None = None,
        schemas: ToolSchemas | None = None,
    ) -> None:
        if fmt is None:
            fmt = self.FORMAT
            if fmt is None:
                raise TypeError(
                    f"{type(self).__name__} has no format: pass a Format, or subclass "
                    "ToolCallParser with FORMAT = Format(...)"
                )
        self.format = fmt
        self._tools = tools
        self._tokenizer = tokenizer
        self.schemas = schemas if schemas is not None else ToolSchemas(tools)
        self._c = _compile(fmt)
        self._marker_ids: dict[int, str] = {}
        self._others: frozenset[int] | None = None
        if tokenizer is not None:
            specials = tokenizer.special_tokens
            self._marker_ids = {specials[s]: s for s in self._c.spellings if s in specials}
        # Chunks whose ids are all below this hold no marker id (a cheap test per feed).
        self._id_floor = min(self._marker_ids, default=1 << 62)
        self._new_id = new_mistral_id if fmt.short_ids else new_call_id
        self._mode = _CONTENT
        self._parent = _CONTENT
        self._held = ""
        self._body: Body | None = None
        self._relex: str | None = None
        # Stream offset of the next text to lex, where the current call opened, and how much
        # text was lexed again (bare-JSON candidates that were not JSON; see reject()).
        self._offset = 0
        self._call_at = 0
        self._relexed = 0
        self._out: list[ParserEvent] = []
        self._segments: list[list[str]] = [[]]
        self._calls: list[ToolCall] = []
        self._invalid: list[ToolCallInvalid] = []
        self._truncated: list[ToolCallTruncated] = []
        self._attempt: _Attempt | None = None
        self._next_index = 0
        self._finished = False
        self._result: ParseResult | None = None
        # Deferred-scan fast path (see feed()): wake characters, and the chunks deferred.
        self._wake: str | None = None
        self._wake2 = ""
        self._pending: list[str] = []

    @property
    def name(self) -> str:
        """The format's registry name."""
        return self.format.name

    # ------------------------------------------------------------------ public API

    def parse(self, text: str) -> ParseResult:
        """Parse a whole output at once (a fresh stream: ``feed(text)`` then ``finish()``).

        Does not touch this parser's own streaming state.
        """
        parser = ToolCallParser(
            self.format, tools=self._tools, tokenizer=self._tokenizer, schemas=self.schemas
        )
        parser.feed(text)
        return parser.finish()

    def feed(self, text: str, token_ids: Sequence[int] | None = None) -> list[ParserEvent]:
        """Add the next piece of the output; return the events it completes.

        A :class:`ToolCallSealed` is final: dispatch it at once.

        Raises:
            ValueError: :meth:`finish` was already called.
        """
        wake = self._wake
        if (
            wake is not None
            and wake not in text
            and self._wake2 not in text
            and (
                not token_ids
                or (token_ids[0] if len(token_ids) == 1 else max(token_ids)) < self._id_floor
            )
        ):
            # Fast path, inside a started call's JSON: a chunk without '}' cannot end the
            # object and one without the closing marker's first character cannot start the
            # marker, so its scan can wait for the next chunk that has one (or a few dozen
            # chunks). Same characters, same order, same results; argument preview fragments
            # just arrive coalesced. This keeps one-token feeds cheap. (Never set once
            # finished.)
            pending = self._pending
            pending.append(text)
            if len(pending) < _LAZY_MAX_CHUNKS:
                return []
            text, token_ids = "", None
        if self._finished:
            raise ValueError(
                f"feed() after finish() on a {self.format.name!r} parser; "
                "use a fresh parser from get_parser() for each output"
            )
        no_marker_ids = not token_ids or max(token_ids) < self._id_floor
        if (
            self._mode == _CONTENT
            and no_marker_ids
            and not self._held
            and text
            and self._c.content_first.search(text) is None
        ):
            # Fast path: plain text with no character that could start a marker.
            if not text.isascii():
                text = scrub_text(text)
            self._segments[-1].append(text)
            self._offset += len(text)
            return [ContentDelta(text)]
        if not no_marker_ids:
            text = self._restore_markers(text, token_ids or ())
        if self._pending:
            text = "".join(self._pending) + text
            self._pending = []
        # Lone surrogates cannot be encoded (request bodies, JSONL): U+FFFD, character by
        # character, so where a chunk ends does not matter. Markers are never surrogates.
        if not text.isascii():
            text = scrub_text(text)
        out: list[ParserEvent] = []
        self._out = out
        if text:
            self._run(text, eof=False)
        return out

    def finish(self) -> ParseResult:
        """End the stream: flush held text, close or truncate an open call, return the result.

        A call still open is a :class:`ToolCallTruncated` (never executed). Idempotent.
        """
        if self._result is not None:
            return self._result
        out: list[ParserEvent] = []
        self._out = out
        self._run(scrub_text("".join(self._pending)), eof=True)
        self._pending = []
        self._finished = True
        self._result = ParseResult(
            content=self._content(),
            tool_calls=list(self._calls) or None,
            invalid_calls=tuple(self._invalid),
            truncated_calls=tuple(self._truncated),
            final_events=tuple(out),
        )
        return self._result

    # ------------------------------------------------------------------ lexing

    def _run(self, text: str, *, eof: bool) -> None:
        # Every step consumes text, holds it for the next chunk, or changes state without
        # consuming (a call opens, a body moves on). No chain of the last kind is longer than
        # a few steps with the built-in formats; past _MAX_STALLED_STEPS the engine moves on by
        # itself (_force_progress), so this loop ends for any input whatever a body does.
        s = self._held + text if self._held else text
        self._held = ""
        base = self._offset  # stream offset of s[0]
        i = 0
        stalled = 0
        while True:
            if i >= len(s):
                if eof and self._mode == _CALL and self._body is not None:
                    self._body.at_eof()
                    self._end_body()
                    if self._relex is not None:
                        s, i, base = self._relexed_text(s, len(s), base)
                        continue
                break
            mode = self._mode
            if mode == _CALL:
                body = self._body
                assert body is not None
                j = body.consume(s, i, eof)
                if body.done:
                    self._end_body()
            elif mode == _CONTENT:
                j = self._lex_content(s, i, eof)
                if self._mode == _CALL:
                    self._call_at = base + j
            elif mode == _THINK:
                j = self._lex_think(s, i, eof)
            else:
                j = self._lex_section(s, i, eof)
            if self._relex is not None:
                # Not a call after all: its first character went out as content (progress),
                # the rest is lexed again.
                s, i, base = self._relexed_text(s, max(j, i), base)
                stalled = 0
                continue
            if j > i:
                i = j
                stalled = 0
            elif j < 0 and not eof:
                self._held = s[i:]
                break
            else:
                stalled += 1
                if stalled > _MAX_STALLED_STEPS:  # only a body bug (a user format may have one)
                    self._force_progress(s[i])
                    i += 1
                    stalled = 0
        self._offset = base + min(i, len(s))
        body = self._body
        wake = body.wake_chars() if body is not None and not self._held else None
        self._wake, self._wake2 = wake if wake is not None else (None, "")

    def _relexed_text(self, s: str, k: int, base: int) -> tuple[str, int, int]:
        """``(s, i, base)`` to lex the rejected candidate's text again.

        When the candidate began in this chunk, step back in ``s`` rather than copy
        ``text + s[k:]`` (a copy per rejected ``{`` is quadratic).
        """
        relex = self._relex
        assert relex is not None
        self._relex = None
        start = k - len(relex)
        if start >= 0 and s.startswith(relex, start):
            return s, start, base
        return relex + s[k:], 0, base + start

    def _force_progress(self, char: str) -> None:
        """A body stopped consuming: end it (invalid, if it had begun a call), pass ``char`` on."""
        if self._mode == _CALL:
            if self._attempt is not None:
                self.invalid("the parser could not read this call", "")
            self._mode = self._parent
            self._body = None
            self._attempt = None
        self._emit(char, reasoning=self._mode == _THINK)

    def _upto(
        self, markers: Markers, s: str, i: int, eof: bool, reasoning: bool = False
    ) -> tuple[re.Match[str] | None, int]:
        """Emit ``s[i:]`` up to the next marker: ``(match, start)``, or ``(None, where the
        text stops)`` (-1: hold the rest for the next chunk)."""
        m = markers.search(s, i)
        j = m.start() if m is not None else markers.free_end(s, i, eof)
        if j > i:
            self._emit(s[i:j], reasoning=reasoning)
        elif m is None:
            j = -1
        return m, j

    def _lex_content(self, s: str, i: int, eof: bool) -> int:
        markers = self._c.content
        m, j = self._upto(markers, s, i, eof)
        if m is None:
            return j
        role = markers.roles[m.group()]
        if role == "think":
            self._emit(m.group(), reasoning=True)
            self._mode = _THINK
        elif role == "section":
            self._mode = _SECTION
        elif role == "call":
            self._open_call(_CONTENT)
            if self.format.keep_call_open:
                return j
        return m.end()

    def _lex_think(self, s: str, i: int, eof: bool) -> int:
        assert self._c.think_close is not None
        m, j = self._upto(self._c.think_close, s, i, eof, reasoning=True)
        if m is None:
            return j
        self._emit(m.group(), reasoning=True)
        self._mode = _CONTENT
        return m.end()

    def _lex_section(self, s: str, i: int, eof: bool) -> int:
        markers = self._c.section
        assert markers is not None
        m, j = self._upto(markers, s, i, eof)
        if m is None:
            return j
        if markers.roles[m.group()] == "call":
            self._open_call(_SECTION)
        else:
            self._mode = _CONTENT
        return m.end()

    def _open_call(self, parent: int) -> None:
        self._parent = parent
        self._mode = _CALL
        self._body = self.format.body.new(self)

    def _end_body(self) -> None:
        body = self._body
        assert body is not None
        self._mode = _CONTENT if body.exit_section else self._parent
        self._body = None
        self._attempt = None

    def _emit(self, text: str, *, reasoning: bool = False) -> None:
        self._out.append(ContentDelta(text, reasoning))
        self._segments[-1].append(text)

    def _content(self) -> str | None:
        if self._next_index == 0:
            return "".join(piece for segment in self._segments for piece in segment)
        strip = " \t\r\n" + self.format.separators
        pieces = []
        for n, segment in enumerate(self._segments):
            text = "".join(segment)
            # Separators right after a call belong to the list of calls (`{...}; {...}`).
            text = text.lstrip(strip).rstrip() if n else text.strip()
            if text:
                pieces.append(text)
        return "\n".join(pieces) or None

    # ------------------------------------------------------------------ special ids

    def _restore_markers(self, text: str, token_ids: Sequence[int]) -> str:
        """Put back markers the decoder dropped (they arrived only as special ids)."""
        marks = [self._marker_ids[t] for t in token_ids if t in self._marker_ids]
        if not marks:
            return text
        if len(token_ids) == 1:
            return text or marks[0]
        tokenizer = self._tokenizer
        assert tokenizer is not None
        # Align the chunk's pieces (runs of ordinary ids, markers) with the text: a marker
        # the text spells is kept, one it lacks is put back.
        out: list[str] = []
        pos = 0
        run: list[int] = []
        for token in (*token_ids, None):
            if token is not None and token not in self._marker_ids:
                run.append(token)
                continue
            if run:
                try:
                    decoded = tokenizer.decode(run)
                    if not text.startswith(decoded, pos):
                        # A decoder that skips special tokens skipped the others too.
                        others = self._other_special_ids()
                        decoded = tokenizer.decode([t for t in run if t not in others])
                except Exception:  # ids are model output: a tokenizer may refuse odd ones
                    return text
                run = []
                if not text.startswith(decoded, pos):
                    return text  # cannot align (a character split across chunks): trust text
                out.append(decoded)
                pos += len(decoded)
            if token is not None:
                marker = self._marker_ids[token]
                if text.startswith(marker, pos):
                    pos += len(marker)
                out.append(marker)
        return "".join(out) if pos == len(text) else text

    def _other_special_ids(self) -> frozenset[int]:
        """The tokenizer's special ids that are not this format's markers (computed once)."""
        others = self._others
        if others is None:
            assert self._tokenizer is not None
            specials = self._tokenizer.special_tokens.values()
            others = self._others = frozenset(specials) - self._marker_ids.keys()
        return others

    # ------------------------------------------------------------------ CallSink

    def _current(self) -> _Attempt:
        attempt = self._attempt
        if attempt is None:
            self.begin()
            attempt = self._attempt
            assert attempt is not None
        if attempt.index is None:
            attempt.index = self._next_index
            self._next_index += 1
        return attempt

    def begin(self) -> None:
        """Start a call attempt (a new content segment begins after it)."""
        self._attempt = _Attempt(self._new_id())
        self._segments.append([])

    def start(self, name: str, native_id: str | None = None) -> None:
        """Emit :class:`ToolCallStart`."""
        attempt = self._current()
        attempt.name = name
        attempt.started = True
        assert attempt.index is not None
        self._out.append(ToolCallStart(attempt.index, attempt.id, name))

    def fragment(self, text: str) -> None:
        """Emit :class:`ArgumentsDelta`."""
        if text:
            attempt = self._current()
            assert attempt.index is not None
            self._out.append(ArgumentsDelta(attempt.index, text))

    def seal(
        self, name: str, arguments: JSONObject, native_id: str | None = None, raw: str = ""
    ) -> None:
        """Emit :class:`ToolCallSealed` (and the start, if the name was not announced)."""
        attempt = self._current()
        if not attempt.started or attempt.name != name:
            self.start(name, native_id)
        assert attempt.index is not None
        text = json.dumps(arguments, ensure_ascii=False)
        event = ToolCallSealed(attempt.index, attempt.id, name, text, native_id, raw)
        self._out.append(event)
        self._calls.append(
            ToolCall(attempt.id, FunctionCall(name, text), index=attempt.index, native_id=native_id)
        )
        self._attempt = None

    def invalid(self, reason: str, raw: str, name: str | None = None) -> None:
        """Emit :class:`ToolCallInvalid`."""
        attempt = self._current()
        assert attempt.index is not None
        event = ToolCallInvalid(attempt.index, attempt.id, name or attempt.name, raw, reason)
        self._out.append(event)
        self._invalid.append(event)
        self._attempt = None

    def truncated(self, raw: str, name: str | None = None) -> None:
        """Emit :class:`ToolCallTruncated`."""
        attempt = self._current()
        assert attempt.index is not None
        event = ToolCallTruncated(attempt.index, attempt.id, name or attempt.name, raw)
        self._out.append(event)
        self._truncated.append(event)
        self._attempt = None

    def reject(self, text: str, *, relex: bool) -> None:
        """Not a call after all: the text is content, re-lexed after its first character.

        Re-lexing finds a call inside non-JSON text, as the reference's ``raw_decode`` loop does.
        The text re-lexed over a stream is capped (``_RELEX_FACTOR``, ``_RELEX_FREE_CHARS``) so
        unclosed ``{"a":`` repeats stay linear; past the cap a candidate stays content.
        """
        self._attempt = None
        if relex and self._relexed + len(text) <= (
            _RELEX_FACTOR * self._call_at + _RELEX_FREE_CHARS
        ):
            self._relexed += len(text)
            self._emit(text[:1])
            self._relex = text[1:]
        else:
            self._emit(text)

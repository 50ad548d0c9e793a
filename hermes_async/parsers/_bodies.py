"""Call-body grammars: small state machines the engine runs between a call's open and close.

The engine makes a fresh body from a format's frozen spec for every call and feeds it text;
the body reports through a :class:`CallSink` and holds back at most a marker's length.
``consume(s, i, eof)`` consumes a prefix of ``s[i:]`` and returns the index after it, or
``-1`` when nothing can be decided until more text arrives (never with ``eof``). Returning
``i`` is allowed only after a state change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hermes_async._json import loads, object_members
from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.parsers._scan import PARTIAL, JsonScanner, Markers
from hermes_async.parsers._values import ToolSchemas, decode_arguments

__all__ = (
    "JUNK",
    "NAME_MAX_CHARS",
    "Body",
    "BodySpec",
    "CallSink",
    "JsonCallSpec",
    "MistralSpec",
    "NamedJsonSpec",
    "marker_set",
    "skip_ws",
)

#: A tool name longer than this (with no terminator in sight) means the model is not writing a
#: call header; the attempt is reported invalid instead of buffering without bound.
NAME_MAX_CHARS = 512

_WS = " \t\r\n"
_BAD_NAME_CHARS = frozenset(' \t\r\n{}<>"')


class CallSink(Protocol):
    """What a body reports to the engine. One *attempt* per call the model tries to make."""

    schemas: ToolSchemas

    def begin(self) -> None:
        """A new call attempt starts (no event yet)."""

    def start(self, name: str, native_id: str | None = None) -> None:
        """The attempt's name is known: emit ``ToolCallStart``."""

    def fragment(self, text: str) -> None:
        """An arguments preview fragment of the started attempt."""

    def seal(
        self, name: str, arguments: JSONObject, native_id: str | None = None, raw: str = ""
    ) -> None:
        """The attempt is complete and valid (``raw``: its JSON text as written)."""

    def invalid(self, reason: str, raw: str, name: str | None = None) -> None:
        """The attempt is malformed."""

    def truncated(self, raw: str, name: str | None = None) -> None:
        """The stream ended inside the attempt."""

    def reject(self, text: str, *, relex: bool) -> None:
        """The text was not a call after all (bare-JSON formats): give it back as content."""


class BodySpec(Protocol):
    """A declarative call-body description; ``new`` makes the per-call state machine."""

    def new(self, sink: CallSink) -> Body:
        """A fresh body for one call."""
        ...

    def spellings(self) -> tuple[str, ...]:
        """Every marker the body looks for (so special token ids can be mapped back)."""
        ...


def skip_ws(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in _WS:
        i += 1
    return i


@functools.lru_cache(maxsize=256)
def marker_set(pairs: tuple[tuple[str, str], ...]) -> Markers:
    return Markers(dict(pairs))


def _roles(role: str, spellings: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((s, role) for s in spellings)


def _name_problem(name: str) -> str | None:
    if not name:
        return "the tool name is empty"
    if len(name) > NAME_MAX_CHARS or any(c in _BAD_NAME_CHARS for c in name):
        return f"{name[:80]!r} is not a tool name"
    return None


def _tail(text: str, size: int = 40) -> str:
    return text if len(text) <= size else "..." + text[-size:]


#: Body states every body shares: skipping to the closing marker (the rest of a malformed
#: attempt, or noise after a finished call), and scanning a JSON object.
JUNK = -1
SCAN = -2
#: ``Body.close_at`` results besides an end index.
WAIT = -1
NO_MARKER = -2


class Body:
    """Shared state and steps of every body: text collection, junk skipping, closing markers."""

    __slots__ = (
        "_counted",
        "close",
        "done",
        "exit_section",
        "junk",
        "junk_reason",
        "name",
        "parts",
        "sink",
        "state",
    )

    def __init__(self, sink: CallSink, close: tuple[str, ...], state: int) -> None:
        self.sink = sink
        self.close = marker_set(_roles("close", close)) if close else None
        self.state = state
        self.done = False
        self.exit_section = False
        self.name: str | None = None
        #: Text collected for the current name or value.
        self.parts: list[str] = []
        # ``(parts, len(parts), characters in them)`` as a name's text was last counted.
        self._counted: tuple[list[str], int, int] | None = None
        self.junk: list[str] = []
        #: Set while skipping the rest of a malformed attempt; None while skipping noise after
        #: a finished call (discarded silently).
        self.junk_reason: str | None = None

    def consume(self, s: str, i: int, eof: bool) -> int:
        """Consume text; see the module docstring for the contract."""
        raise NotImplementedError

    def at_eof(self) -> None:
        """The stream ended while this body was active: report what is pending."""
        raise NotImplementedError

    def wake_chars(self) -> tuple[str, str] | None:
        """Characters without which a chunk may be scanned later, or None (scan every chunk).

        Inside a started call's JSON, a chunk with neither ``}`` nor a closing marker's first
        character changes when events come, never which.
        """
        return None

    def close_at(self, s: str, j: int, eof: bool) -> int:
        """The end of a closing marker at ``s[j]``, :data:`WAIT`, or :data:`NO_MARKER`."""
        if self.close is None:
            return NO_MARKER
        hit = self.close.match_at(s, j, eof)
        if isinstance(hit, tuple):
            return hit[1]
        return WAIT if hit == PARTIAL else NO_MARKER

    def _collect(
        self, markers: Markers, s: str, i: int, eof: bool, *, keep: bool = True
    ) -> tuple[int, str | None, int]:
        """Collect (or drop) text up to a marker: ``(start, role, end)``; role None: none yet."""
        m = markers.search(s, i)
        if m is None:
            j = markers.free_end(s, i, eof)
            if keep:
                self.parts.append(s[i:j])
            return (j if j > i else -1), None, j
        if keep:
            self.parts.append(s[i : m.start()])
        return m.start(), markers.roles[m.group()], m.end()

    def _name_text(
        self, markers: Markers, s: str, i: int, eof: bool
    ) -> tuple[int, str | None, int]:
        """:meth:`_collect` for a name; past :data:`NAME_MAX_CHARS` it is junk."""
        parts, counted = self.parts, self._counted
        # Counted as the name grows, not summed again per chunk: one character per chunk
        # made that quadratic in the name's length (issue 38: 4x the input, 8.2x the time).
        if counted is not None and counted[0] is parts and counted[1] == len(parts):
            have = counted[2]
        else:
            have = sum(map(len, parts))
        k, role, end = self._collect(markers, s, i, eof)
        total = have + len(parts[-1])
        if total > NAME_MAX_CHARS:
            cut = i + NAME_MAX_CHARS + 1 - have
            self.parts[-1] = s[i:cut]
            self._junk("no end of the tool name in sight")
            return cut, None, cut
        self._counted = (parts, len(parts), total)
        return k, role, end

    def _accept_name(self, name: str, raw: str | None = None, native_id: str | None = None) -> bool:
        """Announce ``name`` (``ToolCallStart``), or junk the attempt if it is no tool name."""
        problem = _name_problem(name)
        if problem is not None:
            self._junk(problem, name if raw is None else raw)
            return False
        self.name = name
        self.sink.start(name, native_id)
        return True

    def _take(self) -> str:
        text = "".join(self.parts)
        self.parts = []
        return text

    def _junk(self, reason: str, *raw: str) -> None:
        """Skip the malformed attempt to its closing marker, then report it."""
        self.junk_reason = reason
        self.junk = [*raw, *self.parts]
        self.parts = []
        self.state = JUNK

    def _skip_noise(self) -> None:
        """Skip silently to the closing marker (text after a finished call)."""
        self.junk_reason = None
        self.state = JUNK

    def _skip_to_close(self, s: str, i: int, eof: bool) -> int:
        close = self.close
        if close is None:  # no closing marker: the malformed attempt ends here
            self._end_junk()
            return i
        m = close.search(s, i)
        end = m.start() if m is not None else close.free_end(s, i, eof)
        if self.junk_reason is not None:
            self.junk.append(s[i:end])
        if m is None:
            return end if end > i else -1
        self._end_junk()
        return m.end()

    def _end_junk(self) -> None:
        self._eof_junk()
        self.done = True

    def _eof_junk(self) -> None:
        if self.junk_reason is not None:
            self.sink.invalid(self.junk_reason, "".join(self.junk), self.name)
            self.junk_reason = None


class _JsonBody(Body):
    """A body that scans a JSON object with :class:`JsonScanner` (state :data:`SCAN`)."""

    __slots__ = ("_wake", "committed", "interrupts", "scanner", "started")

    #: How reasons name the object this body scans.
    what = "JSON object"

    def __init__(self, sink: CallSink, close: tuple[str, ...], state: int) -> None:
        super().__init__(sink, close, state)
        self.scanner: JsonScanner | None = None
        #: The first characters of the closing markers: where the scanner stops to look.
        self.interrupts = "".join(sorted({c[0] for c in close}))
        # What may wake a deferred scan (only one marker character can be watched cheaply).
        self._wake = ("}", self.interrupts or "}") if len(self.interrupts) <= 1 else None
        #: False while a bare-JSON candidate may still turn out not to be a call.
        self.committed = True
        #: The call's name was announced (argument fragments flow).
        self.started = False

    def consume(self, s: str, i: int, eof: bool) -> int:
        state = self.state
        if state == SCAN:
            return self._scan(s, i, eof)
        if state == JUNK:
            return self._skip_to_close(s, i, eof)
        return self._step(s, i, eof)

    def _step(self, s: str, i: int, eof: bool) -> int:
        """:meth:`consume` in the body's own states (not scanning, not skipping junk)."""
        raise NotImplementedError

    def wake_chars(self) -> tuple[str, str] | None:
        if self.state == SCAN and self.started:
            return self._wake
        return None

    def _scan(self, s: str, i: int, eof: bool) -> int:
        scanner = self.scanner
        assert scanner is not None
        k = scanner.scan(s, i)
        self._drain(scanner)
        if scanner.done:
            self._decoded(scanner)
            return k
        if not scanner.stopped:
            return k
        end = self.close_at(s, k, eof)
        if end == WAIT:
            return k if k > i else -1
        if not self.committed:  # a bare-JSON candidate that is not JSON: content after all
            self.sink.reject(scanner.text(), relex=True)
            self.done = True
            return k
        text = scanner.text()
        if end >= 0:
            reason = f"the {self.what} is incomplete (closing marker reached first)"
            self.sink.invalid(reason, text, self.name)
            self.done = True
            return end
        self._junk(f"invalid JSON: unexpected {s[k]!r} after {_tail(text)!r}", text)
        return k

    def _drain(self, scanner: JsonScanner) -> None:
        for fragment in scanner.frags:
            self.sink.fragment(fragment)
        scanner.frags.clear()

    def _decoded(self, scanner: JsonScanner) -> None:
        """The object closed: decode and report it."""
        raise NotImplementedError

    def _loads(self, scanner: JsonScanner) -> JSON:
        """The finished object's value (``ValueError`` if invalid or nested too deep)."""
        # The scanner counted the depth; only a too-deep text pays for the check (and fails).
        return loads(scanner.text(), depth_checked=not scanner.too_deep)


# --------------------------------------------------------------------------- JSON object body


@dataclass(frozen=True, slots=True)
class JsonCallSpec:
    """A call written as one JSON object ``{"name": ..., "arguments": {...}}``.

    Attributes:
        close: Closing markers; empty when the object itself ends the call.
        args_keys: Keys holding the arguments, in priority order.
        candidate: Bare JSON in ordinary text (``llama3_json``): an object becomes a call only
            with a string ``name`` and an arguments key; anything else is content.
        multi: Several objects may share one pair of markers.
        native_id_key: A key holding the model's own call id (Mistral Nemo's ``"id"``).
    """

    close: tuple[str, ...] = ()
    args_keys: tuple[str, ...] = ("arguments", "parameters")
    candidate: bool = False
    multi: bool = False
    native_id_key: str | None = None

    def new(self, sink: CallSink) -> Body:
        return JsonCallBody(self, sink)

    def spellings(self) -> tuple[str, ...]:
        return self.close


_PRE, _AFTER = range(2)
_NAME_KEYS = frozenset({"name"})


@functools.cache
def _key_set(keys: tuple[str, ...]) -> frozenset[str]:
    return frozenset(keys)


class JsonCallBody(_JsonBody):
    """State machine for :class:`JsonCallSpec`."""

    __slots__ = ("pending", "spec")

    def __init__(self, spec: JsonCallSpec, sink: CallSink) -> None:
        super().__init__(sink, spec.close, _PRE)
        self.spec = spec
        #: Argument fragments seen before a candidate became a call.
        self.pending: list[str] = []

    def _step(self, s: str, i: int, eof: bool) -> int:
        state = self.state
        j = skip_ws(s, i)
        if j >= len(s):
            return j
        end = self.close_at(s, j, eof)
        if end == WAIT:
            return j if j > i else -1
        if end >= 0:
            self.done = True  # an empty tag is skipped, as in the reference
            return end
        if s[j] == "{" and (state == _PRE or self.spec.multi):
            self._begin_object()
            if self.committed and (end := self._whole_object(s, j)) >= 0:
                return end
            self.scanner = JsonScanner(
                name_keys=_NAME_KEYS,
                args_keys=_key_set(self.spec.args_keys),
                interrupts=self.interrupts,
            )
            return j
        if self.close is None:
            self.done = True
            return j
        if state == _PRE:
            self.sink.begin()
            self._junk("expected a JSON object with 'name' and 'arguments'")
        else:
            self._skip_noise()
        return j

    def _begin_object(self) -> None:
        """Start an object (the caller makes its scanner if it is not taken whole)."""
        spec = self.spec
        self.state = SCAN
        self.started = False
        self.committed = not spec.candidate
        self.pending = []
        self.name = None
        if self.committed:
            self.sink.begin()

    def _whole_object(self, s: str, j: int) -> int:
        """A call object already complete in ``s`` and valid, taken at once: the events the
        scanner would give for it (start, one arguments fragment, sealed), and the index after
        it. ``-1`` for anything else (unfinished, invalid, unusual): the scanner takes it, from
        the same place, as before.
        """
        parsed = object_members(s, j)
        if parsed is None:
            return -1
        members, end = parsed
        spec = self.spec
        keys = [member[0] for member in members]
        if len(set(keys)) != len(keys):  # the scanner reads a repeated key first, loads last
            return -1
        found = [member for member in members if member[0] in spec.args_keys]
        named = [member for member in members if member[0] == "name"]
        if len(found) != 1 or len(named) != 1:  # the scanner sends each key's fragments
            return -1
        name = named[0][1]
        if type(name) is not str or _name_problem(name) is not None:
            return -1
        ((_, raw_args, args_start, args_end),) = found
        arguments, _ = decode_arguments(raw_args)
        if arguments is None:
            return -1
        native = None
        if spec.native_id_key is not None and spec.native_id_key in keys:
            value = members[keys.index(spec.native_id_key)][1]
            native = value if isinstance(value, str) else None
        self.scanner = None
        self.state = _AFTER
        if self.close is None:
            self.done = True
        self.started = True
        self.name = name
        self.sink.start(name)
        self.sink.fragment(s[args_start:args_end])
        self.sink.seal(name, arguments, native, s[j:end])
        return end

    def _drain(self, scanner: JsonScanner) -> None:
        if (
            not self.started
            and scanner.name is not None
            and (self.committed or scanner.args_seen)
            and _name_problem(scanner.name) is None
        ):
            if not self.committed:
                self.committed = True
                self.sink.begin()
            self.started = True
            self.name = scanner.name
            self.sink.start(scanner.name)
            for fragment in self.pending:
                self.sink.fragment(fragment)
            self.pending = []
        if scanner.frags:
            if self.started:
                super()._drain(scanner)
            else:
                self.pending.extend(scanner.frags)
                scanner.frags.clear()

    def _reject(self, text: str, *, relex: bool) -> None:
        self.sink.reject(text, relex=relex)
        self.done = True

    def _decoded(self, scanner: JsonScanner) -> None:
        text = scanner.text()
        self.state = _AFTER
        if self.close is None:
            self.done = True
        try:
            obj: JSON = self._loads(scanner)
        except ValueError as exc:
            if not self.committed:
                # Not JSON: content, lexed again from its second character (as the
                # reference's raw_decode loop). Too deep: valid JSON, just no call; its
                # inside is not looked at again (re-lexing it would cost quadratic time).
                self._reject(text, relex=not scanner.too_deep)
                return
            self._fail(f"invalid JSON: {exc}", text)
            return
        spec = self.spec
        if not self.committed:
            if not (
                isinstance(obj, dict)
                and isinstance(obj.get("name"), str)
                and _name_problem(obj["name"]) is None
                and any(k in obj for k in spec.args_keys)
            ):
                self._reject(text, relex=False)
                return
            self.committed = True
            self.sink.begin()
        if not isinstance(obj, dict):
            self._fail("a tool call must be a JSON object with 'name' and 'arguments'", text)
            return
        name = obj.get("name")
        if not isinstance(name, str):
            self._fail("the tool call has no string 'name'", text)
            return
        problem = _name_problem(name)
        if problem is not None:
            self._fail(problem, text)
            return
        raw_args: JSON = None
        for key in spec.args_keys:
            if key in obj:
                raw_args = obj[key]
                break
        arguments, reason = decode_arguments(raw_args)
        if arguments is None:
            self._fail(reason or "invalid arguments", text, name)
            return
        native = obj.get(spec.native_id_key) if spec.native_id_key else None
        self.sink.seal(name, arguments, native if isinstance(native, str) else None, text)

    def _fail(self, reason: str, raw: str, name: str | None = None) -> None:
        self.sink.invalid(reason, raw, name or self.name)

    def at_eof(self) -> None:
        if self.state == SCAN:
            assert self.scanner is not None
            if not self.committed:
                self._reject(self.scanner.text(), relex=True)
            else:
                self.sink.truncated(self.scanner.text(), self.name)
        elif self.state == _PRE:
            self.sink.begin()
            self.sink.truncated("", None)
        elif self.state == JUNK:
            self._eof_junk()
        self.done = True


# --------------------------------------------------------------------- name, then JSON object


@dataclass(frozen=True, slots=True)
class NamedJsonSpec:
    """A call written as a name (or id) header followed by a JSON object of arguments.

    Attributes:
        name_end: Markers that end the name and are consumed (``<｜tool▁sep｜>``, newline).
        close: Markers that end the call; empty when the JSON object ends it (Mistral).
        prefix: Skip everything up to one of these first (DeepSeek V3's call type).
        id_marker: Introduces the model's own call id after the name (Mistral ``[CALL_ID]``).
        brace_ends_name: An opening brace ends the name (and starts the arguments).
        fence: The arguments may be wrapped in a ```` ```json ```` code fence.
        name_from_id: Turn the header into ``(name, native_id)`` (Kimi's
            ``functions.get_weather:0``); None: the header is the name.
    """

    name_end: tuple[str, ...]
    close: tuple[str, ...] = ()
    prefix: tuple[str, ...] = ()
    id_marker: tuple[str, ...] = ()
    brace_ends_name: bool = False
    fence: bool = False
    name_from_id: Callable[[str], tuple[str, str | None]] | None = None

    def new(self, sink: CallSink) -> Body:
        return NamedJsonBody(self, sink)

    def spellings(self) -> tuple[str, ...]:
        return (*self.name_end, *self.close, *self.prefix, *self.id_marker)


_N_PREFIX, _N_NAME, _N_ID, _N_PRE_ARGS, _N_POST = range(5)
_FENCES = (("```json", "fence"), ("```JSON", "fence"), ("```", "fence"))


class NamedJsonBody(_JsonBody):
    """State machine for :class:`NamedJsonSpec`."""

    __slots__ = ("_header", "_name_markers", "_pre_args", "native_id", "spec")

    what = "arguments JSON"

    def __init__(self, spec: NamedJsonSpec, sink: CallSink) -> None:
        super().__init__(sink, spec.close, _N_PREFIX if spec.prefix else _N_NAME)
        self.spec = spec
        self.native_id: str | None = None
        pairs = (
            *_roles("end", spec.name_end),
            *_roles("close", spec.close),
            *_roles("id", spec.id_marker),
            *((("{", "brace"),) if spec.brace_ends_name else ()),
            *((("```", "fence"),) if spec.fence else ()),
        )
        self._name_markers = marker_set(pairs)
        self._header = marker_set(_roles("prefix", spec.prefix)) if spec.prefix else None
        pre = (*_roles("close", spec.close), *(_FENCES if spec.fence else ()))
        self._pre_args = marker_set(pre) if pre else None
        sink.begin()

    def _step(self, s: str, i: int, eof: bool) -> int:
        state = self.state
        if state == _N_PREFIX:
            assert self._header is not None
            k, role, end = self._collect(self._header, s, i, eof, keep=False)
            if role is None:
                return k
            self.state = _N_NAME
            return end
        if state in (_N_NAME, _N_ID):
            return self._header_text(s, i, eof)
        if state == _N_PRE_ARGS:
            return self._pre_arguments(s, i, eof)
        # _N_POST: after the arguments, up to the closing marker.
        if self.close is None:
            self.done = True
            return i
        j = skip_ws(s, i)
        if j >= len(s):
            return j
        if self.spec.fence and s.startswith("`", j):
            k = j
            while k < len(s) and s[k] == "`":
                k += 1
            if k == len(s) and not eof and k - j < 3:
                return j if j > i else -1
            return k
        end = self.close_at(s, j, eof)
        if end == WAIT:
            return j if j > i else -1
        if end >= 0:
            self.done = True
            return end
        self._skip_noise()
        return j

    def _header_text(self, s: str, i: int, eof: bool) -> int:
        """The name (state ``_N_NAME``) or the model's call id (``_N_ID``)."""
        if not self.parts:
            j = skip_ws(s, i)
            if j > i:
                return j
        k, role, end = self._name_text(self._name_markers, s, i, eof)
        if role is None:
            return k
        text = self._take().strip()
        if self.state == _N_ID:
            self.native_id = text or None
            if role == "id":  # a second id marker: malformed
                self._junk("unexpected call-id marker")
                return end
        elif not self._named(text):
            return end if role not in ("brace", "close") else k
        if role == "id" and self.state == _N_NAME:
            self.state = _N_ID
            return end
        if role == "close":
            self.sink.seal(self.name or "", {}, self.native_id)
            self.done = True
            return end
        self.state = _N_PRE_ARGS
        return k if role in ("brace", "fence") else end

    def _pre_arguments(self, s: str, i: int, eof: bool) -> int:
        """Between the name and the arguments: a fence may open, a close ends a bare call."""
        j = skip_ws(s, i)
        if j >= len(s):
            return j
        if s[j] == "{":
            self.scanner = JsonScanner(interrupts=self.interrupts, whole_is_arguments=True)
            self.state = SCAN
            self.started = True
            return j
        if self._pre_args is not None:
            hit = self._pre_args.match_at(s, j, eof)
            if hit == PARTIAL:
                return j if j > i else -1
            if isinstance(hit, tuple):
                role, end = hit
                if role == "fence":
                    return end
                self.sink.seal(self.name or "", {}, self.native_id)
                self.done = True
                return end
        self._junk("expected a JSON object with the arguments")
        return j

    def _named(self, header: str) -> bool:
        if self.spec.name_from_id is not None and header:
            name, native = self.spec.name_from_id(header)
            self.native_id = native
        else:
            name = header
        return self._accept_name(name, header, self.native_id)

    def _decoded(self, scanner: JsonScanner) -> None:
        self.state = _N_POST
        text = scanner.text()
        try:
            arguments = self._loads(scanner)
        except ValueError as exc:
            self.sink.invalid(f"invalid JSON arguments: {exc}", text, self.name)
            return
        if not isinstance(arguments, dict):
            self.sink.invalid("the arguments must be a JSON object", text, self.name)
            return
        self.sink.seal(self.name or "", arguments, self.native_id, text)

    def at_eof(self) -> None:
        state = self.state
        if state == JUNK:
            self._eof_junk()
        elif state != _N_POST:
            raw = self.scanner.text() if self.scanner is not None else "".join(self.parts)
            self.sink.truncated(raw, self.name)
        self.done = True


# ------------------------------------------------------------------------------------ Mistral


@dataclass(frozen=True, slots=True)
class MistralSpec:
    """After ``[TOOL_CALLS]``: a JSON array of call objects, one object, or ``name{args}``."""

    named: NamedJsonSpec
    single: JsonCallSpec = JsonCallSpec(native_id_key="id")

    def new(self, sink: CallSink) -> Body:
        return MistralBody(self, sink)

    def spellings(self) -> tuple[str, ...]:
        return self.named.spellings()


_M_START, _M_ARRAY, _M_SUB = range(3)


class MistralBody(Body):
    """State machine for :class:`MistralSpec`."""

    __slots__ = ("in_array", "spec", "sub")

    def __init__(self, spec: MistralSpec, sink: CallSink) -> None:
        super().__init__(sink, (), _M_START)
        self.spec = spec
        self.sub: Body | None = None
        self.in_array = False

    def consume(self, s: str, i: int, eof: bool) -> int:
        if self.state == _M_SUB:
            assert self.sub is not None
            k = self.sub.consume(s, i, eof)
            if self.sub.done:
                self.sub = None
                if self.in_array:
                    self.state = _M_ARRAY
                else:
                    self.done = True
            return k
        j = skip_ws(s, i)
        if self.state == _M_ARRAY:
            while j < len(s) and s[j] in ", \t\r\n":
                j += 1
        if j >= len(s):
            return j
        c = s[j]
        if self.state == _M_ARRAY:
            if c == "]":
                self.done = True
                return j + 1
            if c != "{":
                self.done = True  # the rest is ordinary text
                return j
            self.sub = self.spec.single.new(self.sink)
        elif c == "[":
            self.in_array = True
            self.state = _M_ARRAY
            return j + 1
        elif c == "{":
            self.sub = self.spec.single.new(self.sink)
        else:
            self.sub = self.spec.named.new(self.sink)
        self.state = _M_SUB
        return j

    def wake_chars(self) -> tuple[str, str] | None:
        return self.sub.wake_chars() if self.sub is not None else None

    def at_eof(self) -> None:
        if self.sub is not None:
            self.sub.at_eof()
        elif self.state == _M_START:
            self.sink.begin()
            self.sink.truncated("", None)
        self.done = True

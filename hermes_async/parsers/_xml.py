"""Call bodies of the XML-style formats: ``qwen3_coder`` and ``glm45``/``glm47``.

Same contract as :mod:`hermes_async.parsers._bodies`; values are typed per parameter from the
tool schemas (:func:`hermes_async.parsers._values.convert_value`) and previewed as one JSON
fragment per finished parameter, so the fragments of a call concatenate to its arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hermes_async.jsontypes import JSON, JSONObject
from hermes_async.parsers._bodies import JUNK, Body, CallSink, marker_set, skip_ws
from hermes_async.parsers._scan import PARTIAL
from hermes_async.parsers._values import convert_value

__all__ = ["GlmSpec", "Qwen3CoderSpec"]


def _param_fragment(first: bool, key: str, value: JSON) -> str:
    body = json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False)
    return ("{" if first else ", ") + body


class _XmlBody(Body):
    """Shared parameter bookkeeping of the XML formats."""

    __slots__ = ("key", "params")

    def __init__(self, sink: CallSink, close: tuple[str, ...], state: int) -> None:
        super().__init__(sink, close, state)
        self.params: JSONObject = {}
        self.key = ""
        sink.begin()

    def _set_param(self, raw: str) -> None:
        schema = self.sink.schemas.param(self.name or "", self.key) if self.sink.schemas else None
        value = convert_value(raw, schema)
        self.sink.fragment(_param_fragment(not self.params, self.key, value))
        self.params[self.key] = value

    def _seal(self) -> None:
        self.sink.fragment("}" if self.params else "{}")
        self.sink.seal(self.name or "", self.params)
        self.done = True

    def at_eof(self) -> None:
        if self.junk_reason is not None:
            self._eof_junk()
        else:
            self.sink.truncated(self._raw(), self.name)
        self.done = True

    def _raw(self) -> str:
        return json.dumps(self.params, ensure_ascii=False) + "".join(self.parts)


@dataclass(frozen=True, slots=True)
class Qwen3CoderSpec:
    """``<function=NAME>`` ``<parameter=KEY>VALUE</parameter>``... ``</function>``."""

    def new(self, sink: CallSink) -> Body:
        return Qwen3CoderBody(sink)

    def spellings(self) -> tuple[str, ...]:
        return ("</function>", "</tool_call>", "<parameter=", "</parameter>")


_Q_FNAME, _Q_BODY, _Q_PNAME, _Q_VALUE, _Q_VCHECK = range(5)
_Q_NAME_END = marker_set((("<", "bad"), (">", "end"), ("\n", "bad")))
_Q_BODY_MARKERS = marker_set(
    (("<parameter=", "param"), ("</function>", "fend"), ("</tool_call>", "tend"))
)
_Q_VALUE_MARKERS = marker_set(
    (
        ("</parameter>", "pend"),
        ("<parameter=", "next"),
        ("</function>", "fend"),
        ("</tool_call>", "tend"),
    )
)


class Qwen3CoderBody(_XmlBody):
    """State machine for :class:`Qwen3CoderSpec` (entered after ``<function=``).

    ``</parameter>`` ends a value only before another parameter or the function's end, so a
    value may contain that literal text.
    """

    __slots__ = ("pending_close",)

    def __init__(self, sink: CallSink) -> None:
        super().__init__(sink, ("</function>", "</tool_call>"), _Q_FNAME)
        self.pending_close: list[str] = []

    def consume(self, s: str, i: int, eof: bool) -> int:
        state = self.state
        if state in (_Q_FNAME, _Q_PNAME):
            k, role, end = self._name_text(_Q_NAME_END, s, i, eof)
            if role is None:
                return k
            text = self._take().strip()
            if role == "bad" or not text:
                self._junk("a '<function=' or '<parameter=' tag without its closing '>'", text)
                return k
            if state == _Q_FNAME:
                if not self._accept_name(text):
                    return end
                self.state = _Q_BODY
            else:
                self.key = text
                self.state = _Q_VALUE
            return end
        if state == JUNK:
            return self._skip_to_close(s, i, eof)
        if state == _Q_BODY:
            k, role, end = self._collect(_Q_BODY_MARKERS, s, i, eof, keep=False)
            if role is None:
                return k
            if role == "param":
                self.state = _Q_PNAME
            else:
                self.exit_section = role == "tend"
                self._seal()
            return end
        if state == _Q_VALUE:
            k, role, end = self._collect(_Q_VALUE_MARKERS, s, i, eof)
            if role is None:
                return k
            if role == "pend":
                self.pending_close = ["</parameter>"]
                self.state = _Q_VCHECK
                return end
            self._end_value()
            return k
        # _Q_VCHECK: is the '</parameter>' we saw really the end of the value?
        j = skip_ws(s, i)
        if j > i:
            self.pending_close.append(s[i:j])
        if j >= len(s):
            return j
        hit = _Q_BODY_MARKERS.match_at(s, j, eof)
        if hit == PARTIAL:
            return j if j > i else -1
        if hit is None:
            self.parts.extend(self.pending_close)  # literal text inside the value
            self.pending_close = []
            self.state = _Q_VALUE
            return j
        self._end_value()
        return j

    def _end_value(self) -> None:
        raw = self._take()
        if raw.startswith("\n"):
            raw = raw[1:]
        if raw.endswith("\n"):
            raw = raw[:-1]
        self._set_param(raw)
        self.pending_close = []
        self.state = _Q_BODY

    def at_eof(self) -> None:
        if self.state == _Q_VCHECK:
            self.parts.extend(self.pending_close)
        super().at_eof()


@dataclass(frozen=True, slots=True)
class GlmSpec:
    """``NAME`` then ``<arg_key>K</arg_key><arg_value>V</arg_value>``... then ``</tool_call>``."""

    def new(self, sink: CallSink) -> Body:
        return GlmBody(sink)

    def spellings(self) -> tuple[str, ...]:
        return ("</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


_G_NAME, _G_ARGS, _G_KEY, _G_PREVAL, _G_VALUE = range(5)
_G_NAME_MARKERS = marker_set(
    (("\n", "end"), ("<arg_key>", "stop"), ("</tool_call>", "stop"), ("<arg_value>", "stop"))
)
_G_ARGS_MARKERS = marker_set((("<arg_key>", "key"), ("</tool_call>", "close")))
_G_KEY_MARKERS = marker_set((("</arg_key>", "end"), ("</tool_call>", "close")))
_G_PREVAL_MARKERS = marker_set(
    (("<arg_value>", "value"), ("<arg_key>", "key"), ("</tool_call>", "close"))
)
_G_VALUE_MARKERS = marker_set((("</arg_value>", "end"), ("</tool_call>", "close")))


class GlmBody(_XmlBody):
    """State machine for :class:`GlmSpec` (entered after ``<tool_call>``).

    Accepts glm47's relaxations in both names; a call with no arguments is kept.
    """

    __slots__ = ()

    def __init__(self, sink: CallSink) -> None:
        super().__init__(sink, ("</tool_call>",), _G_NAME)

    def consume(self, s: str, i: int, eof: bool) -> int:
        state = self.state
        if state == JUNK:
            return self._skip_to_close(s, i, eof)
        if state == _G_NAME:
            if not self.parts:
                j = skip_ws(s, i)
                if j > i:
                    return j
            k, role, end = self._name_text(_G_NAME_MARKERS, s, i, eof)
            if role is None:
                return k
            if not self._accept_name(self._take().strip()):
                return k
            self.state = _G_ARGS
            return end if role == "end" else k
        if state in (_G_ARGS, _G_PREVAL):
            markers = _G_ARGS_MARKERS if state == _G_ARGS else _G_PREVAL_MARKERS
            k, role, end = self._collect(markers, s, i, eof, keep=False)
            if role is None:
                return k
            if role == "close":
                self._seal()
            elif role == "key":
                self.state = _G_KEY
            else:
                self.state = _G_VALUE
            return end
        markers = _G_KEY_MARKERS if state == _G_KEY else _G_VALUE_MARKERS
        k, role, end = self._collect(markers, s, i, eof)
        if role is None:
            return k
        if role == "close":  # a key or value without its closing tag
            self._junk(
                "an <arg_key>/<arg_value> without its closing tag",
                json.dumps(self.params, ensure_ascii=False),
            )
            return k
        text = self._take()
        if state == _G_KEY:
            self.key = text.strip()
            self.state = _G_PREVAL
        else:
            self._set_param(text)
            self.state = _G_ARGS
        return end

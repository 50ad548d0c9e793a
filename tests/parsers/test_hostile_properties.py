"""Model text can never raise, and streaming equals whole-text, for every parser name.

Two hypothesis properties over hostile input -- arbitrary mixes of every format's markers and
their prefixes, rendered calls (well-formed, deeply nested, with surrogates), special-token
spellings, JSON fragments, deep brackets, lone surrogates, odd characters -- each example run
through *every* registered name:

* text, cut at random places (or one character at a time): no exception, everything in the
  result encodes as UTF-8 JSON, and the streamed result and events equal the whole-text ones;
* arbitrary token-id sequences (specials, ordinary ids, ids no tokenizer knows) decoded with
  markers spelled or skipped per chunk: no exception, and the stream equals the whole-text
  parse of the spelled text (markers put back from the ids).

Cheap by design so that CI (``--run-slow``) runs 10,000 cases per name (each example is one
case for each of the 15 names): a draw is two byte strings, mapped onto a fixed table of pieces,
and every test checks its own case count. Every run does 1,000; ``HERMES_ASYNC_SOAK=1`` 100,000.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from hermes_async.inference.tokenizer import QwenTokenizer
from hermes_async.parsers import PARSER_REGISTRY, ParseResult, ParserEvent, get_parser
from tests.parsers.helpers import ALL_NAMES, ATOMS, RENDER, call_key, normalize
from tests.support import scaled

#: Cases per parser name: every run, CI (acceptance: >= 10,000), soak. ~20 s of CPU per
#: 10,000 on the project's 2-core machine; the bound allows a busy one.
CASES = scaled(1_000, 10_000, 100_000, timeout=3600)

_XML = {"qwen3_coder", "glm45", "glm47"}


def _call(name: str, value: str, tool: str = "f") -> str:
    """A call of ``tool`` whose argument ``x`` is ``value`` as written (JSON text or XML)."""
    text = RENDER[name](tool, {"x": "@@"})
    return text.replace("@@", value) if name in _XML else text.replace('"@@"', value)


def _pieces() -> tuple[str, ...]:
    formats = sorted({name: None for name in RENDER if name in ATOMS})
    markers = sorted({atom for name in formats for atom in ATOMS[name]})
    specials = [
        *[s for s in QwenTokenizer().special_tokens],
        "<|python_tag|>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "[CALL_ID]",
        "<|tool_call_section_begin|>",
        "< | DSML | tool_calls_begin >",
        "<｜DSML｜tool_call_begin｜>",
        "<longcat_tool_call>",
    ]
    json_bits = [
        '{"name": "f", "arguments": ',
        '{"name": "ping", "parameters": {}}',
        '"name"',
        '"arguments"',
        '"',
        "\\",
        '\\"',
        ":",
        ",",
        "{",
        "}",
        "[",
        "]",
        "1e999",
        "NaN",
        "-0",
        "true",
        "null",
        "```json\n",
        "```",
        "'x'",
        "\\ud800",
        '"\\ud800"',
        '"\\udc00\\ud800"',
    ]
    hostile = [
        "{" * 9,
        "[" * 70,
        "]" * 70,
        '{"a":' * 70,
        "}" * 9,
        "\ud800",
        "\udfff",
        "\x00",
        "\u2028",
        "\ufeff",
    ]
    chars = list("ab \n\t.;=|<>/xé😀｜▁")
    calls = []
    for name in formats:
        calls += [
            RENDER[name]("terminal", {"command": "ls"}),
            RENDER[name]("ping", {}),
            RENDER[name]("a.b", {"s": 'q"uo\\te </tool_call> {', "n": [1, {"k": None}]}),
            _call(name, "[" * 65 + "]" * 65),  # just over the depth limit
            _call(name, '"\\ud800"'),
            _call(name, '"\ud800"'),
            _call(name, "'\\udfff'"),  # a Python literal (the XML formats' fallback)
            RENDER[name]("f\\ud800", {}),
        ]
    # Far past the recursion limit; long, so only one (tests/parsers/test_hostile.py has the
    # 1,000-level call for every name).
    deep = [_call("hermes", "[" * 1_000 + "]" * 1_000)]
    prefixes = [m[: max(1, len(m) // 2)] for m in markers + specials if len(m) > 1]
    table = [*markers, *prefixes, *specials, *json_bits, *hostile, *chars, *calls, *deep]
    return tuple(dict.fromkeys(table))


#: What texts are made of (at most 256 entries: one byte of a draw picks one).
PIECES = _pieces()
#: The pieces token streams are made of: the short ones (a stream of 1,000-character pieces
#: fed a token at a time to 15 parsers would cost more than it finds).
SHORT_PIECES = tuple(p for p in PIECES if len(p) <= 80)


def _text(pieces: bytes) -> str:
    return "".join(PIECES[b % len(PIECES)] for b in pieces)


def _chunks(text: str, cuts: bytes) -> list[str]:
    """Cut ``text``: one character at a time (short texts, a quarter of the draws) or at positions."""
    if cuts[:1] and cuts[0] % 4 == 1 and len(text) <= 120:
        return list(text)
    points = sorted({(b * len(text)) // 256 for b in cuts[1:]} - {0})
    out, last = [], 0
    for point in points:
        out.append(text[last:point])
        last = point
    out.append(text[last:])
    return out


def _encodable(result: ParseResult) -> None:
    """Everything a result holds can be sent and stored (UTF-8 JSON); calls are objects."""
    payload = [
        result.content,
        [c.to_dict() for c in result.tool_calls or []],
        [(c.name, c.raw, c.message) for c in result.invalid_calls],
        [(c.name, c.raw, c.message) for c in result.truncated_calls],
    ]
    json.dumps(payload, ensure_ascii=False).encode("utf-8")
    for call in result.tool_calls or []:
        assert isinstance(json.loads(call.arguments), dict)


def _stream(
    name: str, chunks: Sequence[str | tuple[str, list[int]]], tokenizer: object = None
) -> tuple[list[ParserEvent], ParseResult]:
    parser = get_parser(name, tokenizer=tokenizer)  # type: ignore[arg-type]
    events: list[ParserEvent] = []
    for chunk in chunks:
        events += parser.feed(*chunk) if isinstance(chunk, tuple) else parser.feed(chunk)
    result = parser.finish()
    events += result.final_events
    return events, result


def _settings(cases: int) -> settings:
    return settings(
        max_examples=cases,
        deadline=None,
        derandomize=True,  # the same cases on every run: a CI failure reproduces locally
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )


def _report(kind: str, counts: Counter[str], seconds: Counter[str], cases: int) -> None:
    for name in ALL_NAMES:
        print(f"{kind} {name}: {counts[name]} cases, {seconds[name]:.2f} s")
    assert min(counts[name] for name in ALL_NAMES) >= cases


_BYTES = st.binary(max_size=12)
_SHORT_BYTES = st.binary(max_size=10)


@pytest.mark.parametrize("cases", CASES)
def test_any_text_in_any_chunking_never_raises_and_streams_as_whole(cases: int) -> None:
    counts: Counter[str] = Counter()
    seconds: Counter[str] = Counter()

    @_settings(cases)
    @given(pieces=_BYTES, cuts=st.binary(max_size=8))
    def check(pieces: bytes, cuts: bytes) -> None:
        text = _text(pieces)
        chunks = _chunks(text, cuts)
        for name in ALL_NAMES:
            start = time.perf_counter()
            whole_events, whole = _stream(name, [text])
            _encodable(whole)
            events, result = _stream(name, chunks)
            assert call_key(result) == call_key(whole), (name, chunks)
            assert normalize(events) == normalize(whole_events), (name, chunks)
            seconds[name] += time.perf_counter() - start
            counts[name] += 1

    check()
    _report("text", counts, seconds, cases)


class _Tokens:
    """A tokenizer whose specials are every format's markers: ids 1..n; any other character
    is its own token (100_000 + code point); ids it does not know decode to nothing (as
    Qwen's and HF's do)."""

    def __init__(self, specials: Sequence[str]) -> None:
        self.special_tokens = {s: i + 1 for i, s in enumerate(dict.fromkeys(specials))}
        self.by_id = {i: s for s, i in self.special_tokens.items()}

    def piece(self, token: int) -> str:
        if token in self.by_id:
            return self.by_id[token]
        return chr(token - 100_000) if 100_000 <= token < 100_000 + 0x110000 else ""

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.piece(t) for t in ids)


_TOKENS = _Tokens(sorted({a for name in ATOMS for a in ATOMS[name] if len(a) > 1 and a[0] in "<["}))
#: Ids a server might send that decode to nothing here: out of range, negative, huge.
_ODD_IDS = (0, -1, -5, 2**31, 2**31 - 1, 10**6, 2**63)


def _token_stream(pieces: bytes, plan: bytes) -> list[tuple[list[int], bool]]:
    """The pieces as ids (markers as special ids, odd ids mixed in), cut into chunks, each
    decoded with its special tokens spelled or skipped (``(ids, skipped)``, from ``plan``)."""
    ids: list[int] = []
    specials = _TOKENS.special_tokens
    for n, b in enumerate(pieces):
        piece = SHORT_PIECES[b % len(SHORT_PIECES)]
        if piece in specials:
            ids.append(specials[piece])
        else:
            ids += [100_000 + ord(c) for c in piece]
        if plan[n % len(plan)] % 5 == 0:
            ids.append(_ODD_IDS[b % len(_ODD_IDS)])
    chunks: list[tuple[list[int], bool]] = []
    i = n = 0
    while i < len(ids):
        b = plan[n % len(plan)]
        chunks.append((ids[i : i + 1 + b % 8], b & 0x80 != 0))
        i += 1 + b % 8
        n += 1
    return chunks


def _spelled(ids: list[int], skipped: bool, keep: set[str]) -> str:
    """The text of one chunk: specials spelled, or (``skipped``) dropped except those in
    ``keep`` (what a parser that knows them as markers puts back)."""
    texts = (_TOKENS.piece(t) for t in ids if not skipped or t not in _TOKENS.by_id)
    if skipped and keep:
        texts = (
            _TOKENS.piece(t) for t in ids if t not in _TOKENS.by_id or _TOKENS.by_id[t] in keep
        )
    return "".join(texts)


def _markers(name: str) -> set[str]:
    fmt = PARSER_REGISTRY[name].FORMAT
    assert fmt is not None
    spellings = (*fmt.call_open, *fmt.section_open, *fmt.section_close, *fmt.drop)
    return {*spellings, *(fmt.think or ()), *fmt.body.spellings()}


_MARKERS = {name: _markers(name) for name in ALL_NAMES}


@pytest.mark.parametrize("cases", CASES)
def test_any_token_ids_never_raise_and_stream_as_the_spelled_text(cases: int) -> None:
    counts: Counter[str] = Counter()
    seconds: Counter[str] = Counter()

    @_settings(cases)
    @given(pieces=_SHORT_BYTES, plan=st.binary(min_size=1, max_size=8))
    def check(pieces: bytes, plan: bytes) -> None:
        chunks = _token_stream(pieces, plan)
        fed = [(_spelled(ids, skipped, set()), ids) for ids, skipped in chunks]
        for name in ALL_NAMES:
            start = time.perf_counter()
            text = "".join(_spelled(ids, skipped, _MARKERS[name]) for ids, skipped in chunks)
            whole_events, whole = _stream(name, [text])
            events, result = _stream(name, fed, tokenizer=_TOKENS)
            _encodable(result)
            assert call_key(result) == call_key(whole), (name, chunks)
            assert normalize(events) == normalize(whole_events), (name, chunks)
            seconds[name] += time.perf_counter() - start
            counts[name] += 1

    check()
    _report("tokens", counts, seconds, cases)

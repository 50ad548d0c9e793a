"""``deepseek_v3``, ``deepseek_v3_1`` (alias ``deepseek_v31``), ``deepseek_v4`` (alias ``deepseek_dsml``).

Wire formats (the bars are U+FF5C, the word separators U+2581)::

    deepseek_v3:
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>terminal
    ```json
    {"command": "ls"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

    deepseek_v3_1:
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>terminal<｜tool▁sep｜>{"command": "ls"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

    deepseek_v4 / deepseek_dsml:
    <｜DSML｜tool_calls_begin｜>
    <｜DSML｜tool_call_begin｜>terminal
    ```json
    {"command": "ls"}
    ```
    <｜DSML｜tool_call_end｜>
    <｜DSML｜tool_calls_end｜>

DSML markers are also accepted in ASCII, spaced ASCII and with ``▁`` for ``_``.
Differences from the reference: docs/decisions/008-parsers-versus-reference.md.
"""

from __future__ import annotations

from hermes_async.parsers._bodies import NamedJsonSpec
from hermes_async.parsers._engine import Format

__all__ = (
    "DEEPSEEK_V3",
    "DEEPSEEK_V3_1",
    "DEEPSEEK_V4",
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

DEEPSEEK_V3 = Format(
    name="deepseek_v3",
    section_open=(CALLS_BEGIN,),
    section_close=(CALLS_END,),
    call_open=(CALL_BEGIN,),
    body=NamedJsonSpec(
        prefix=(SEP,), name_end=("\n",), brace_ends_name=True, fence=True, close=(CALL_END,)
    ),
)

DEEPSEEK_V3_1 = Format(
    name="deepseek_v3_1",
    section_open=(CALLS_BEGIN,),
    section_close=(CALLS_END,),
    call_open=(CALL_BEGIN,),
    body=NamedJsonSpec(name_end=(SEP,), fence=True, close=(CALL_END,)),
)


def _dsml(word: str) -> tuple[str, ...]:
    """Every accepted spelling of one DSML marker (``word`` uses ``_`` between words)."""
    words = {word, word.replace("_", "▁")}
    spellings: list[str] = []
    for w in sorted(words):
        spellings += [
            f"<｜DSML｜{w}｜>",
            f"<|DSML|{w}|>",
            f"< | DSML | {w} >",
            f"< | DSML | {w} | >",
        ]
    return tuple(spellings)


DEEPSEEK_V4 = Format(
    name="deepseek_v4",
    section_open=_dsml("tool_calls_begin"),
    section_close=_dsml("tool_calls_end"),
    call_open=_dsml("tool_call_begin"),
    body=NamedJsonSpec(
        name_end=("\n",), brace_ends_name=True, fence=True, close=_dsml("tool_call_end")
    ),
)

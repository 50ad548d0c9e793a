"""Text renderings for dashboards and terminals: trajectories, progress, the summary table.

Everything here is pure (strings in, strings out) except :class:`ProgressBar`, which writes to
a stream. Trajectories are redacted (:func:`~hermes_async._redact.redact`) because they go
to wandb tables and terminals.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from hermes_async._redact import redact

__all__ = ["ProgressBar", "format_table", "format_trajectory_for_display"]

#: Truncation of each section, as the reference's display did.
REASONING_DISPLAY_CHARS = 300
TOOL_ARGS_DISPLAY_CHARS = 200
TOOL_RESULT_DISPLAY_CHARS = 500


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def format_trajectory_for_display(messages: Sequence[Mapping[str, Any]]) -> str:
    """Render a rollout for the wandb rollout table: one section per message, tool calls shown.

    Sections: ``[SYSTEM]``, ``[USER]``, ``[ASSISTANT thinking]`` (300 chars),
    ``[ASSISTANT]``, ``[TOOL CALL] name(args)`` (200 chars of arguments), ``[TOOL RESULT]``
    (500 chars). The text is redacted of secrets.
    """
    parts: list[str] = []
    for message in messages:
        role = str(message.get("role", ""))
        content = message.get("content")
        text = content if isinstance(content, str) else ("" if content is None else str(content))
        if role == "system":
            parts.append(f"[SYSTEM]\n{text}")
        elif role == "user":
            parts.append(f"[USER]\n{text}")
        elif role == "assistant":
            reasoning = message.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                parts.append(f"[ASSISTANT thinking]\n{_clip(reasoning, REASONING_DISPLAY_CHARS)}")
            if text:
                parts.append(f"[ASSISTANT]\n{text}")
            for call in message.get("tool_calls") or []:
                function = call.get("function", {}) if isinstance(call, Mapping) else {}
                name = function.get("name", "?") if isinstance(function, Mapping) else "?"
                args = function.get("arguments", "") if isinstance(function, Mapping) else ""
                args_text = args if isinstance(args, str) else str(args)
                parts.append(f"[TOOL CALL] {name}({_clip(args_text, TOOL_ARGS_DISPLAY_CHARS)})")
        elif role == "tool":
            parts.append(f"[TOOL RESULT]\n{_clip(text, TOOL_RESULT_DISPLAY_CHARS)}")
        else:
            parts.append(f"[{role.upper()}]\n{text}")
    return redact("\n\n".join(parts))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with right-aligned numbers and left-aligned text."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    numeric = [
        all(isinstance(row[i], int | float) for row in rows) if rows else False
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        out = []
        for i, value in enumerate(values):
            out.append(value.rjust(widths[i]) if numeric[i] else value.ljust(widths[i]))
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


class ProgressBar:
    """A one-line progress bar (redrawn in place on a terminal, one line per step otherwise).

    Args:
        total: Steps expected.
        label: Shown before the bar.
        stream: Where to draw (default ``sys.stderr``).
        width: Bar width in characters.
    """

    def __init__(
        self, total: int, label: str = "", *, stream: TextIO | None = None, width: int = 30
    ) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.done = 0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def render(self, note: str = "") -> str:
        """The bar's text for the current count."""
        filled = min(self.width, self.width * self.done // self.total)
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label} [{bar}] {self.done}/{self.total} {note}".rstrip()

    def advance(self, note: str = "") -> None:
        """Count one step and redraw."""
        self.done += 1
        text = self.render(note)
        if self._tty:
            self.stream.write("\r\x1b[2K" + text)
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the line if the bar was left unfinished on a terminal."""
        if self._tty and self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()

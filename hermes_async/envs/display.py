"""Text renderings for dashboards and terminals: trajectories, progress, tables.

Everything here is pure (strings in, strings out) except :class:`ProgressBar`, which writes to
a stream. Trajectories are redacted (:func:`~hermes_async._redact.redact`) because they go
to wandb tables and terminals.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

from hermes_async._redact import redact
from hermes_async.agent import FAILURE_CATEGORIES, ToolError

__all__ = (
    "ProgressBar",
    "failure_metrics",
    "format_failures",
    "format_table",
    "format_tool_errors",
    "format_trajectory_for_display",
    "tool_error_entry",
    "wandb_rows",
)

#: Truncation of each section, as the reference's display did.
REASONING_DISPLAY_CHARS = 300
TOOL_ARGS_DISPLAY_CHARS = 200
TOOL_RESULT_DISPLAY_CHARS = 500


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def tool_error_entry(error: ToolError) -> dict[str, Any]:
    """One tool error as kept for the ``train/tool_error_details`` metric (redacted, clipped)."""
    return {
        "turn": error.turn,
        "tool": error.tool_name,
        "args": redact(error.arguments[:150]),
        "error": redact(error.error[:300]),
        "result": redact(error.tool_result[:300]),
    }


def format_tool_errors(entries: Sequence[Mapping[str, Any]]) -> str:
    """``[turn N] tool(args) -> error`` lines of :func:`tool_error_entry` records."""
    return "\n".join(
        f"[turn {e['turn']}] {e['tool']}({e['args'][:80]}) -> {e['error'][:150]}" for e in entries
    )


def wandb_rows(
    scored_data: Mapping[str, Any], keep: int, decode: Callable[[Sequence[int]], str]
) -> list[tuple[str, float]]:
    """``(text, score)`` rows of the first ``keep`` rollouts (``-1``: all), redacted.

    A rollout's text is its trajectory, or its decoded tokens when the group has no messages.
    """
    scores = list(scored_data.get("scores") or [])
    if keep == -1:
        keep = len(scores)
    messages = scored_data.get("messages") or []
    rows: list[tuple[str, float]] = []
    for index in range(min(keep, len(scores))):
        if index < len(messages) and messages[index]:
            text = format_trajectory_for_display(messages[index])
        else:
            text = redact(decode(scored_data["tokens"][index]))
        rows.append((text, scores[index]))
    return rows


def format_trajectory_for_display(messages: Sequence[Mapping[str, Any]]) -> str:
    """Render a rollout for the wandb rollout table: one redacted section per message."""
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


def format_failures(categories: Iterable[str | None]) -> str:
    """``infra:2 verifier:1`` (most severe first), or ``-`` when there is none."""
    counts = Counter(c for c in categories if c is not None)
    parts = [f"{c}:{counts[c]}" for c in FAILURE_CATEGORIES if counts[c]]
    return " ".join(parts) or "-"


def failure_metrics(prefix: str, counts: Mapping[str, int]) -> dict[str, float]:
    """``{prefix}/failures/<category>`` for every category (0 included, for stable charts)."""
    return {f"{prefix}/failures/{c}": float(counts.get(c, 0)) for c in FAILURE_CATEGORIES}


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
        total: Steps expected (``None``: unknown; the count is shown without a bar).
        status: Called at each redraw for a status line shown after the bar.
    """

    def __init__(
        self,
        total: int | None,
        label: str = "",
        *,
        stream: TextIO | None = None,
        width: int = 30,
        status: Callable[[], str] | None = None,
    ) -> None:
        self.total = None if total is None else max(total, 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.status = status
        self.done = 0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def render(self, note: str = "") -> str:
        if self.total is None:
            text = f"{self.label} {self.done} done {note}".rstrip()
        else:
            filled = min(self.width, self.width * self.done // self.total)
            bar = "#" * filled + "." * (self.width - filled)
            text = f"{self.label} [{bar}] {self.done}/{self.total} {note}".rstrip()
        if self.status is not None:
            text += " | " + self.status()
        return text

    def advance(self, note: str = "") -> None:
        self.done += 1
        text = self.render(note)
        if self._tty:
            self.stream.write("\r\x1b[2K" + text)
            if self.total is not None and self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the line if the bar was left unfinished on a terminal."""
        if self._tty and (self.total is None or self.done < self.total):
            self.stream.write("\n")
            self.stream.flush()

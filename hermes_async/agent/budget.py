"""The tool-result budget: oversized tool results are saved into the sandbox, the model sees a preview.

A result over its tool's threshold, and the largest results of a turn over the turn budget,
are written to the sandbox and replaced by a ``<persisted-output>`` preview. ``read_file`` is
exempt: persisting a read would loop. Layers and reasons: docs/decisions/026-tool-result-budget.md.
"""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
from collections.abc import Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import anyio

from hermes_async.errors import SandboxError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools.sandbox.base import Sandbox

__all__ = (
    "DEFAULT_BUDGET",
    "DEFAULT_PREVIEW_SIZE_CHARS",
    "DEFAULT_RESULT_SIZE_CHARS",
    "DEFAULT_TURN_BUDGET_CHARS",
    "PERSISTED_OUTPUT_TAG",
    "PINNED_THRESHOLDS",
    "BudgetConfig",
    "content_for_file",
    "enforce_turn_budget",
    "maybe_persist_tool_result",
    "next_to_persist",
    "render_preview",
    "resolve_threshold",
    "result_file_name",
)

logger = logging.getLogger(__name__)

#: Per-result threshold (characters). 100 K characters is roughly 25 K tokens: large enough
#: for any sensible single observation, small enough that two cannot fill a 64 K context.
DEFAULT_RESULT_SIZE_CHARS = 100_000
#: Aggregate budget of one turn's tool results (characters): two full-size results.
DEFAULT_TURN_BUDGET_CHARS = 200_000
#: Characters of the original result kept in the preview.
DEFAULT_PREVIEW_SIZE_CHARS = 1_500
#: Tools whose results are never persisted, whatever the configuration says.
PINNED_THRESHOLDS: Mapping[str, float] = MappingProxyType({"read_file": math.inf})
#: The tag that marks a persisted result (a result already carrying it is never persisted again).
PERSISTED_OUTPUT_TAG = "<persisted-output>"
#: Deadline for writing one result into the sandbox.
_PERSIST_TIMEOUT_SECONDS = 30.0
#: ``read_file`` shows at most this many characters of a line; longer lines need another way.
_READ_FILE_LINE_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    """Thresholds of the tool-result budget, in characters.

    ``tool_overrides`` sets per-tool thresholds (``math.inf`` exempts; ``read_file`` is pinned).
    """

    default_result_size: int = DEFAULT_RESULT_SIZE_CHARS
    turn_budget: int = DEFAULT_TURN_BUDGET_CHARS
    preview_size: int = DEFAULT_PREVIEW_SIZE_CHARS
    tool_overrides: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("default_result_size", "turn_budget", "preview_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"BudgetConfig.{name} must be an int >= 0, got {value!r}")
        for tool, threshold in self.tool_overrides.items():
            if (
                isinstance(threshold, bool)
                or not isinstance(threshold, int | float)
                or not threshold >= 0
            ):
                raise ValueError(
                    f"BudgetConfig.tool_overrides[{tool!r}] must be a number >= 0, got {threshold!r}"
                )
        # Freeze the overrides so the config is safely shareable between rollouts.
        object.__setattr__(self, "tool_overrides", MappingProxyType(dict(self.tool_overrides)))

    def resolve_threshold(self, tool_name: str, tool_threshold: int | None = None) -> float:
        """The persist threshold for ``tool_name``; see :func:`resolve_threshold`."""
        return resolve_threshold(self, tool_name, tool_threshold)


#: The reference's defaults (100,000 / 200,000 / 1,500; read_file exempt).
DEFAULT_BUDGET = BudgetConfig()


def resolve_threshold(
    config: BudgetConfig, tool_name: str, tool_threshold: int | None = None
) -> float:
    """The threshold above which a result of ``tool_name`` is persisted (order: decision 026)."""
    if tool_name in PINNED_THRESHOLDS:
        return PINNED_THRESHOLDS[tool_name]
    if tool_name in config.tool_overrides:
        return float(config.tool_overrides[tool_name])
    if tool_threshold is not None:
        return float(min(tool_threshold, config.default_result_size))
    return float(config.default_result_size)


def result_file_name(tool_use_id: str, nonce: str | None = None) -> str:
    """A file name unique to one call: the sanitized call id plus a random suffix."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", tool_use_id).strip(".")[:80] or "call"
    return f"{safe}-{nonce or secrets.token_hex(4)}.txt"


def _preview(content: str, size: int) -> tuple[str, bool]:
    """The first ``size`` chars, cut at the last newline if that keeps more than half."""
    if len(content) <= size:
        return content, False
    head = content[:size]
    cut = head.rfind("\n")
    if cut > size // 2:
        head = head[:cut]
    return head, True


def content_for_file(content: str) -> str:
    """What is saved: ``content``, pretty-printed when it is JSON with lines ``read_file`` cuts."""
    if max((len(x) for x in content.split("\n")), default=0) <= _READ_FILE_LINE_CHARS:
        return content
    stripped = content.lstrip()
    if stripped[:1] in ("{", "["):
        try:
            value = json.loads(content)
        except ValueError:
            return content
        return json.dumps(value, ensure_ascii=False, indent=1)
    return content


def render_preview(
    content: str, path: str | None, preview_size: int, saved: str | None = None
) -> str:
    """The text that replaces an oversized result saved at ``path`` (``None``: not saved)."""
    preview, more = _preview(content, preview_size)
    if path is None:
        return (
            f"{preview}\n\n[Truncated: tool response was {len(content):,} chars. "
            "Full output could not be saved to sandbox.]"
        )
    saved = content if saved is None else saved
    n_bytes = len(content.encode("utf-8", "surrogatepass"))
    total_lines = saved.count("\n") + (0 if saved.endswith("\n") else 1)
    howto = (
        f"Use the read_file tool with offset and limit to access specific sections of this "
        f"output (it has {total_lines:,} lines; e.g. read_file(path={json.dumps(path)}, "
        "offset=1, limit=200)), or search_files to find a specific part."
    )
    if max((len(x) for x in saved.split("\n")), default=0) > _READ_FILE_LINE_CHARS:
        howto += (
            f" Some lines are longer than {_READ_FILE_LINE_CHARS:,} characters, which read_file "
            "cuts; use the terminal (e.g. `cut -c 2001-4000 FILE`) to see the rest of them."
        )
    return (
        f"{PERSISTED_OUTPUT_TAG}\n"
        f"This tool result was too large ({len(content):,} characters, {n_bytes / 1024:.1f} KB).\n"
        f"Full output saved to: {path}\n"
        f"{howto}\n\n"
        f"Preview (first {len(preview):,} chars):\n"
        f"{preview}\n" + ("...\n" if more else "") + "</persisted-output>"
    )


def next_to_persist(
    lengths: Sequence[int], eligible: Sequence[bool], turn_budget: int
) -> int | None:
    """Index of the largest eligible result (earliest on ties), or ``None`` when the turn fits."""
    if sum(lengths) <= turn_budget:
        return None
    best: int | None = None
    for i, (n, ok) in enumerate(zip(lengths, eligible, strict=True)):
        if ok and n > 0 and (best is None or n > lengths[best]):
            best = i
    return best


async def _save(sandbox: Sandbox, name: str, text: str) -> str:
    """Write ``text`` to the results directory inside ``sandbox``; return its absolute path."""
    script = (
        'd="${TMPDIR:-/tmp}/hermes-results" && mkdir -p "$d" && '
        f'cat > "$d/{name}" && printf "%s" "$d/{name}"'
    )
    result = await sandbox.exec(
        script, stdin=text.encode("utf-8", "surrogatepass"), timeout=_PERSIST_TIMEOUT_SECONDS
    )
    path = result.stdout.strip()
    if result.exit_code != 0 or not path:
        raise SandboxError(
            f"could not save a tool result into the sandbox (exit {result.exit_code}): "
            f"{result.stderr.strip()[:200]}"
        )
    return path


async def _persist(
    content: str, tool_use_id: str, sandbox: Sandbox | None, preview_size: int
) -> str:
    if sandbox is None:
        return render_preview(content, None, preview_size)
    saved = content_for_file(content)
    try:
        path = await _save(sandbox, result_file_name(tool_use_id), saved)
    except anyio.get_cancelled_exc_class():
        raise
    except (SandboxError, OSError) as exc:
        logger.warning("tool result %s not persisted: %s", tool_use_id, exc)
        return render_preview(content, None, preview_size)
    return render_preview(content, path, preview_size, saved)


async def maybe_persist_tool_result(
    content: str,
    tool_name: str,
    tool_use_id: str,
    sandbox: Sandbox | None,
    config: BudgetConfig = DEFAULT_BUDGET,
    *,
    threshold: float | None = None,
    tool_threshold: int | None = None,
) -> str:
    """Return ``content``, or a ``<persisted-output>`` preview if it is over its threshold.

    ``tool_use_id`` names the saved file; ``sandbox=None`` means it cannot be saved (the preview
    says so); ``threshold`` skips resolving one.

    **Cancellation**: the sandbox write is cancelled (a partial file goes with the sandbox).
    """
    limit = (
        threshold if threshold is not None else resolve_threshold(config, tool_name, tool_threshold)
    )
    if math.isinf(limit) or len(content) <= limit or content.startswith(PERSISTED_OUTPUT_TAG):
        return content
    return await _persist(content, tool_use_id, sandbox, config.preview_size)


async def enforce_turn_budget(
    tool_messages: MutableSequence[JSONObject],
    sandbox: Sandbox | None,
    config: BudgetConfig = DEFAULT_BUDGET,
    *,
    tool_names: Sequence[str | None] | None = None,
) -> list[int]:
    """Persist the turn's largest tool results until their total fits ``config.turn_budget``.

    ``tool_messages`` are OpenAI ``tool`` messages, replaced in place. Returns the indices
    replaced, in order.

    **Cancellation**: a write in progress is cancelled; earlier replacements stay.
    """

    def eligible(i: int, msg: JSONObject) -> bool:
        content = msg.get("content")
        if not isinstance(content, str) or content.startswith(PERSISTED_OUTPUT_TAG):
            return False
        if len(content) <= config.preview_size:
            return False  # its preview would be no shorter
        name = tool_names[i] if tool_names is not None else msg.get("name")
        return not (isinstance(name, str) and name in PINNED_THRESHOLDS)

    replaced: list[int] = []
    done: set[int] = set()
    while True:
        lengths = [
            len(m["content"]) if isinstance(m.get("content"), str) else 0 for m in tool_messages
        ]
        flags = [i not in done and eligible(i, m) for i, m in enumerate(tool_messages)]
        index = next_to_persist(lengths, flags, config.turn_budget)
        if index is None:
            return replaced
        done.add(index)
        msg = tool_messages[index]
        call_id = str(msg.get("tool_call_id") or f"turn-{index}")
        new = await _persist(msg["content"], call_id, sandbox, config.preview_size)
        if new != msg["content"]:
            msg["content"] = new
            replaced.append(index)

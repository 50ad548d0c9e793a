"""The run viewer: one self-contained HTML page of a run folder's ``samples.jsonl``.

Every rollout per task with its whole conversation, filterable; the page loads nothing. Model
text is hostile: every string is escaped and redacted here, and the page's one script reads
data attributes only. At most :data:`MAX_ROLLOUTS` rollouts and :data:`MAX_TEXT_CHARS` per text.
See docs/decisions/009-run-folder-and-viewer.md.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hermes_async._redact import redact
from hermes_async.agent import FAILURE_CATEGORIES
from hermes_async.envs.results import format_summary
from hermes_async.envs.runs import (
    SAMPLES_FILE,
    VIEWER_FILE,
    RunInfo,
    Samples,
    read_samples,
)

__all__ = (
    "MAX_ROLLOUTS",
    "MAX_TEXT_CHARS",
    "PREVIEW_CHARS",
    "render_html",
    "write_viewer",
)

#: Rollouts rendered into one page; the others are counted in a note.
MAX_ROLLOUTS = 2_000
#: Characters of one text (a message, a tool result, arguments) put into the page.
MAX_TEXT_CHARS = 50_000
#: Characters of a tool result shown before "show the rest".
PREVIEW_CHARS = 1_000


def write_viewer(run_dir: Path, *, samples: Samples | None = None) -> Path:
    """Write ``run_dir/index.html`` from its ``samples.jsonl`` (or ``samples``); its path."""
    samples = samples if samples is not None else read_samples(run_dir / SAMPLES_FILE)
    info = RunInfo.read(run_dir)
    notes = []
    if samples.skipped:
        notes.append(f"{samples.skipped} lines of {SAMPLES_FILE} were not records (skipped)")
    if samples.unread:
        notes.append(f"{samples.unread} lines of {SAMPLES_FILE} were not read (too many)")
    page = render_html(samples.rows, title=run_dir.name, info=info, notes=notes)
    path = run_dir / VIEWER_FILE
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(page, "utf-8")
    temporary.replace(path)
    return path


def render_html(
    rows: Sequence[Mapping[str, Any]],
    *,
    title: str,
    info: RunInfo | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The page for ``rows`` (lines of ``samples.jsonl``), as one string."""
    from hermes_async.envs._eval import summary_from_sample

    _escaped.cache_clear()  # one page's memo: the environment's secrets may have changed
    shown = list(rows[:MAX_ROLLOUTS])
    notes = list(notes)
    if len(rows) > len(shown):
        notes.append(f"showing the first {len(shown)} of {len(rows)} rollouts")
    tasks: dict[str, list[Mapping[str, Any]]] = {}
    for row in shown:
        tasks.setdefault(str(row.get("task", "")), []).append(row)
    summaries = [summary_from_sample(row) for row in rows]
    seconds = info.seconds if info is not None and info.seconds is not None else 0.0
    present = sorted({_category(r) for r in shown} - {"none"}, key=_severity)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        f"style-src 'unsafe-inline'; script-src '{_SCRIPT_HASH}'\">",
        '<meta name="referrer" content="no-referrer">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_text(title)}</title><style>{_STYLE}</style></head><body>",
        f"<header><h1>{_text(title)}</h1>{_info(info)}",
        f'<pre class="summary">{_text(format_summary(summaries, seconds))}</pre>',
        *(f'<p class="note">{_text(note)}</p>' for note in notes),
        "</header>",
        _filters(present, len(shown)),
        "<main>",
        *(
            _task(label, group, first=i == 0, many=len(tasks) > 10)
            for i, (label, group) in enumerate(tasks.items())
        ),
        "</main>",
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------
# pieces


def _text(value: object, limit: int = MAX_TEXT_CHARS) -> str:
    """Redacted, capped, escaped text."""
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    if len(text) > limit:
        text = text[:limit] + f"\n... {len(text) - limit} more characters (see {SAMPLES_FILE})"
    return _escaped(text) if len(text) <= _MEMO_CHARS else html.escape(redact(text), quote=True)


#: Texts up to this long are memoized: a run repeats its system prompt, task prompts, tool
#: names and short results in every rollout, and redaction is most of the page's cost.
_MEMO_CHARS = 4096


@functools.lru_cache(maxsize=2048)
def _escaped(text: str) -> str:
    return html.escape(redact(text), quote=True)


def _info(info: RunInfo | None) -> str:
    if info is None:
        return ""
    facts = [
        ("environment", f"{info.env_name} ({info.env})"),
        ("mode", info.mode),
        ("model", info.model),
        ("started", info.to_json()["started_local"]),
        ("wall time", f"{info.seconds:.1f} s" if info.seconds is not None else "running"),
        ("command", info.command),
    ]
    items = "".join(f"<dt>{_text(k)}</dt><dd>{_text(v)}</dd>" for k, v in facts)
    return f'<dl class="run">{items}</dl>'


def _filters(categories: Iterable[str], count: int) -> str:
    failures = "".join(f'<option value="{_text(c)}">{_text(c)}</option>' for c in categories)
    return (
        '<nav class="filters">'
        '<label>reward <select id="f-reward"><option value="all">any</option>'
        '<option value="pass">1 (pass)</option><option value="partial">between 0 and 1</option>'
        '<option value="zero">0</option></select></label>'
        '<label>failure <select id="f-failure"><option value="all">any</option>'
        f'<option value="none">none</option>{failures}</select></label>'
        '<label>task <input id="f-task" type="search" placeholder="name contains"></label>'
        f'<span id="f-count">{count} of {count} rollouts</span></nav>'
    )


def _category(row: Mapping[str, Any]) -> str:
    failure = row.get("failure")
    category = failure.get("category") if isinstance(failure, Mapping) else None
    return str(category) if category else "none"


def _severity(category: str) -> int:
    order = list(FAILURE_CATEGORIES)
    return order.index(category) if category in order else len(order)


def _reward_class(reward: float) -> str:
    return "pass" if reward >= 1.0 else ("partial" if reward > 0.0 else "zero")


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _task(label: str, rows: Sequence[Mapping[str, Any]], *, first: bool, many: bool) -> str:
    """A task's rollouts; its first one open, unless there are many tasks (then only the
    page's first)."""
    rewards = [_number(r.get("reward")) for r in rows]
    mean = sum(rewards) / len(rewards)
    plural = "rollout" if len(rows) == 1 else "rollouts"
    head = (
        f'<h2>{_text(label) or "(no task name)"} <span class="dim">{len(rows)} {plural}, '
        f"mean reward {mean:.2f}</span></h2>"
    )
    opened = first or not many
    body = "".join(_rollout(row, open_=opened and i == 0) for i, row in enumerate(rows))
    return f'<section class="task" data-task="{_text(label.lower())}">{head}{body}</section>'


def _rollout(row: Mapping[str, Any], *, open_: bool) -> str:
    reward = _number(row.get("reward"))
    category = _category(row)
    counts = row.get("token_counts")
    tokens = f"{int(_number(row.get('tokens')))} tokens"
    if isinstance(counts, Mapping):
        tokens += (
            f" ({int(_number(counts.get('prompt')))} prompt, "
            f"{int(_number(counts.get('completion')))} generated)"
        )
    summary = (
        f'<summary><span class="reward r-{_reward_class(reward)}">{reward:.2f}</span> '
        f'<span class="key">{_text(row.get("item_key", ""))}</span> '
        f'<span class="fail f-{_text(category)}">{_text("" if category == "none" else category)}'
        "</span> "
        f'<span class="dim">{int(_number(row.get("turns")))} turns, {_text(tokens)}, '
        f"{_number(row.get('seconds')):.2f} s</span></summary>"
    )
    failure = row.get("failure")
    facts = [
        ("task id", row.get("task_id")),
        ("attempt", row.get("attempt")),
        ("finished naturally", row.get("finished_naturally")),
        ("error", row.get("error")),
        ("failure", failure.get("message") if isinstance(failure, Mapping) else None),
    ]
    items = "".join(
        f"<dt>{_text(k)}</dt><dd>{_text(v)}</dd>" for k, v in facts if v not in (None, "")
    )
    errors = row.get("tool_errors") or []
    if errors:
        listed = "".join(f"<li>{_text(e)}</li>" for e in errors[:50])
        items += f'<dt>tool errors</dt><dd><ul class="errors">{listed}</ul></dd>'
    messages = row.get("messages")
    conversation = (
        _conversation(messages, row)
        if isinstance(messages, list)
        else f"<pre>{_text(row.get('trajectory') or row.get('response') or '')}</pre>"
    )
    return (
        f'<details class="rollout" data-reward="{_reward_class(reward)}" '
        f'data-failure="{_text(category)}"{" open" if open_ else ""}>{summary}'
        f'<div class="body"><dl class="facts">{items}</dl>{conversation}</div></details>'
    )


def _conversation(messages: Sequence[Any], row: Mapping[str, Any]) -> str:
    timings = {
        int(_number(t.get("turn"))): t for t in row.get("timings") or () if isinstance(t, Mapping)
    }
    counts = row.get("token_counts")
    per_turn = counts.get("per_turn") if isinstance(counts, Mapping) else None
    names: dict[str, str] = {}  # tool_call_id -> tool name
    turn = 0
    out = ['<ol class="turns">']
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role", ""))
        if role == "assistant":
            turn += 1
            generated = (
                per_turn[turn - 1] if isinstance(per_turn, list) and turn <= len(per_turn) else None
            )
            out.append(_assistant(message, turn, timings.get(turn), generated, names))
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id", "")), "")
            out.append(_tool_result(message.get("content"), name))
        elif role == "system":  # long and the same in every rollout: folded
            text = _content(message.get("content"))
            out.append(
                f'<li class="msg system"><details><summary class="role">system prompt '
                f"({len(text)} characters)</summary><pre>{_text(text)}</pre></details></li>"
            )
        else:
            out.append(
                f'<li class="msg {_text(role)}"><div class="role">{_text(role)}</div>'
                f"<pre>{_text(_content(message.get('content')))}</pre></li>"
            )
    out.append("</ol>")
    return "".join(out)


def _content(content: object) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    if isinstance(content, list):  # OpenAI content parts
        return "\n".join(
            str(part.get("text", "")) if isinstance(part, Mapping) else str(part)
            for part in content
        )
    return str(content)


def _assistant(
    message: Mapping[str, Any],
    turn: int,
    timing: Mapping[str, Any] | None,
    generated: object,
    names: dict[str, str],
) -> str:
    head = [f"assistant, turn {turn}"]
    if timing is not None:
        for key, label in (
            ("time_to_first_token", "to first token"),
            ("generation_seconds", "generating"),
            ("tool_seconds", "in tools"),
        ):
            if isinstance(timing.get(key), int | float):
                head.append(f"{_number(timing.get(key)):.2f} s {label}")
    if isinstance(generated, int):
        head.append(f"{generated} tokens")
    parts = [f'<li class="msg assistant"><div class="role">{_text(", ".join(head))}</div>']
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        parts.append(
            f'<details class="reasoning"><summary>reasoning ({len(reasoning)} characters)'
            f"</summary><pre>{_text(reasoning)}</pre></details>"
        )
    content = _content(message.get("content"))
    if content:
        parts.append(f'<pre class="content">{_text(content)}</pre>')
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        name = str(function.get("name", "?"))
        names[str(call.get("id", ""))] = name
        parts.append(
            f'<div class="call"><div class="call-name">{_text(name)}</div>'
            f'<pre class="args">{_text(_pretty(function.get("arguments")))}</pre></div>'
        )
    parts.append("</li>")
    return "".join(parts)


def _pretty(arguments: object) -> str:
    value = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            return arguments
    try:
        return json.dumps(value, indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(arguments)


def _tool_result(content: object, name: str) -> str:
    label = f"tool result{f' ({name})' if name else ''}"
    return (
        f'<li class="msg tool"><div class="role">{_text(label)}</div>'
        f"{_long(_content(content))}</li>"
    )


def _long(text: str) -> str:
    """A preview of ``text``, the rest (capped) behind a click."""
    if len(text) <= PREVIEW_CHARS:
        return f"<pre>{_text(text)}</pre>"
    rest = text[PREVIEW_CHARS:]
    return (
        f"<pre>{_text(text[:PREVIEW_CHARS])}</pre>"
        f'<details class="more"><summary>show the rest ({len(rest)} more characters)</summary>'
        f"<pre>{_text(rest, MAX_TEXT_CHARS - PREVIEW_CHARS)}</pre></details>"
    )


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:0 1em 4em;color:#222}
h1{font-size:1.4em;margin:.8em 0 .3em}h2{font-size:1.15em;margin:1.2em 0 .4em}
.dim{color:#666;font-weight:normal;font-size:.9em}
dl.run,dl.facts{display:grid;grid-template-columns:max-content auto;gap:.1em 1em;margin:.4em 0}
dt{color:#666}dd{margin:0;white-space:pre-wrap;word-break:break-word}
pre{white-space:pre-wrap;word-break:break-word;margin:.2em 0;font:12.5px/1.35 ui-monospace,monospace}
pre.summary{background:#f6f6f6;padding:.6em;overflow-x:auto;white-space:pre}
.note{color:#a60}
nav.filters{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:.5em 0;
display:flex;gap:1.2em;align-items:center;flex-wrap:wrap;z-index:1}
details.rollout{border:1px solid #ddd;border-radius:4px;margin:.4em 0;padding:.2em .6em}
details.rollout>summary{cursor:pointer;padding:.2em 0}
.reward{display:inline-block;min-width:3em;text-align:center;border-radius:3px;font-weight:600}
.r-pass{background:#d6f5d6}.r-partial{background:#fdf1c7}.r-zero{background:#f8d7d7}
.key{font-family:ui-monospace,monospace}.fail{font-size:.85em;color:#555}
.f-infra,.f-verifier,.f-agent_timeout,.f-cancelled{color:#b00}
ol.turns{list-style:none;padding:0;margin:.4em 0}
.msg{border-left:3px solid #ccc;padding:.2em .6em;margin:.35em 0}
.msg .role{font-size:.85em;color:#555;font-weight:600}
.user{border-color:#58a}.assistant{border-color:#5a5}.tool{border-color:#a85}.system{border-color:#999}
.call{background:#f3f7ff;border:1px solid #cdd8f0;border-radius:3px;padding:.2em .5em;margin:.3em 0}
.call-name{font-weight:600;font-family:ui-monospace,monospace}
details.reasoning>summary,details.more>summary{cursor:pointer;color:#555;font-size:.9em}
ul.errors{margin:0;padding-left:1.2em}
[hidden]{display:none!important}
"""

_SCRIPT = """
(function () {
  var reward = document.getElementById("f-reward");
  var failure = document.getElementById("f-failure");
  var task = document.getElementById("f-task");
  var count = document.getElementById("f-count");
  function apply() {
    var r = reward.value, f = failure.value, t = task.value.toLowerCase();
    var shown = 0, total = 0;
    document.querySelectorAll("section.task").forEach(function (section) {
      var any = false;
      var name = section.getAttribute("data-task") || "";
      section.querySelectorAll("details.rollout").forEach(function (d) {
        total += 1;
        var ok = (r === "all" || d.getAttribute("data-reward") === r) &&
          (f === "all" || d.getAttribute("data-failure") === f) &&
          (t === "" || name.indexOf(t) !== -1);
        d.hidden = !ok;
        if (ok) { shown += 1; any = true; }
      });
      section.hidden = !any;
    });
    count.textContent = shown + " of " + total + " rollouts";
  }
  reward.addEventListener("change", apply);
  failure.addEventListener("change", apply);
  task.addEventListener("input", apply);
})();
"""

#: The Content-Security-Policy hash of the one script the page may run.
_SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()

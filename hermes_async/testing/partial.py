"""Partial-rollout acceptance harness: aborts at random token positions, checked exactly.

:func:`run_partial_acceptance` runs Phase 2 rollouts twice against the scripted server, clean
and with random aborts (inside tool-call arguments and on chunk boundaries too) while the
policy version bumps at every abort. It checks issue #20's promises: no lost token, tokens,
masks, logprobs and tool calls equal to the clean run's, the per-turn budget, and version
segments split exactly at version changes.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from hermes_async._paced import start_paced
from hermes_async.agent import AgentOptions, HermesAgentLoop
from hermes_async.agent.result import AgentResult
from hermes_async.inference.generate import SamplingParams, VLLMGenerateClient
from hermes_async.inference.tokenizer import Tokenizer
from hermes_async.inference.trajectory import MASK_ID
from hermes_async.jsontypes import JSONObject
from hermes_async.testing.http import open_asgi_transport
from hermes_async.testing.scripted_server import (
    Fault,
    PolicyRequest,
    ScriptedModelServer,
    ServedRequest,
    _default_tokenizer,
)
from hermes_async.tools.registry import ToolRegistry
from hermes_async.tools.todo import TODO_TOOL

__all__ = (
    "PartialConfig",
    "PartialStatistics",
    "oracle_policy",
    "run_partial_acceptance",
)

_WORDS = (
    "check",
    "the",
    "files",
    "in",
    "directory",
    "first",
    "then",
    "plan",
    "naïve",
    "完成",
    "步骤",
    "✓",
    "🎉",
    "résumé",
    "build",
    "tests",
)


_USER_MARK = "<|im_start|>user\nTask "


def _task_index(request: PolicyRequest) -> int:
    text = request.last_user_text
    return int(text.rsplit(" ", 1)[-1]) if text.startswith("Task ") else 0


def oracle_policy(seed: int, *, turns: int = 3) -> Any:
    """A deterministic policy ``(seed, task, turn) -> text`` with multi-byte ``todo`` calls."""

    def policy(request: PolicyRequest) -> str:
        task = _task_index(request)
        turn = min(sum(1 for m in request.messages if m.get("role") == "assistant"), turns - 1)
        rng = random.Random(f"{seed}:{task}:{turn}")
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 30)))
        if turn >= turns - 1 or rng.random() < 0.15:
            return f"Done: {words}."
        calls = []
        for n in range(rng.randint(1, 2)):
            todos = [
                {
                    "id": str(k),
                    "content": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 8))),
                    "status": rng.choice(["pending", "in_progress", "completed"]),
                }
                for k in range(rng.randint(1, 3))
            ]
            arguments = {"todos": todos, "merge": bool(n)}
            calls.append(
                '<tool_call>\n{"name": "todo", "arguments": '
                + json.dumps(arguments, ensure_ascii=False)
                + "}\n</tool_call>"
            )
        return words + "\n" + "\n".join(calls)

    return policy


@dataclass(frozen=True, slots=True)
class PartialConfig:
    """One acceptance run.

    Attributes:
        rollouts: How many rollouts (each run twice: clean and aborted).
        abort_rate: Probability that a request is aborted.
        max_tokens: Per-turn budget (some turns are longer: their calls are cut off).
        max_chunk_tokens: The server's chunk size bound (1..this).
    """

    rollouts: int = 100
    concurrency: int = 8
    seed: int = 20
    abort_rate: float = 0.6
    max_tokens: int = 160
    max_chunk_tokens: int = 6
    max_resumes: int = 64


@dataclass(slots=True)
class PartialStatistics:
    """What :func:`run_partial_acceptance` measured; :attr:`ok` is the verdict."""

    rollouts: int = 0
    requests: int = 0
    aborts: int = 0
    boundary_aborts: int = 0
    argument_aborts: int = 0
    resumes: int = 0
    version_splits: int = 0
    sent_tokens: int = 0
    kept_tokens: int = 0
    token_mismatches: int = 0
    template_mismatches: int = 0
    template_baseline: int = 0
    call_mismatches: int = 0
    budget_violations: int = 0
    unversioned_segments: int = 0
    split_errors: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def lost_tokens(self) -> int:
        """Tokens the server sent that no kept trajectory holds."""
        return self.sent_tokens - self.kept_tokens

    @property
    def ok(self) -> bool:
        """Every check held."""
        return not (
            self.lost_tokens
            or self.token_mismatches
            or self.template_mismatches
            or self.call_mismatches
            or self.budget_violations
            or self.unversioned_segments
            or self.split_errors
            or self.failures
        )

    def report(self) -> str:
        """A human-readable summary."""
        lines = [
            f"rollouts {self.rollouts}, requests {self.requests}, aborts {self.aborts} "
            f"(on a chunk boundary {self.boundary_aborts}, inside tool-call arguments "
            f"{self.argument_aborts}), resumes {self.resumes}, version splits "
            f"{self.version_splits}",
            f"tokens sent {self.sent_tokens}, kept {self.kept_tokens}, lost {self.lost_tokens}",
            f"token mismatches {self.token_mismatches}, template-check differences "
            f"{self.template_mismatches} (counted mismatches of the unaborted run, e.g. calls "
            f"cut by max_tokens: {self.template_baseline}), tool-call mismatches {self.call_mismatches}, budget "
            f"violations {self.budget_violations}, unversioned segments "
            f"{self.unversioned_segments}, split errors {self.split_errors}, failures "
            f"{dict(self.failures)}",
            f"verdict: {'OK' if self.ok else 'FAILED'}",
        ]
        lines.extend(f"  e.g. {e}" for e in self.examples[:5])
        return "\n".join(lines)


def _calls(result: AgentResult) -> list[Any]:
    """The rollout's tool calls and results, without the random call ids."""
    out: list[Any] = []
    for message in result.messages:
        for call in message.get("tool_calls") or ():
            function = call.get("function", {})
            out.append((function.get("name"), function.get("arguments")))
        if message.get("role") == "tool":
            out.append(("result", message.get("content")))
    return out


def _inside_arguments(text: str) -> bool:
    start = text.rfind("<tool_call>")
    return start > text.rfind("</tool_call>") and '"arguments"' in text[start:]


async def _run_all(
    config: PartialConfig,
    tokenizer: Tokenizer,
    *,
    faults: bool,
) -> tuple[list[AgentResult], ScriptedModelServer]:
    rng = random.Random(config.seed)
    version = {"v": 0}

    def plan(number: int, body: JSONObject) -> Fault | None:
        if not faults or rng.random() >= config.abort_rate:
            return None
        # The trainer's weight update: every later request reads a newer version.
        version["v"] += 1
        return Fault.abort(rng.randint(0, config.max_tokens // 2))

    server = ScriptedModelServer(
        oracle_policy(config.seed),
        tokenizer=tokenizer,
        rng_key="prompt",
        max_chunk_tokens=config.max_chunk_tokens,
        fault_plan=plan,
    )
    registry = ToolRegistry([TODO_TOOL])
    defs = registry.definitions(["todo"])
    options = AgentOptions(
        max_turns=4,
        sampling=SamplingParams(max_tokens=config.max_tokens),
        max_resumes=config.max_resumes,
        version_source=lambda: version["v"],
    )
    results: list[AgentResult | None] = [None] * config.rollouts
    async with (
        open_asgi_transport(server) as transport,
        VLLMGenerateClient("http://scripted.test", transport=transport) as client,
    ):
        loop = HermesAgentLoop(
            client,
            defs.schemas,
            defs.valid_names,
            options=options,
            registry=registry,
            tokenizer=tokenizer,
        )
        limiter = anyio.CapacityLimiter(config.concurrency)

        async def one(index: int) -> None:
            async with limiter:
                messages: list[dict[str, Any]] = [
                    {"role": "system", "content": "You plan with the todo tool."},
                    {"role": "user", "content": f"Task {index}"},
                ]
                results[index] = await loop.run(messages, task_id=f"t{index}", seed=index)

        async with anyio.create_task_group() as tg:
            await start_paced(tg, one, range(config.rollouts))
    done = [r for r in results if r is not None]
    return done, server


def _check_versions(
    result: AgentResult, served: Sequence[ServedRequest], stats: PartialStatistics
) -> None:
    """Segments carry versions and split exactly at requests that started a new version."""
    state = result.managed_state or {}
    segments = [s for s in state.get("segments", ()) if s["kind"] == "completion"]
    starts = {len(r.prompt_ids) for r in served if r.completion_ids}
    previous: tuple[int, int] | None = None
    for segment in segments:
        if segment.get("version") is None:
            stats.unversioned_segments += 1
        if previous is not None and previous[0] == segment["turn"]:
            stats.version_splits += 1
            # A split inside a turn: a request began exactly there, with a newer version.
            if segment["start"] not in starts or not segment["version"] > previous[1]:
                stats.split_errors += 1
        previous = (segment["turn"], segment["version"])


async def run_partial_acceptance(
    config: PartialConfig = PartialConfig(), *, tokenizer: Tokenizer | None = None
) -> PartialStatistics:
    """Run the acceptance and return its statistics.

    ``tokenizer`` defaults to the built-in one, loaded on first use (blocking, ~0.4 s).

    **Cancellation**: the rollouts and the in-process server are cancelled; nothing leaks.
    """
    tok = tokenizer if tokenizer is not None else _default_tokenizer()
    stats = PartialStatistics()
    clean, _ = await _run_all(config, tok, faults=False)
    aborted, server = await _run_all(config, tok, faults=True)
    stats.rollouts = len(aborted)
    stats.requests = len(server.requests)
    by_task: dict[int, list[ServedRequest]] = {}
    for req in server.requests:
        text = tok.decode(req.prompt_ids)
        marker = text.find(_USER_MARK) + len(_USER_MARK)
        index = int(text[marker : text.index("<|im_end|>", marker)])
        by_task.setdefault(index, []).append(req)
        stats.sent_tokens += len(req.completion_ids)
        if req.finish_reason == "abort":
            stats.aborts += 1
            if (req.chunks and req.chunks[-1] == []) or not req.completion_ids:
                stats.boundary_aborts += 1
            done = (req.continued or 0) + len(req.completion_ids)
            if _inside_arguments(tok.decode(tok.encode(req.text, allow_special=True)[:done])):
                stats.argument_aborts += 1
        budget = req.body["sampling_params"]["max_tokens"]
        if budget != config.max_tokens - (req.continued or 0):
            stats.budget_violations += 1
    for index, (want, got) in enumerate(zip(clean, aborted, strict=True)):
        if got.failure is not None:
            stats.failures[got.failure.category] += 1
            stats.examples.append(f"task {index}: {got.failure.message}")
        node_got = (got.managed_state or {}).get("nodes", [{}])[0]
        node_want = (want.managed_state or {}).get("nodes", [{}])[0]
        stats.kept_tokens += sum(1 for m in node_got.get("masked_tokens", ()) if m != MASK_ID)
        stats.resumes += int((got.managed_state or {}).get("resumes", 0))
        if any(
            node_got.get(k) != node_want.get(k) for k in ("tokens", "masked_tokens", "logprobs")
        ):
            stats.token_mismatches += 1
            stats.examples.append(f"task {index}: tokens differ from the unaborted run")
        # The template check must hold across every resume: exactly the unaborted run's
        # verdicts (a call cut off by max_tokens is a counted mismatch in both).
        stats.template_baseline += want.template_mismatches
        if [c.describe() for c in got.template_checks] != [
            c.describe() for c in want.template_checks
        ]:
            stats.template_mismatches += 1
            stats.examples.append(f"task {index}: template checks differ from the unaborted run")
        if _calls(got) != _calls(want):
            stats.call_mismatches += 1
            stats.examples.append(f"task {index}: tool calls differ from the unaborted run")
        for segment_turn, total in _turn_totals(got).items():
            if total > config.max_tokens:
                stats.budget_violations += 1
                stats.examples.append(f"task {index}: turn {segment_turn} sampled {total} tokens")
        _check_versions(got, by_task.get(index, []), stats)
    return stats


def _turn_totals(result: AgentResult) -> dict[int, int]:
    totals: Counter[int] = Counter()
    for segment in (result.managed_state or {}).get("segments", ()):
        if segment["kind"] == "completion":
            totals[int(segment["turn"])] += int(segment["end"]) - int(segment["start"])
    return dict(totals)

"""WebResearchEnv: multi-hop research questions (FRAMES) answered with the web tools.

The reward mixes judged correctness, web-tool use, few tool calls and cited domains
(:meth:`WebResearchEnv.compute_reward`). The judge is a chat model of its own, never the
policy; without one, correctness is the reference's word-overlap heuristic. Usage and the
reference's bugs fixed: docs/environments.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from hermes_async.agent import AgentResult, ToolContext
from hermes_async.envs._atropos import APIServerConfig
from hermes_async.envs._datasets import DatasetOptions, load_rows
from hermes_async.envs._examples import CyclingItems
from hermes_async.envs.base import HermesAgentBaseEnv
from hermes_async.envs.config import HermesAgentEnvConfig
from hermes_async.envs.results import EvalReport
from hermes_async.envs.samples import WEB_RESEARCH_SAMPLE
from hermes_async.errors import ConfigError, HermesAsyncError
from hermes_async.inference import HTTPOptions
from hermes_async.inference.chat import ChatClient

__all__ = (
    "JUDGE_PROMPT",
    "WEB_TOOLS",
    "RewardParts",
    "WebResearchEnv",
    "WebResearchEnvConfig",
    "cited_domains",
    "efficiency_score",
    "eval_metrics",
    "heuristic_score",
    "parse_judge_score",
)

logger = logging.getLogger(__name__)

#: Tool names that count as web use (the reference's set).
WEB_TOOLS = frozenset({"web_search", "web_extract", "search", "firecrawl"})

SYSTEM_PROMPT = (
    "You are a highly capable research agent. When asked a factual question, always use "
    "web_search to find current, accurate information before answering. Cite at least 2 "
    "sources. Be concise and accurate."
)

#: The judge's one user message; the reference's rubric and reply format, in our words.
JUDGE_PROMPT = """\
You judge how well an AI research assistant answered a question.

Question: {question}

Reference answer: {reference}

Model answer: {answer}

Score the model answer from 0.0 to 1.0:
  1.0 = correct and complete
  0.7 = mostly correct, small gaps
  0.4 = partly correct
  0.1 = on topic but wrong or far from complete
  0.0 = wrong, or no answer
Weigh factual accuracy, completeness and relevance.
Reply with only a JSON object: {{"score": <float>, "reason": "<one sentence>"}}"""

_STOPWORDS = frozenset(
    {"the", "a", "an", "is", "are", "was", "were", "of", "in", "on", "at", "to", "for", "with"}
    | {"and", "or", "but", "it", "its", "this", "that", "as", "by", "from", "be", "has", "have"}
    | {"had"}
)


class WebResearchEnvConfig(HermesAgentEnvConfig, DatasetOptions):
    """WebResearchEnv's options: the reference's, the judge's, and the data options."""

    correctness_weight: float = Field(default=0.6, description="Weight of judged correctness.")
    tool_usage_weight: float = Field(default=0.2, description="Weight of using a web tool.")
    efficiency_weight: float = Field(default=0.2, description="Weight of few tool calls.")
    diversity_bonus: float = Field(default=0.1, description="Bonus for citing >= 2 domains.")
    efficient_max_calls: int = Field(
        default=5, ge=0, description="Tool calls allowed before efficiency drops."
    )
    heavy_penalty_calls: int = Field(
        default=10, ge=0, description="Tool calls past which it drops faster."
    )
    eval_split_ratio: float = Field(
        default=0.1, ge=0, le=1, description="Share of the dataset held out for evaluation."
    )
    judge_base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible base URL (.../v1) of the judge model; unset: the "
        "word-overlap heuristic.",
    )
    judge_model_name: str = Field(default="default", description="The judge's model name.")
    judge_api_key_env: str | None = Field(
        default=None, description="Environment variable holding the judge's API key."
    )
    judge_timeout: float = Field(default=60.0, gt=0, description="Deadline of one judgement (s).")


@dataclass(frozen=True, slots=True)
class RewardParts:
    """One rollout's reward and its parts; ``judged`` is False where the heuristic scored."""

    reward: float
    correctness: float
    tool_used: float
    efficiency: float
    diversity: float
    tool_calls: int
    judged: bool


def efficiency_score(calls: int, free: int, heavy: int) -> float:
    """1.0 up to ``free`` calls, then -0.08 per call, -0.12 per call past ``heavy``."""
    if calls <= free:
        return 1.0
    if calls <= heavy:
        return 1.0 - (calls - free) * 0.08
    return max(0.0, 1.0 - (calls - free) * 0.12)


def cited_domains(text: str) -> set[str]:
    """Host names of the http(s) URLs in ``text``, without a leading ``www.``."""
    domains = set()
    for url in re.findall(r"https?://[^\s)>\]\"']+", text):
        host = urllib.parse.urlsplit(url).hostname or ""
        # removeprefix, not the reference's lstrip("www."): web.dev stays web.dev.
        host = host.removeprefix("www.")
        if host:
            domains.add(host)
    return domains


def parse_judge_score(text: str) -> float | None:
    """The judge's ``score`` in [0, 1] from its reply (code fences allowed), else ``None``."""
    clean = re.sub(r"```(?:json)?|```", "", text).strip()
    try:
        data = json.loads(clean)
        score = float(data.get("score", -1)) if isinstance(data, dict) else -1.0
    except (ValueError, TypeError):
        match = re.search(r'"score"\s*:\s*([0-9.]+)', text)
        try:
            score = float(match.group(1)) if match else -1.0
        except ValueError:
            score = -1.0
    return score if 0.0 <= score <= 1.0 else None


def heuristic_score(reference: str, answer: str) -> float:
    """The reference's fallback: 0.4 x Jaccard + 0.6 x recall of the reference's content words."""

    def words(text: str) -> set[str]:
        return {
            w for w in re.findall(r"\b\w+\b", text.lower()) if w not in _STOPWORDS and len(w) > 2
        }

    expected, got = words(reference), words(answer)
    if not expected:
        return 0.5
    overlap = len(expected & got)
    return min(1.0, 0.4 * overlap / len(expected | got) + 0.6 * overlap / len(expected))


def _final_answer_and_tools(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[str]]:
    answer = ""
    tools: list[str] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        if message.get("content"):
            answer = str(message["content"])
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, Mapping) else None
            name = function.get("name") if isinstance(function, Mapping) else None
            if name:
                tools.append(str(name))
    return answer, tools


def _item(row: Mapping[str, Any]) -> dict[str, Any]:
    """A FRAMES row (``Prompt``, ``Answer``, ``reasoning_types``) or one already in item form."""
    if "question" in row:
        return dict(row)
    return {
        "question": str(row["Prompt"]),
        "answer": str(row["Answer"]),
        "difficulty": row.get("reasoning_types") or "unknown",
        "hops": 2,
    }


class WebResearchEnv(CyclingItems, HermesAgentBaseEnv):
    """Web research questions, rewarded by a judge and by how the tools were used.

    ``parts`` holds the :class:`RewardParts` of each rollout by task id (bounded).
    """

    name = "web-research"
    env_config_cls = WebResearchEnvConfig
    default_toolsets = ("web", "file")
    train_buffers = (
        "reward_buffer",
        "correctness_buffer",
        "tool_usage_buffer",
        "efficiency_buffer",
        "diversity_buffer",
    )

    @classmethod
    def config_init(cls) -> tuple[WebResearchEnvConfig, list[APIServerConfig]]:
        """The reference's defaults (OpenRouter policy, groups of 4, 15 turns)."""
        config = WebResearchEnvConfig(
            enabled_toolsets=["web", "file"],
            max_agent_turns=15,
            agent_temperature=1.0,
            system_prompt=SYSTEM_PROMPT,
            group_size=4,
            total_steps=1000,
            steps_per_eval=100,
            use_wandb=True,
            wandb_name="web-research",
            dataset_name="google/frames-benchmark",
            dataset_split="test",
            eval_size=20,
        )
        server = APIServerConfig(
            base_url="https://openrouter.ai/api/v1",
            model_name="anthropic/claude-sonnet-4.5",
            server_type="openai",
            api_key=os.environ.get("OPENROUTER_API_KEY") or "x",
            health_check=False,
        )
        return config, [server]

    @property
    def web_config(self) -> WebResearchEnvConfig:
        config = self.config
        if not isinstance(config, WebResearchEnvConfig):
            raise ConfigError(
                f"WebResearchEnv needs a WebResearchEnvConfig, got {type(config).__name__}"
            )
        return config

    async def setup(self) -> None:
        """Load the questions; hold out ``max(eval_size, ratio x n)`` of them (seeded shuffle).

        **Cancellation**: a load already in its thread finishes there, unused.
        """
        cfg = self.web_config
        loaded = await load_rows(
            path=cfg.dataset_path,
            name=cfg.dataset_name,
            split=cfg.dataset_split,
            sample=WEB_RESEARCH_SAMPLE,
            require=cfg.require_dataset,
            timeout=cfg.dataset_load_timeout,
        )
        items = [_item(row) for row in loaded.rows]
        if not items:
            raise ConfigError(f"no questions in {loaded.source}")
        # Seeded (the reference's shuffle was not): the same split on every run.
        random.Random(cfg.seed if cfg.seed is not None else 0).shuffle(items)
        held = max(cfg.eval_size or 0, int(len(items) * cfg.eval_split_ratio))
        if held >= len(items):  # a small set: the reference's 80/20 split of its samples
            held = len(items) - max(1, len(items) * 8 // 10)
        self.eval_items: list[dict[str, Any]] = items[:held]
        self.train_items = items[held:]
        self.data_source = loaded.source
        self._index = 0
        self.parts: dict[str, RewardParts] = {}
        self._eval_parts: list[RewardParts] | None = None
        self.judge_failures = 0
        for name in self.train_buffers:
            setattr(self, name, [])
        self.last_eval_report: EvalReport | None = None
        if not cfg.judge_base_url:
            logger.warning(
                "web-research: no judge model (--env.judge_base_url): correctness is scored "
                "by word overlap with the reference answer"
            )

    def format_prompt(self, item: dict[str, Any]) -> str:
        """The reference's research instruction around the question."""
        return (
            "Research the following question thoroughly using web search. You MUST search "
            "the web to find current, accurate information; do not rely only on what you "
            "already know.\n\n"
            f"Question: {item['question']}\n\n"
            "Requirements:\n"
            "- Use web_search and/or web_extract to find information\n"
            "- Search at least 2 different sources\n"
            "- Give a concise, accurate answer (2-4 sentences)\n"
            "- Cite the sources you used"
        )

    async def judge(self, question: str, reference: str, answer: str) -> tuple[float, bool]:
        """``(correctness, judged)``: the judge's score, else the heuristic's.

        A failed or unreadable judgement falls back to the heuristic and counts in
        ``judge_failures``.

        **Cancellation**: the judge's request is closed.
        """
        if not answer.strip():
            return 0.0, False
        cfg = self.web_config
        if cfg.judge_base_url:
            key = os.environ.get(cfg.judge_api_key_env) if cfg.judge_api_key_env else None
            prompt = JUDGE_PROMPT.format(question=question, reference=reference, answer=answer)
            options = HTTPOptions(
                connect_timeout=min(10.0, cfg.judge_timeout),
                read_timeout=cfg.judge_timeout,
                request_timeout=cfg.judge_timeout,
                max_connections=4,
            )
            try:
                async with ChatClient(
                    cfg.judge_base_url, model=cfg.judge_model_name, api_key=key, options=options
                ) as client:
                    reply = await client.chat_completion(
                        messages=[{"role": "user", "content": prompt}],
                        max_tokens=150,
                        temperature=0.0,
                    )
                text = (reply.choices[0].message.content or "") if reply.choices else ""
                score = parse_judge_score(text)
                if score is not None:
                    return score, True
                logger.debug("unreadable judge reply %r: heuristic instead", text[:200])
            except HermesAsyncError as exc:
                logger.debug("judge failed (%s): heuristic instead", exc)
            self.judge_failures += 1
        return heuristic_score(reference, answer), False

    async def compute_reward(
        self, item: dict[str, Any], result: AgentResult, ctx: ToolContext
    ) -> float:
        """Correctness 0.6, web-tool use 0.2, efficiency 0.2, two or more cited domains 0.1,
        clamped to [0, 1]. Efficiency counts tool calls, and only when a web tool was used.

        **Cancellation**: the judge's request is closed.
        """
        cfg = self.web_config
        answer, tools = _final_answer_and_tools(result.messages)
        correctness, judged = await self.judge(item["question"], item["answer"], answer)
        tool_used = 1.0 if any(t in WEB_TOOLS for t in tools) else 0.0
        efficiency = efficiency_score(len(tools), cfg.efficient_max_calls, cfg.heavy_penalty_calls)
        diversity = cfg.diversity_bonus if len(cited_domains(answer)) >= 2 else 0.0
        total = (
            cfg.correctness_weight * correctness
            + cfg.tool_usage_weight * tool_used
            # Few calls are only a merit in research that used the web (the reference paid
            # 0.2 to an answer with no tool call at all, a refusal included).
            + cfg.efficiency_weight * efficiency * tool_used
            + diversity
        )
        parts = RewardParts(
            min(1.0, max(0.0, total)),
            correctness,
            tool_used,
            efficiency,
            diversity,
            len(tools),
            judged,
        )
        self.parts[ctx.task_id] = parts
        if len(self.parts) > 10_000:
            del self.parts[next(iter(self.parts))]
        if self.is_evaluating:
            if self._eval_parts is not None:
                self._eval_parts.append(parts)
        else:
            self.reward_buffer.append(parts.reward)
            self.correctness_buffer.append(correctness)
            self.tool_usage_buffer.append(tool_used)
            self.efficiency_buffer.append(efficiency)
            self.diversity_buffer.append(diversity)
        return parts.reward

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """The agent loop on the first ``eval_size`` held-out questions.

        Adds the reference's ``eval/mean_correctness``, ``eval/mean_tool_calls``,
        ``eval/tool_usage_rate`` and ``eval/n_items``.

        **Cancellation**: every eval rollout is cancelled and its sandbox released.
        """
        size = self.config.eval_size
        items = self.eval_items[:size] if size else self.eval_items
        self._eval_parts = []
        try:
            self.last_eval_report = await self.run_agent_eval(items, task_name="web_research_eval")
        finally:
            self._eval_parts = None

    async def evaluate_log(self, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        """atroposlib's, with the research metrics of the evaluation that is logging.

        **Cancellation**: as atroposlib's.
        """
        if self._eval_parts is not None:
            metrics = {**metrics, **eval_metrics(self._eval_parts)}
        await super().evaluate_log(metrics, *args, **kwargs)

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """The reward parts' means since the last log (``train/mean_*``), then the base's.

        **Cancellation**: nothing to clean up.
        """
        metrics = dict(wandb_metrics or {})
        rewards: list[float] = getattr(self, "reward_buffer", [])
        if rewards:
            n = len(rewards)
            metrics["train/mean_reward"] = sum(rewards) / n
            metrics["train/mean_correctness"] = sum(self.correctness_buffer) / n
            metrics["train/mean_tool_usage"] = sum(self.tool_usage_buffer) / n
            metrics["train/mean_efficiency"] = sum(self.efficiency_buffer) / n
            metrics["train/mean_diversity"] = sum(self.diversity_buffer) / n
            metrics["train/total_rollouts"] = n
            metrics["train/correct_rate"] = sum(c >= 0.7 for c in self.correctness_buffer) / n
            metrics["train/tool_usage_rate"] = sum(t > 0 for t in self.tool_usage_buffer) / n
            for name in self.train_buffers:
                getattr(self, name).clear()
        await super().wandb_log(metrics)


def eval_metrics(parts: Sequence[RewardParts]) -> dict[str, float]:
    """The reference's research metrics over an evaluation's rollouts."""
    n = len(parts)
    if not n:
        return {"eval/n_items": 0.0}
    return {
        "eval/mean_correctness": math.fsum(p.correctness for p in parts) / n,
        "eval/mean_tool_calls": sum(p.tool_calls for p in parts) / n,
        "eval/tool_usage_rate": sum(p.tool_calls > 0 for p in parts) / n,
        "eval/n_items": float(n),
    }


if __name__ == "__main__":
    WebResearchEnv.cli()

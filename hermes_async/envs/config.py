"""HermesAgentEnvConfig: the config of a :class:`~hermes_async.envs.base.HermesAgentBaseEnv`.

The reference's fields with its names and defaults, plus this implementation's knobs. The
``build_*`` methods map the fields onto the rollout core's own option types, so the
environment holds no policy of its own. How it differs from the reference: docs/migration.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from hermes_async._checks import check_names
from hermes_async.agent import AgentOptions, BudgetConfig, FailurePolicy, Staleness, VersionSource
from hermes_async.envs._atropos import BaseEnvConfig
from hermes_async.errors import ConfigError
from hermes_async.inference.generate import SamplingParams
from hermes_async.inference.tokenizer import QWEN_OFFLINE_NAME, Tokenizer, load_tokenizer
from hermes_async.limits import Limits
from hermes_async.tools.sandbox.backends import check_backend_name
from hermes_async.tools.sandbox.warm_pool import WarmPoolOptions

__all__ = ("HermesAgentEnvConfig", "builtin_tokenizer", "loop_tokenizer", "resolve_tokenizer")


class HermesAgentEnvConfig(BaseEnvConfig):  # type: ignore[misc]
    """Config of a :class:`HermesAgentBaseEnv`: the reference's fields and defaults, plus new ones.

    Beyond docs/migration.md: ``tokenizer_name`` defaults to ``"qwen-offline"``, the built-in
    offline Qwen tokenizer written out as an HF directory (any HF name or directory works).
    ``terminal_lifetime`` is the idle time after which a sandbox is reaped. ``terminal_backend``
    is checked against the backends registered when the config is built, so an unknown name
    fails at start-up. A keyword that is not a field is a ``ConfigError`` naming the closest
    field (pydantic would drop it).
    """

    def __init__(self, **data: Any) -> None:
        check_names(data, type(self).model_fields, kind=f"{type(self).__name__} field")
        super().__init__(**data)

    enabled_toolsets: list[str] | None = Field(
        default=None, description="Toolsets offered to the model (None: all)."
    )
    disabled_toolsets: list[str] | None = Field(
        default=None, description="Toolsets removed after enabled/distribution."
    )
    distribution: str | None = Field(
        default=None,
        description="Toolset distribution sampled once per group (wins over enabled_toolsets).",
    )
    max_agent_turns: int = Field(default=30, ge=1, description="Maximum model calls per rollout.")
    system_prompt: str | None = Field(default=None, description="System message, if any.")
    agent_temperature: float = Field(
        default=1.0, ge=0, allow_inf_nan=False, description="Sampling temperature."
    )
    terminal_backend: str = Field(
        default="local",
        description="A registered sandbox backend: local, docker, modal, ssh, singularity, e2b, "
        "daytona, or one added with register_backend.",
    )
    terminal_timeout: int = Field(default=120, gt=0, description="Default command timeout (s).")
    terminal_lifetime: int = Field(default=3600, gt=0, description="Idle sandbox lifetime (s).")
    dataset_name: str | None = Field(default=None, description="HF dataset name.")
    dataset_split: str = Field(default="train", description="HF dataset split.")
    prompt_field: str = Field(default="prompt", description="Item field holding the prompt.")
    tool_pool_size: int = Field(
        default=128,
        ge=1,
        description="Deprecated: concurrent tool calls across rollouts (the tool_calls limiter).",
    )
    tool_call_parser: str = Field(default="hermes", description="Phase 2 tool-call parser.")
    default_result_size_chars: int = Field(
        default=100_000, ge=0, description="Tool results longer than this are saved to the sandbox."
    )
    turn_budget_chars: int = Field(default=200_000, ge=0, description="Tool output per turn.")
    preview_size_chars: int = Field(default=1_500, ge=0, description="Preview of a saved result.")
    tool_result_overrides: dict[str, int] | None = Field(
        default=None, description="Per-tool result-size thresholds."
    )
    extra_body: dict[str, Any] | None = Field(
        default=None, description="Extra fields for chat requests (Phase 1)."
    )
    tokenizer_name: str = Field(
        default=QWEN_OFFLINE_NAME,
        description="HF tokenizer name or directory; 'qwen-offline' is the built-in one.",
    )
    # ---- new in hermes_async
    token_endpoint: str = Field(
        default="auto",
        description="Phase 2 protocol: auto (vLLM: the generate route if the server has it, "
        "else the stock /v1/completions; probed once), vllm (/inference/v1/generate), "
        "completions (/v1/completions of a stock vLLM), atropos (/generate of atroposlib's "
        "vllm_api_server) or sglang.",
    )
    early_dispatch: bool = Field(
        default=True, description="Start each tool call as soon as it is parsed (Phase 2)."
    )
    parallel_tool_calls: bool = Field(
        default=False, description="Run one turn's tool calls concurrently."
    )
    tool_timeout: float | None = Field(
        default=300.0, gt=0, description="Per-tool-call deadline (s)."
    )
    turn_timeout: float | None = Field(
        default=None, gt=0, description="Per-generation deadline (s)."
    )
    rollout_timeout: float | None = Field(
        default=None, gt=0, description="Per-rollout deadline (s)."
    )
    seed: int | None = Field(
        default=None, description="Seeds toolset sampling and per-rollout sampling seeds."
    )
    eval_concurrency: int = Field(default=8, ge=1, description="Eval rollouts running at once.")
    eval_temperature: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, description="Temperature for evaluation."
    )
    server_connect_timeout: float = Field(
        default=10.0, gt=0, description="Seconds to wait for the model server to answer at all."
    )
    model_request_limit: int = Field(
        default=64,
        ge=1,
        description="Concurrent model requests (per server when several share a pool).",
    )
    server_pool: bool = Field(
        default=True,
        description="Several servers of one kind share one session-affine, load-aware pool "
        "(hermes_async.inference.ServerPool); False: servers take turns group by group.",
    )
    sandbox_create_limit: int = Field(default=16, ge=1, description="Concurrent sandbox creations.")
    sandbox_exec_limit: int = Field(default=128, ge=1, description="Concurrent sandbox commands.")
    sandbox_release_timeout: float = Field(
        default=30.0, gt=0, description="Deadline for releasing one sandbox (s)."
    )
    sandbox_options: dict[str, Any] | None = Field(
        default=None, description="Options of the terminal_backend (e.g. docker image)."
    )
    sandbox_pool_size: int = Field(
        default=0,
        ge=0,
        description="Ready sandboxes kept warm per sandbox spec (0: none; each rollout's "
        "sandbox is created when it asks). See hermes_async.tools.sandbox.warm_pool.",
    )
    group_snapshot: bool = Field(
        default=True,
        description="With a setup_sandbox override: run it once per group and start the "
        "group's sandboxes from a snapshot where the backend has one (Docker commit).",
    )
    sandbox_pool_max_age: float = Field(
        default=600.0,
        gt=0,
        description="Seconds a warm sandbox may wait before it is replaced; keep it below the "
        "provider's idle expiry (Modal's idle_timeout).",
    )

    @field_validator("terminal_backend")
    @classmethod
    def _registered_backend(cls, value: str) -> str:
        return check_backend_name(value)

    @field_validator("group_size")
    @classmethod
    def _positive_group_size(cls, value: int) -> int:  # atroposlib's field has no bound
        if value < 1:
            raise ValueError("must be >= 1")
        return value

    # ---- drop-in completeness (issue #14): reference spellings and settings
    eval_size: int | None = Field(
        default=None,
        ge=0,
        description="Eval items run_agent_eval runs: the first eval_size of the items it is "
        "given (None or 0: all; the guide's self.config.eval_size).",
    )
    preserve_think_blocks: bool | None = Field(
        default=None,
        description="Keep <think> blocks in assistant content instead of reasoning_content "
        "(None: thinking_mode, the reference's rule).",
    )
    skills_dir: str | None = Field(
        default=None,
        description="Directory of SKILL.md skills for the skills toolset "
        "(None: ~/.hermes/skills, else the built-in examples).",
    )
    tune_gc: bool = Field(
        default=True,
        description="Apply hermes_async.gc_tuning.tune_gc_for_rollouts() for the run of "
        "serve/process/evaluate (fewer, shorter garbage-collector pauses with many rollouts).",
    )
    # ---- Phase 2 fidelity (issue 22). Decision: Phase 2 request extras get their own field;
    # extra_body stays the chat requests' (Phase 1), so a chat-only extra never hits a token
    # server's key check. Keys are checked against the server kind when the loop is built.
    sampling_extra: dict[str, Any] | None = Field(
        default=None,
        description="Phase 2 request extras (SamplingParams.extra), e.g. "
        '{"structured_outputs": {"regex": "..."}, "min_p": 0.05}; keys the token server does '
        "not accept are an error.",
    )
    end_of_turn_tokens: list[str] | None = Field(
        default=None,
        description="Phase 2: the tokens that end a model turn (default: the tokenizer's, "
        "from its chat template / config).",
    )

    def build_budget_config(self) -> BudgetConfig:
        """The tool-result budget from the ``*_chars`` fields (reference v2)."""
        return BudgetConfig(
            default_result_size=self.default_result_size_chars,
            turn_budget=self.turn_budget_chars,
            preview_size=self.preview_size_chars,
            tool_overrides=dict(self.tool_result_overrides or {}),
        )

    def build_limits(self) -> Limits:
        """The shared limiters from the ``*_limit`` fields (``tool_pool_size``: tool calls)."""
        return Limits(
            model_requests=self.model_request_limit,
            sandbox_create=self.sandbox_create_limit,
            sandbox_exec=self.sandbox_exec_limit,
            tool_calls=self.tool_pool_size,
        )

    def build_warm_pool(self) -> WarmPoolOptions | None:
        """The warm pool of the run's sandbox manager (``None`` when ``sandbox_pool_size=0``)."""
        if self.sandbox_pool_size == 0:
            return None
        return WarmPoolOptions(size=self.sandbox_pool_size, max_age=self.sandbox_pool_max_age)

    def build_agent_options(
        self,
        *,
        temperature: float | None = None,
        token_server: bool = False,
        seed: int | None = None,
    ) -> AgentOptions:
        """The rollout core's :class:`~hermes_async.agent.AgentOptions` from these fields.

        Args:
            temperature: Overrides ``agent_temperature``.
            token_server: Phase 2: add sampling parameters (``max_token_length``, ``seed``).
            seed: The sampling seed (Phase 2).
        """
        sampling = (
            SamplingParams(
                max_tokens=self.max_token_length, seed=seed, extra=dict(self.sampling_extra or {})
            )
            if token_server
            else None
        )
        return AgentOptions(
            max_turns=self.max_agent_turns,
            temperature=self.agent_temperature if temperature is None else temperature,
            max_tokens=self.max_token_length,
            extra_body=None if token_server else self.extra_body,
            budget=self.build_budget_config(),
            tool_timeout=self.tool_timeout,
            turn_timeout=self.turn_timeout,
            rollout_timeout=self.rollout_timeout,
            parallel_tool_calls=self.parallel_tool_calls,
            tool_call_parser=self.tool_call_parser,
            early_dispatch=self.early_dispatch,
            sampling=sampling,
            split_reasoning=not self.keeps_think_blocks,
            terminal_timeout=float(self.terminal_timeout),
            skills_dir=self.skills_dir,
            thinking_mode=bool(self.thinking_mode),
            reasoning_effort=self.reasoning_effort,
            max_reasoning_tokens=self.max_reasoning_tokens,
            max_resumes=self.max_resumes,
            end_of_turn=tuple(self.end_of_turn_tokens) if self.end_of_turn_tokens else None,
        )

    @property
    def keeps_think_blocks(self) -> bool:
        """``preserve_think_blocks``, else ``thinking_mode`` (the reference's rule)."""
        if self.preserve_think_blocks is not None:
            return self.preserve_think_blocks
        return bool(self.thinking_mode)

    # ---- issue #20: asynchronous RL (resumed aborts, staleness)
    max_resumes: int = Field(
        default=8,
        description="Phase 2: resumes of a generation the server aborted (finish_reason "
        "'abort', e.g. a trainer's weight update); the exact prefix is kept and the resume "
        "asks for the remaining tokens only. 0: an abort fails the rollout.",
    )
    max_staleness: int | None = Field(
        default=None,
        description="Largest age (current policy version - the version that sampled a "
        "segment) trained on; needs the environment's policy_version_source. None: off.",
    )
    staleness_policy: Literal["drop", "mask", "keep"] = Field(
        default="drop",
        description="Groups with segments older than max_staleness: drop the group, mask the "
        "stale segments, or keep them (count only).",
    )

    def build_staleness(self, source: VersionSource | None) -> Staleness | None:
        """The :class:`~hermes_async.agent.Staleness` of ``max_staleness`` (``None``: off).

        Raises:
            ConfigError: ``max_staleness`` is set but there is no version source.
        """
        if self.max_staleness is None:
            return None
        if source is None:
            raise ConfigError(
                f"max_staleness={self.max_staleness} needs the trainer's policy version: set "
                "env.policy_version_source = <() -> int> before the run"
            )
        return Staleness(self.max_staleness, self.staleness_policy, version_source=source)

    # ---- issue #34: what `hermes-async eval` / `process` set (the run folder)
    eval_group_size: int = Field(
        default=1,
        ge=1,
        description="Rollouts per eval item in run_agent_eval (each its own samples.jsonl "
        "line; the pass rate counts them all).",
    )
    data_path_to_save_samples: str | None = Field(
        default=None,
        description="process: one JSON line per finished rollout (conversation, reward, "
        "failure, tokens, timing), as evaluate's samples.jsonl; what `hermes-async view` shows. "
        "Resumed with resume (the lines of finished groups are kept).",
    )

    # ---- issue #16: failure containment, resumable runs, the watchdog. Keep this block last
    # in the class (other issues add their fields above it), so merges stay line-local.
    failure_policy: Literal["retry", "mask", "zero"] = Field(
        default="retry",
        description="What a group does with infra/verifier failures: retry them on a fresh "
        "sandbox (then mask the group if they still fail), mask the group, or keep them at "
        "reward 0 (see hermes_async.agent.rollout).",
    )
    failure_max_attempts: int = Field(
        default=3, description="Attempts per rollout with failure_policy=retry (first included)."
    )
    failure_retry_backoff: float = Field(
        default=1.0, description="Seconds before the first retry; doubled per retry, jittered."
    )
    timeout_policy: Literal["zero", "mask"] = Field(
        default="zero",
        description="agent_timeout rollouts: keep them with reward 0, or mask their group.",
    )
    resume: bool = Field(
        default=False,
        description="process/evaluate: keep the finished results already in "
        "data_path_to_save_groups / data_dir_to_save_evals/samples.jsonl and run only the "
        "missing or errored items (see hermes_async.envs._resume).",
    )
    watchdog_seconds: float | None = Field(
        default=300.0,
        description="serve/process/evaluate: log what the run waits on when nothing finished "
        "for this long (None: off).",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="serve/process/evaluate: serve Prometheus metrics (limiters, servers, "
        "rollouts in flight) at http://127.0.0.1:PORT/metrics for the run; `hermes-async "
        "status` reads them (None: off; 0: any free port, logged at INFO).",
    )

    def build_failure_policy(self) -> FailurePolicy:
        return FailurePolicy(
            on_failure=self.failure_policy,
            on_timeout=self.timeout_policy,
            max_attempts=self.failure_max_attempts,
            backoff_seconds=self.failure_retry_backoff,
        )


def resolve_tokenizer(name: str) -> tuple[str, bool]:
    """``(directory or name for AutoTokenizer, is_builtin)`` for a ``tokenizer_name``."""
    if name == QWEN_OFFLINE_NAME:
        from hermes_async.inference.hf import qwen_offline_hf_dir

        return str(qwen_offline_hf_dir()), True
    path = Path(name).expanduser()
    builtin = path.is_dir() and (path / "hermes_async_tokenizer.json").is_file()
    return name, builtin


_BUILTIN_TOKENIZER: Tokenizer | None = None


def builtin_tokenizer() -> Tokenizer:
    """The built-in offline tokenizer, loaded once per process (blocking: call at setup)."""
    global _BUILTIN_TOKENIZER
    if _BUILTIN_TOKENIZER is None:
        _BUILTIN_TOKENIZER = load_tokenizer(None)
    return _BUILTIN_TOKENIZER


def loop_tokenizer(name: str, *, builtin: bool) -> Tokenizer:
    """The tokenizer the Phase 2 loop uses for ``tokenizer_name`` (blocking: call at setup)."""
    return builtin_tokenizer() if builtin else load_tokenizer(name)

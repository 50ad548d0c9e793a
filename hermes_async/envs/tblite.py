"""TBLiteEvalEnv: OpenThoughts-TBLite, 100 calibrated terminal tasks, on the Terminal-Bench path.

A thin :class:`~hermes_async.envs.terminalbench.env.TerminalBench2EvalEnv` over the hub's
``NousResearch/openthoughts-tblite`` rows (else ``--env.dataset_path``, else a built-in
sample of three tasks), with the reference's defaults (``task_timeout`` 1200 s).
Differences from the reference: docs/environments.md.

    python -m hermes_async.envs.tblite evaluate --env.task_filter count-error-lines \\
        --openai.base_url http://localhost:8000/v1 --openai.model_name YourModel
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import anyio
from pydantic import Field

from hermes_async.envs._atropos import APIServerConfig, EvalHandlingEnum
from hermes_async.envs._datasets import DatasetOptions, dataset_loads, load_rows
from hermes_async.envs.samples import TBLITE_SAMPLE
from hermes_async.envs.terminalbench.env import (
    TerminalBench2EvalEnv,
    TerminalBench2EvalEnvConfig,
)
from hermes_async.envs.terminalbench.rows import default_cache_dir
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.errors import ConfigError
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = ("TBLiteEnv", "TBLiteEvalConfig", "TBLiteEvalEnv")


class TBLiteEvalConfig(TerminalBench2EvalEnvConfig, DatasetOptions):
    """TBLiteEvalEnv's options: Terminal-Bench's, the data options, and the reference's."""

    task_timeout: int | None = Field(
        default=1200,
        gt=0,
        description="Each task's agent deadline in seconds (None: the task's own).",
    )
    test_timeout: int | None = Field(
        default=None,
        gt=0,
        description="Every verifier's deadline in seconds (None: the task's own).",
    )
    force_build: bool = Field(
        default=False, description="Build each image from environment_tar, never docker_image."
    )


class TBLiteEvalEnv(TerminalBench2EvalEnv):
    """OpenThoughts-TBLite on the Terminal-Bench path.

    Attributes:
        data_source: Where the tasks came from (a file, the hub, the built-in sample).
    """

    name = "openthoughts-tblite"
    env_config_cls = TBLiteEvalConfig

    @classmethod
    def config_init(cls) -> tuple[TBLiteEvalConfig, list[APIServerConfig]]:
        """The reference's defaults (60 turns, temperature 0.6, 16k tokens a turn), on Docker."""
        config = TBLiteEvalConfig(
            enabled_toolsets=["terminal", "file"],
            max_agent_turns=60,
            max_token_length=16000,
            agent_temperature=0.6,
            eval_temperature=0.6,
            terminal_backend="docker",
            terminal_timeout=300,
            tool_pool_size=128,
            max_concurrent_tasks=8,
            dataset_name="NousResearch/openthoughts-tblite",
            dataset_split="train",
            eval_handling=EvalHandlingEnum.STOP_TRAIN,
            group_size=1,
            steps_per_eval=1,
            total_steps=1,
            use_wandb=True,
            wandb_name="openthoughts-tblite",
            ensure_scores_are_not_same=False,
            tool_call_parser="hermes",
        )
        server = APIServerConfig(
            base_url="https://openrouter.ai/api/v1",
            model_name="anthropic/claude-sonnet-4",
            server_type="openai",
            api_key=os.environ.get("OPENROUTER_API_KEY") or "x",
            health_check=False,
        )
        return config, [server]

    @property
    def tblite_config(self) -> TBLiteEvalConfig:
        config = self.config
        if not isinstance(config, TBLiteEvalConfig):
            raise ConfigError(
                f"TBLiteEvalEnv needs a TBLiteEvalConfig, got {type(config).__name__}"
            )
        return config

    async def setup(self) -> None:
        """Find the rows, then Terminal-Bench's setup: load them as task folders and select.

        **Cancellation**: a load already in its thread finishes there, unused.
        """
        cfg = self.tblite_config
        if cfg.dataset_path and not cfg.dataset:
            cfg.dataset = cfg.dataset_path
        if cfg.dataset:
            self.data_source = f"file {cfg.dataset}"
        else:
            loaded = await load_rows(
                path=None,
                name=cfg.dataset_name,
                split=cfg.dataset_split,
                sample=TBLITE_SAMPLE,
                require=cfg.require_dataset,
                timeout=cfg.dataset_load_timeout,
            )
            self.data_source = loaded.source
            if loaded.source.startswith("built-in sample"):
                cfg.dataset = str(TBLITE_SAMPLE)
            else:
                write = functools.partial(_write_rows, loaded.rows, cfg.rows_cache_dir)
                cfg.dataset = str(await anyio.to_thread.run_sync(write, limiter=dataset_loads()))
        await super().setup()

    def load_tasks(self) -> list[HarborTask]:
        """Terminal-Bench's tasks, with ``task_timeout`` / ``test_timeout`` when set."""
        cfg = self.tblite_config
        tasks = super().load_tasks()
        if cfg.task_timeout is not None:
            agent = float(cfg.task_timeout)
            tasks = [dataclasses.replace(t, agent_timeout_sec=agent) for t in tasks]
        if cfg.test_timeout is not None:
            verifier = float(cfg.test_timeout)
            tasks = [dataclasses.replace(t, verifier_timeout_sec=verifier) for t in tasks]
        return tasks

    def sandbox_spec(self, item: Any) -> SandboxSpec | None:
        """Terminal-Bench's; with ``force_build`` the image is always built."""
        spec = super().sandbox_spec(item)
        if spec is not None and self.tblite_config.force_build and spec.build_context:
            spec = dataclasses.replace(spec, image=None)
        return spec


def _write_rows(rows: list[dict[str, Any]], cache_dir: str | None) -> Path:
    """The hub's rows as a JSONL file in the cache, named after their content (blocking)."""
    text = "".join(json.dumps(row, sort_keys=True, default=str) + "\n" for row in rows)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir else default_cache_dir() / "tblite"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"openthoughts-tblite-{digest}.jsonl"
    if not path.is_file():
        partial = path.with_suffix(".partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    return path


#: The name the seeds use.
TBLiteEnv = TBLiteEvalEnv


if __name__ == "__main__":
    TBLiteEvalEnv.cli()

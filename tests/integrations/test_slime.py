"""The slime generate function against the Sample contract docs/trainers/slime.md records.

slime has no package on PyPI: ``Sample`` below is written from that record (slime/utils/types.py:
``tokens``, ``response``, ``response_length``, ``loss_mask``, ``rollout_log_probs``, ``reward``,
``status`` with the nested ``Status`` enum, ``weight_versions``, ``metadata``), not copied.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hermes_async.integrations.slime import make_generate
from hermes_async.testing import Fault
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import RecordingFactory

from .helpers import assert_flat_matches_wire, make_tasks, raising_reward, scripted, vllm_client

pytestmark = pytest.mark.anyio


@dataclass
class Sample:
    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    prompt: Any = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    reward: Any = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)


ARGS = SimpleNamespace(rollout_max_response_len=4096)
SGLANG = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 256, "skip_special_tokens": False}


async def generate(tmp_path: Path, sampling: dict[str, Any], **kw: Any) -> tuple[Sample, list]:
    factory = RecordingFactory(tmp_path / "sb")
    task_kw = {name: kw.pop(name) for name in ("reward", "tokenizer") if name in kw}
    async with (
        scripted(**kw) as (server, url, transport),
        SandboxManager(factory) as manager,
        vllm_client(transport, url) as client,
    ):
        tasks = make_tasks(manager, **task_kw)
        sample = await make_generate(tasks, server=client)(ARGS, Sample(prompt="x"), sampling)
        assert manager.task_ids() == []
    assert factory.leftovers() == []
    return sample, server.requests


async def test_a_multi_turn_sample_holds_the_wire_ids(tmp_path: Path) -> None:
    sample, served = await generate(tmp_path, SGLANG)
    assert sample.status is Sample.Status.COMPLETED and sample.reward == 1.0
    prompt = sample.tokens[: len(sample.tokens) - sample.response_length]
    response = sample.tokens[len(prompt) :]
    assert prompt == served[0].prompt_ids
    assert sample.loss_mask is not None and sample.rollout_log_probs is not None
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
    assert (
        assert_flat_matches_wire(
            prompt, response, sample.loss_mask, sample.rollout_log_probs, served
        )
        == 3
    )
    assert "42" in sample.response


async def test_failures_are_the_samples_own_statuses(tmp_path: Path) -> None:
    cut, _ = await generate(
        tmp_path, {**SGLANG, "max_new_tokens": 4}, policy=lambda r: "word " * 40
    )
    assert cut.status is Sample.Status.TRUNCATED
    died = {n: Fault.disconnect(after_tokens=3) for n in range(2, 8)}
    dead, _ = await generate(tmp_path, SGLANG, faults=died)
    assert dead.status is Sample.Status.FAILED and dead.reward == 0.0
    assert dead.metadata["hermes_async_failure"]["category"] == "infra"
    broken, _ = await generate(tmp_path, SGLANG, reward=raising_reward)
    assert broken.status is Sample.Status.FAILED and not any(broken.loss_mask or [])
    refused, served = await generate(tmp_path, {**SGLANG, "n": 4})
    assert refused.status is Sample.Status.FAILED and served == []
    assert "n=4" in refused.metadata["hermes_async_failure"]["message"]
    untokenized, served = await generate(tmp_path, SGLANG, tokenizer=None)
    assert untokenized.status is Sample.Status.FAILED and served == []
    assert "no tokenizer" in untokenized.metadata["hermes_async_failure"]["message"]

"""The slime generate function against the Sample contract docs/trainers/slime.md records.

slime has no package on PyPI: ``Sample`` below is written from that record (slime/utils/types.py:
``tokens``, ``response``, ``response_length``, ``loss_mask``, ``rollout_log_probs``, ``reward``,
``status`` with the nested ``Status`` enum, ``weight_versions``, ``metadata``), not copied.
"""

from __future__ import annotations

import dataclasses
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


async def test_an_abort_is_resumed_across_versions_and_one_that_persists_is_aborted(
    tmp_path: Path,
) -> None:
    """A weight update aborts the first request: the turn resumes under the new version and
    the sample carries both (slime's ``weight_versions``); a server that aborts every request
    past ``max_resumes`` is slime's ``ABORTED``."""
    factory = RecordingFactory(tmp_path / "sb")
    once = {1: Fault.abort(after_tokens=3)}
    always = {n: Fault.abort(after_tokens=2) for n in range(1, 40)}
    samples = []
    async with SandboxManager(factory) as manager:
        for faults in (once, always):
            async with (
                scripted(faults=faults) as (server, url, transport),
                vllm_client(transport, url) as client,
            ):
                tasks = make_tasks(manager)

                def versioned(item: Any, server: Any = server, tasks: Any = tasks) -> Any:
                    task = tasks(item)
                    version = lambda: 7 if not server.requests else 8  # noqa: E731
                    options = dataclasses.replace(
                        task.options, version_source=version, max_resumes=2
                    )
                    return dataclasses.replace(task, options=options)

                sample = await make_generate(versioned, server=client)(ARGS, Sample(), SGLANG)
                samples.append((sample, list(server.requests)))
        assert manager.task_ids() == []
    assert factory.leftovers() == []
    (resumed, served), (aborted, aborted_served) = samples
    assert resumed.status is Sample.Status.COMPLETED and resumed.reward == 1.0
    assert resumed.weight_versions == ["7", "8"]
    assert len(served) == 4  # the aborted request, its resume, two more turns
    assert served[1].prompt_ids == served[0].prompt_ids + served[0].completion_ids
    assert resumed.loss_mask is not None and sum(resumed.loss_mask) == sum(
        len(r.completion_ids) for r in served
    )
    assert aborted.status is Sample.Status.ABORTED
    # Each attempt is 1 + max_resumes requests (the failure policy retries the rollout).
    assert len(aborted_served) % 3 == 0
    assert aborted.metadata["hermes_async_failure"]["detail"]["aborted"] is True
    # The aborted attempt is not resumable here: the sample holds its prompt only, nothing
    # to train on (slime puts an ABORTED sample back in its buffer for a later call).
    assert aborted.tokens == aborted_served[0].prompt_ids and aborted.response_length == 0
    assert aborted.loss_mask == [] and aborted.reward == 0.0


async def test_a_lone_stop_token_id_is_a_failed_sample_naming_it(tmp_path: Path) -> None:
    refused, served = await generate(tmp_path, {**SGLANG, "stop_token_ids": 151645})
    assert refused.status is Sample.Status.FAILED and served == []
    assert (
        "stop_token_ids must be a tuple of ints"
        in refused.metadata["hermes_async_failure"]["message"]
    )

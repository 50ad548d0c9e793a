"""The TRL rollout function inside TRL's own GRPOTrainer (trl 1.16.0, CPU torch).

A tiny random Llama over the offline Qwen tokenizer is the policy TRL computes its logprobs
with; generation is ours, over the scripted vLLM server on loopback. TRL's RepeatSampler hands
``rollout_func`` its prompt slice already repeated ``num_generations`` times (its docstring says
"no duplication"; its code does not): one row per prompt entry is what it trains on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio.from_thread
import pytest

from hermes_async.agent import AgentOptions, RolloutSetup, RolloutTask
from hermes_async.errors import ConfigError
from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.inference.hf import qwen_offline_hf_dir
from hermes_async.testing import Fault, ScriptedModelServer, open_loopback_server
from tests.support import RecordingFactory

from ..integrations.helpers import (
    TASK,
    TOKENIZER,
    TOOLS,
    assert_flat_matches_wire,
    check_answer,
    raising_reward,
    two_calls,
)
from .conftest import require

# TRL and transformers warn about their own settings and experimental features (not ours).
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@contextmanager
def scripted_server(**kw: Any) -> Iterator[tuple[ScriptedModelServer, str]]:
    """The scripted vLLM server on loopback, in an event loop of its own (TRL is sync)."""
    server = ScriptedModelServer(two_calls, tokenizer=TOKENIZER, **kw)
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(open_loopback_server(server)) as url,
    ):
        yield server, url


def tasks(reward: Any = check_answer, tokenizer: Any = TOKENIZER) -> Any:
    def task(prompt: Any) -> RolloutTask:
        return RolloutTask(
            [{"role": "user", "content": TASK}],
            TOOLS,
            RolloutSetup(reward=reward, tokenizer=tokenizer),
            AgentOptions(max_turns=6),
        )

    return task


def rollout_func(factory: RecordingFactory, **kw: Any) -> Any:
    from hermes_async.integrations.trl import RolloutFunc

    return RolloutFunc(
        kw.pop("tasks", None) or tasks(),
        client=lambda url: VLLMGenerateClient(url, vocab_size=len(TOKENIZER)),
        sandbox_factory=factory,
        **kw,
    )


def make_trainer(tmp_path: Path, func: Any, **config: Any) -> Any:
    trl = require("trl")
    transformers = require("transformers")
    torch = require("torch")
    datasets = require("datasets")
    from hermes_async.integrations.trl import hermes_reward

    tokenizer = transformers.AutoTokenizer.from_pretrained(
        qwen_offline_hf_dir(str(tmp_path / "tok"))
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=4096,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    prompts = [[{"role": "user", "content": TASK}], [{"role": "user", "content": "Again: " + TASK}]]
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=1024,
        max_steps=1,
        use_vllm=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        **config,
    )
    return trl.GRPOTrainer(
        model=model,
        reward_funcs=[hermes_reward],
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        rollout_func=func,
    )


class Recording:
    """The rollout function, keeping each call's prompts and result."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[list[Any], dict[str, Any]]] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = self.inner(prompts, trainer)
        self.calls.append((list(prompts), out))
        return out


def test_grpo_trainer_scores_and_computes_its_loss_on_the_wire_ids(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sb")
    with scripted_server() as (server, url):
        recording = Recording(rollout_func(factory, base_url=url))
        trainer = make_trainer(tmp_path, recording)
        inputs = [{"prompt": p} for p in trainer.train_dataset["prompt"] for _ in range(2)]
        scored = trainer._generate_and_score_completions(inputs)  # what a step trains on
    # TRL's loss over our rows, forward only (eval mode: outside train() TRL has no
    # accumulation window; a backward through the 151k-id vocabulary takes minutes on a shared
    # 2-core CPU and adds nothing about the rows).
    trainer.model.eval()
    with require("torch").no_grad():
        loss = trainer.compute_loss(trainer.model, scored)
    assert factory.leftovers() == [] and len(factory.created) == 4
    ((prompts, out),) = recording.calls
    assert prompts == [x["prompt"] for x in inputs]  # repeated, as the sampler repeats them
    assert out["hermes_status"] == ["completed"] * 4 and out["hermes_reward"] == [1.0] * 4
    for i in range(4):
        runs = assert_flat_matches_wire(
            out["prompt_ids"][i],
            out["completion_ids"][i],
            out["env_mask"][i],
            out["logprobs"][i],
            server.requests,
        )
        assert runs == 3  # three model turns, two tool calls between them
    # TRL's tensors hold our rows: the ids right-padded, env_mask as its tool_mask.
    for i in range(4):
        n = len(out["completion_ids"][i])
        assert scored["completion_ids"][i][:n].tolist() == out["completion_ids"][i]
        assert scored["tool_mask"][i][:n].tolist() == out["env_mask"][i]
        assert scored["completion_mask"][i][:n].tolist() == [1] * n
    assert scored["advantages"].tolist() == [0.0] * 4  # equal rewards in each group
    assert bool(loss.isfinite())
    assert trainer._metrics["train"]["reward"] == [1.0]  # hermes_reward, as TRL logged it


def test_failures_are_masked_rows_and_unhonourable_settings_are_refused(tmp_path: Path) -> None:
    from hermes_async.integrations.trl import RolloutFunc

    factory = RecordingFactory(tmp_path / "sb")
    died = {n: Fault.disconnect(after_tokens=3) for n in range(2, 12)}
    with scripted_server(faults=died) as (_, url):
        trainer = make_trainer(tmp_path, rollout_func(factory, base_url=url))
        dead = trainer.rollout_func([[{"role": "user", "content": TASK}]] * 2, trainer)
    with scripted_server() as (_, url):
        broken = rollout_func(factory, base_url=url, tasks=tasks(reward=raising_reward))(
            [[{"role": "user", "content": TASK}]], trainer
        )
        no_tokenizer = rollout_func(factory, base_url=url, tasks=tasks(tokenizer=None))
        with pytest.raises(ConfigError, match="no tokenizer"):
            no_tokenizer([[{"role": "user", "content": TASK}]], trainer)
        refused = make_trainer(
            tmp_path, rollout_func(factory, base_url=url), generation_kwargs={"logit_bias": {1: 5}}
        )
        with pytest.raises(ConfigError, match="generation_kwargs"):
            refused.rollout_func([[{"role": "user", "content": TASK}]], refused)
    assert factory.leftovers() == []
    # A dead server and a raising reward: rows kept, nothing of them trained, reward 0.
    for out in (dead, broken):
        assert set(out["hermes_status"]) == {"failed"} and set(out["hermes_reward"]) == {0.0}
        assert not any(any(mask) for mask in out["env_mask"])
    assert len(dead["completion_ids"]) == 2
    with pytest.raises(ConfigError, match="no vLLM server"):
        RolloutFunc(tasks())([[{"role": "user", "content": TASK}]], object())

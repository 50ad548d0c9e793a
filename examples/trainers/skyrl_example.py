"""SkyRL: one GeneratorInput batch (two repetitions of one instance) against the scripted model.

Run: python examples/trainers/skyrl_example.py (no skyrl needed: the batch is a plain dict of
GeneratorInput's keys). In training, return the generator from your ``get_generator``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import anyio
from hermes_tasks import TOKENIZER, scripted_model, task

from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.integrations.skyrl import HermesGenerator


@dataclass
class TrajectoryID:  # skyrl.train.generators.base.TrajectoryID's fields
    instance_id: str
    repetition_id: int


async def main() -> None:
    ids = [TrajectoryID("task-0", 0), TrajectoryID("task-0", 1)]
    batch = {
        "prompts": [[{"role": "user", "content": "Put 42 in ~/answer.txt"}]] * 2,
        "env_classes": ["hermes"] * 2,
        "env_extras": [{}] * 2,
        "sampling_params": {"max_generate_length": 256, "temperature": 1.0},
        "trajectory_ids": ids,
        "batch_metadata": None,
    }
    async with (
        scripted_model() as (_, url),
        VLLMGenerateClient(url, vocab_size=len(TOKENIZER)) as client,
    ):
        out = await HermesGenerator(task, client, max_response_tokens=4096).generate(batch)
    print(
        json.dumps(
            {
                "rewards": out["rewards"],
                "stop_reasons": out["stop_reasons"],
                "sampled_tokens": [sum(mask) for mask in out["loss_masks"]],
                "response_tokens": [len(ids) for ids in out["response_ids"]],
            }
        )
    )


if __name__ == "__main__":
    anyio.run(main)

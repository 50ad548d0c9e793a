"""NeMo Gym: one /run answered by the hermes_async agent, against the scripted model.

Run: python examples/trainers/nemo_gym_example.py (no nemo-gym needed). In training, serve the
same task source with ``hermes-async serve-gym --tasks hermes_tasks:task --model-url URL``.
"""

from __future__ import annotations

import json

import anyio
from hermes_tasks import TOKENIZER, scripted_model, task

from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.integrations.nemo_gym import GymAgent


async def main() -> None:
    body = {"responses_create_params": {"input": "Put 42 in ~/answer.txt", "temperature": 1.0}}
    async with (
        scripted_model() as (_, url),
        VLLMGenerateClient(url, vocab_size=len(TOKENIZER)) as client,
    ):
        result = await GymAgent(task, client).run(body)  # what POST /run answers
    trained = [item for item in result["response"]["output"] if "generation_token_ids" in item]
    print(
        json.dumps(
            {
                "reward": result["reward"],
                "mask_sample": result["mask_sample"],
                "items": [item["type"] for item in result["response"]["output"]],
                "turns": len(trained),
                "sampled_tokens": sum(len(item["generation_token_ids"]) for item in trained),
            }
        )
    )


if __name__ == "__main__":
    anyio.run(main)

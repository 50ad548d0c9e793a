"""TRL: the rollout function on one prompt slice, as GRPOTrainer calls it, against the scripted
model. TRL calls it synchronously; the scripted model runs in a thread of its own here.

Run: python examples/trainers/trl_example.py (no trl needed: ``trainer`` stands in for the
GRPOTrainer attributes the function reads). In training: ``GRPOTrainer(...,
rollout_func=RolloutFunc(task), reward_funcs=[hermes_reward])``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import anyio.from_thread
from hermes_tasks import TOKENIZER, scripted_model, task

from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.integrations.trl import RolloutFunc, hermes_reward


def main() -> None:
    trainer = SimpleNamespace(args=SimpleNamespace(max_completion_length=4096, temperature=1.0))
    prompt = [{"role": "user", "content": "Put 42 in ~/answer.txt"}]
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(scripted_model()) as (_, url),
    ):
        rollout = RolloutFunc(
            task,
            base_url=url,
            client=lambda base: VLLMGenerateClient(base, vocab_size=len(TOKENIZER)),
        )
        out = rollout([prompt, prompt], trainer)  # num_generations=2: TRL repeats the prompt
    print(
        json.dumps(
            {
                "rewards": hermes_reward([prompt] * 2, [None] * 2, **out),
                "statuses": out["hermes_status"],
                "sampled_tokens": [sum(mask) for mask in out["env_mask"]],
                "completion_tokens": [len(ids) for ids in out["completion_ids"]],
            }
        )
    )


if __name__ == "__main__":
    main()

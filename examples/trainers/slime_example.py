"""slime: the custom generate function on one sample, against the scripted model.

Run: python examples/trainers/slime_example.py. slime has no package on PyPI, so ``Sample``
here is a stand-in with the fields the function sets (docs/trainers/slime.md lists them, with
slime's file reference); in slime, point ``--custom-generate-function-path`` at ``generate``.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import anyio
from hermes_tasks import TOKENIZER, scripted_model, task

from hermes_async.inference.generate import VLLMGenerateClient
from hermes_async.integrations.slime import make_generate


@dataclass
class Sample:  # the fields of slime's Sample this function reads and writes
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
    rollout_log_probs: list[float] | None = None
    weight_versions: list[str] = field(default_factory=list)
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)


async def main() -> None:
    args = SimpleNamespace(rollout_max_response_len=4096)
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 256}
    # slime's router speaks SGLang's /generate (server=None builds that client from args); the
    # scripted model here is served as vLLM, so the client is given.
    async with (
        scripted_model() as (_, url),
        VLLMGenerateClient(url, vocab_size=len(TOKENIZER)) as client,
    ):
        generate = make_generate(task, server=client)
        sample = await generate(args, Sample(prompt="Put 42 in ~/answer.txt"), sampling)
    print(
        json.dumps(
            {
                "reward": sample.reward,
                "status": sample.status.name,
                "response_length": sample.response_length,
                "sampled_tokens": sum(sample.loss_mask or []),
            }
        )
    )


if __name__ == "__main__":
    anyio.run(main)

"""The README's "use the loop from your own async code" example runs, on asyncio and trio."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest

pytestmark = pytest.mark.anyio

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _example_source() -> str:
    text = README.read_text()
    match = re.search(
        r"<!-- embedding-example:start -->\n```python\n(.*?)```\n<!-- embedding-example:end -->",
        text,
        re.S,
    )
    assert match, "the README's embedding example markers are missing"
    return match.group(1)


async def test_readme_embedding_example_runs() -> None:
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(_example_source(), str(README), "exec"), namespace)
    from hermes_async.testing import ScriptedModelServer, open_loopback_server

    server = ScriptedModelServer(namespace["oracle"])
    async with open_loopback_server(server) as base_url:
        batch = await namespace["run_batch"](base_url, 4)
    assert batch["scores"] == [1.0] * 4
    for tokens, masks, logprobs in zip(
        batch["tokens"], batch["masks"], batch["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        trained = [t for t in masks if t != -100]
        assert trained, "sampled tokens are trained"
    assert len(batch["messages"]) == 4 and batch["messages"][0][-1]["role"] == "assistant"

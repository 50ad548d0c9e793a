"""The rollout core needs no atroposlib: a group runs where importing atroposlib fails."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hermes_async

pytestmark = pytest.mark.timeout(180)

# Runs in a fresh interpreter whose import system refuses atroposlib (as if it were not
# installed), then runs a Phase 2 group with rewards through ToolContext on local sandboxes,
# under asyncio and under trio.
SCRIPT = textwrap.dedent(
    """
    import importlib.abc
    import json
    import sys


    class NoAtroposlib(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "atroposlib" or name.startswith("atroposlib."):
                raise ImportError(f"blocked for this test: {name}")
            return None


    sys.meta_path.insert(0, NoAtroposlib())

    import anyio

    from hermes_async import get_tool_definitions, load_tokenizer
    from hermes_async.agent import AgentOptions, RolloutSetup, run_group
    from hermes_async.inference.generate import VLLMGenerateClient
    from hermes_async.testing import ScriptedModelServer, open_app_endpoint

    try:
        import hermes_async.envs.base  # noqa: F401
    except ImportError as exc:
        envs_error = str(exc)
    else:
        envs_error = None


    def oracle(request):
        if any(m["role"] == "tool" for m in request.messages):
            return "Done."
        return (
            '<tool_call>\\n{"name": "write_file", "arguments": '
            '{"path": "~/answer.txt", "content": "42\\\\n"}}\\n</tool_call>'
        )


    async def reward(result, ctx):
        out = await ctx.terminal("cat ~/answer.txt")
        return 1.0 if out["output"].strip() == "42" else 0.0


    async def main():
        tokenizer = load_tokenizer()
        server = ScriptedModelServer(oracle, tokenizer=tokenizer)
        async with open_app_endpoint(server, loopback=False) as (url, transport):
            async with VLLMGenerateClient(url, transport=transport) as client:
                group = await run_group(
                    client,
                    [{"role": "user", "content": "Put 42 in ~/answer.txt"}],
                    get_tool_definitions(["terminal", "file"]),
                    size=3,
                    setup=RolloutSetup(reward=reward, tokenizer=tokenizer),
                    options=AgentOptions(max_tokens=128),
                )
        rows = group.to_scored_data_group()
        return {
            "rewards": group.rewards,
            "aligned": all(
                len(t) == len(m) == len(lp) > 0
                for t, m, lp in zip(rows["tokens"], rows["masks"], rows["inference_logprobs"])
            ),
        }


    report = {backend: anyio.run(main, backend=backend) for backend in ("asyncio", "trio")}
    report["atroposlib_loaded"] = any(m.split(".")[0] == "atroposlib" for m in sys.modules)
    report["envs_error"] = envs_error
    print(json.dumps(report))
    """
)


def test_agent_runs_a_group_where_atroposlib_cannot_be_imported(tmp_path: Path) -> None:
    checkout = Path(hermes_async.__file__).resolve().parents[1]  # this tree, not an install
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(checkout),
            "TMPDIR": str(tmp_path),
            "HF_HUB_OFFLINE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        },
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for backend in ("asyncio", "trio"):
        assert report[backend] == {"rewards": [1.0, 1.0, 1.0], "aligned": True}
    assert report["atroposlib_loaded"] is False
    # The adapter, by contrast, says what to install.
    assert "pip install 'hermes-async[atropos]'" in report["envs_error"]

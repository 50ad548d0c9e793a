"""The NeMo Gym agent server against the /run contract (tests/trainers/ adds Gym's own models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from hermes_async.integrations.nemo_gym import GymAgent, create_app, messages_from_params
from hermes_async.testing import Fault
from hermes_async.testing.http import open_asgi_transport
from hermes_async.tools.sandbox.manager import SandboxManager
from tests.support import RecordingFactory

from .helpers import assert_turns_match_wire, make_tasks, raising_reward, scripted, vllm_client

pytestmark = pytest.mark.anyio

BODY = {"responses_create_params": {"input": "Put 42 in ~/answer.txt", "temperature": 1.0}}


def nemo_rl_turns(response: dict[str, Any]) -> list[tuple[list[int], list[int], list[float]]]:
    """What NeMo RL reads of a response: the items with token ids, in order, each prompt
    extending everything seen so far (its contiguity assertion)."""
    seen: list[int] = []
    turns = []
    for item in response["output"]:
        if "generation_token_ids" not in item:
            continue
        assert item["prompt_token_ids"][: len(seen)] == seen, "non-contiguous messages"
        turns.append(
            (item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"])
        )
        seen = item["prompt_token_ids"] + item["generation_token_ids"]
    return turns


async def test_run_returns_each_turn_with_the_wire_ids(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sb")
    async with (
        scripted() as (server, url, transport),
        SandboxManager(factory) as manager,
        vllm_client(transport, url) as client,
    ):
        result = await GymAgent(make_tasks(manager), client).run(BODY)
        assert manager.task_ids() == []
    assert result["reward"] == 1.0 and result["mask_sample"] is False
    response = result["response"]
    assert response["status"] == "completed"
    kinds = [item["type"] for item in response["output"]]
    assert kinds == [
        "message",
        "function_call",
        "function_call_output",
        "function_call",
        "function_call_output",
        "message",
    ]
    turns = nemo_rl_turns(response)
    assert len(turns) == 3
    assert_turns_match_wire(turns, server.requests)
    # The token ids sit on each turn's last item (Gym's own convention).
    assert [i for i, item in enumerate(response["output"]) if "generation_token_ids" in item] == [
        1,
        3,
        5,
    ]
    assert factory.leftovers() == []


async def test_failures_come_back_masked_and_named(tmp_path: Path) -> None:
    factory = RecordingFactory(tmp_path / "sb")
    died = {
        2: Fault.disconnect(after_tokens=3),
        3: Fault.disconnect(after_tokens=3),
        4: Fault.disconnect(after_tokens=3),
        5: Fault.disconnect(after_tokens=3),
    }
    async with (
        scripted(faults=died) as (_, url, transport),
        SandboxManager(factory) as manager,
        vllm_client(transport, url) as client,
    ):
        dead = await GymAgent(make_tasks(manager), client).run(BODY)
        assert manager.task_ids() == []
    assert dead["mask_sample"] is True and dead["reward"] == 0.0
    assert dead["failure_kind"] == "agent_request_failed"
    assert "model call failed" in dead["failure_reason"]
    assert dead["response"]["status"] == "incomplete"
    async with (
        scripted() as (_, url, transport),
        SandboxManager(factory) as manager,
        vllm_client(transport, url) as client,
    ):
        broken = await GymAgent(make_tasks(manager, reward=raising_reward), client).run(BODY)
        assert manager.task_ids() == []
    assert broken["mask_sample"] is True and broken["failure_kind"] == "verifier_error"
    assert "the verifier broke" in broken["failure_reason"]
    assert factory.leftovers() == []


async def test_the_app_answers_422_for_what_it_cannot_honour_and_500_json_when_misconfigured(
    tmp_path: Path,
) -> None:
    factory = RecordingFactory(tmp_path / "sb")
    async with (
        scripted() as (_, url, transport),
        SandboxManager(factory) as manager,
        vllm_client(transport, url) as client,
    ):
        app = create_app(make_tasks(manager), server=client)
        bad = create_app(make_tasks(manager, tokenizer=None), server=client)
        async with (
            open_asgi_transport(app) as asgi,
            httpx.AsyncClient(transport=asgi, base_url="http://gym") as http,
        ):
            ok = await http.post("/run", json=BODY)
            assert ok.status_code == 200 and ok.json()["reward"] == 1.0
            for params, said in [
                ({"input": "x", "top_logprobs": 5}, "top_logprobs"),
                ({"input": "x", "tool_choice": "required"}, "tool_choice"),
                ({"input": "x", "temperature": -1}, "temperature"),
                ({"input": "x", "previous_response_id": "r1"}, "previous_response_id"),
            ]:
                refused = await http.post("/run", json={"responses_create_params": params})
                assert refused.status_code == 422 and said in refused.json()["detail"]
            assert (await http.post("/run", json={"x": 1})).status_code == 422
        async with (
            open_asgi_transport(bad) as asgi,
            httpx.AsyncClient(transport=asgi, base_url="http://gym") as http,
        ):
            misconfigured = await http.post("/run", json=BODY)
        assert misconfigured.status_code == 500
        assert "no tokenizer" in misconfigured.json()["detail"]
        assert "Traceback" not in misconfigured.text
        assert manager.task_ids() == []
    assert factory.leftovers() == []


def test_messages_from_params_reads_instructions_and_items() -> None:
    params = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "terminal", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    }
    assert messages_from_params(params) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"input": None}, "input must be a string or a list of items, got NoneType"),
        ({"input": {"role": "user"}}, "input must be a string or a list of items, got dict"),
        ({"input": ["hi"]}, "each input item must be an object, got str"),
        ({"input": "x", "tools": 5}, "tools must be a list, got int"),
    ],
)
async def test_a_run_body_of_the_wrong_shape_gets_422_before_any_rollout(
    params: dict[str, Any], said: str
) -> None:
    def tasks(item: Any) -> Any:
        raise AssertionError("no task is made for a refused request")

    app = create_app(tasks, server=object())
    async with (
        open_asgi_transport(app) as asgi,
        httpx.AsyncClient(transport=asgi, base_url="http://gym") as http,
    ):
        refused = await http.post("/run", json={"responses_create_params": params})
    assert refused.status_code == 422, refused.text
    assert said in refused.json()["detail"]

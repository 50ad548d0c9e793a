"""The wire model: what a request must be, and a result's round trip."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from hermes_async.agent.failures import RolloutFailure
from hermes_async.errors import RequestError, WorkerError
from hermes_async.service.wire import (
    WIRE_VERSION,
    GroupRequest,
    GroupResult,
    RequestBounds,
    RolloutRecord,
    decode_json,
)

NOW = 1_000_000.0
BOUNDS = RequestBounds(max_group_size=64, max_item_bytes=1000, max_deadline_seconds=3600)


def request(**changes: Any) -> dict[str, Any]:
    body = GroupRequest("echo", {"label": "a"}, 4, NOW + 60, "g1").to_json()
    body.update(changes)
    return body


def parse(body: object) -> GroupRequest:
    return GroupRequest.from_json(body, BOUNDS, now=NOW)  # type: ignore[arg-type]


def test_a_request_round_trips() -> None:
    sent = GroupRequest("echo", {"label": "a"}, 4, NOW + 60, "g1", 7, 0.5, True)
    assert parse(decode_json(sent.to_bytes(), "body")) == sent


@pytest.mark.parametrize(
    ("changes", "status", "match"),
    [
        ({"size": 0}, 400, r"'size' must be between 1 and 64 .*got 0"),
        ({"size": 10**6}, 400, r"'size' must be between 1 and 64 .*got 1000000"),
        ({"size": 2.5}, 400, r"'size' must be an integer"),
        ({"size": True}, 400, r"'size' must be an integer"),
        ({"deadline": NOW - 1}, 400, r"deadline .* has already passed"),
        ({"deadline": NOW + 7200}, 400, r"7200 s ahead; this worker takes at most 3600"),
        ({"deadline": "soon"}, 400, r"'deadline' must be a Unix time"),
        ({"deadline": float("nan")}, 400, r"has already passed"),
        ({"environment": ""}, 400, r"'environment' must be a non-empty string"),
        ({"item": "x" * 2000}, 413, r"the item is 2002 bytes of JSON; .* at most 1000"),
        ({"wire": 99}, 422, r"wire version 99; this worker speaks 1"),
        ({"group_id": ""}, 400, r"'group_id' must be a string of 1-200"),
        ({"temperature": -1}, 400, r"'temperature' must be a number in \[0, 10\]"),
        ({"include_messages": "yes"}, 400, r"'include_messages' must be true or false"),
        ({"policy_version": "v1"}, 400, r"'policy_version' must be an integer"),
        ({"colour": "red"}, 400, r"unknown request fields \['colour'\]"),
    ],
)
def test_bad_requests_are_refused_with_the_reason(
    changes: dict[str, Any], status: int, match: str
) -> None:
    with pytest.raises(RequestError, match=match) as caught:
        parse(request(**changes))
    assert caught.value.status == status


def test_a_request_needs_an_item_and_an_object() -> None:
    body = request()
    del body["item"]
    with pytest.raises(RequestError, match="'item' is missing"):
        parse(body)
    with pytest.raises(RequestError, match="a group request is a JSON object, got list"):
        parse([1, 2])


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"{not json", "is not valid JSON"),
        (b"\xff\xfe", "is not UTF-8"),
        (b"[" * 100 + b"]" * 100, "nests deeper than 64 levels"),
    ],
)
def test_bodies_that_are_not_json_are_refused(data: bytes, match: str) -> None:
    with pytest.raises(RequestError, match=match) as caught:
        decode_json(data, "the body")
    assert caught.value.status == 400


def rollout(n: int = 3, failure: RolloutFailure | None = None) -> RolloutRecord:
    return RolloutRecord(
        "g1-0",
        list(range(n)),
        [-100, *list(range(1, n))],
        [1.0] + [-0.5] * (n - 1),
        1.0,
        True,
        failure,
        turns=2,
        policy_versions=[3],
    )


def test_a_result_round_trips_bytes_for_bytes() -> None:
    failure = RolloutFailure.of("tool", "1 failed tool call", source="tools", count=1)
    result = GroupResult(
        "g1",
        "echo",
        "zeroed",
        (rollout(), rollout(5, failure)),
        None,
        {"tool": 1},
        "w0",
        1.5,
        3,
    )
    data = result.to_bytes()
    back = GroupResult.from_bytes(data)
    assert back == result
    assert back.to_bytes() == data
    assert orjson.loads(data)["wire"] == WIRE_VERSION


def test_a_failed_result_says_why_and_has_no_rows() -> None:
    req = GroupRequest("echo", {}, 4, NOW + 1, "g9")
    failure = RolloutFailure.of("agent_timeout", "did not finish", source="deadline")
    result = GroupResult.failed(req, failure, worker="w1", seconds=2.0)
    back = GroupResult.from_bytes(result.to_bytes())
    assert back.outcome == "failed" and back.masked and back.rollouts == ()
    assert back.failure == failure
    assert back.failure_counts == {"agent_timeout": 4}


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda o: o.update(wire=2), "wire version 2"),
        (lambda o: o.update(outcome="great"), "unknown outcome 'great'"),
        (lambda o: o["rollouts"][0].update(masks=[1]), "differ in length"),
        (lambda o: o.update(failure={"category": "bad"}), "not a failure"),
        (lambda o: o.pop("group_id"), "group_id"),
        (lambda o: o.update(failure_counts=["infra"]), "'failure_counts' must be an object"),
    ],
)
def test_malformed_results_are_a_worker_error(mutate: Any, match: str) -> None:
    obj = GroupResult("g1", "echo", "ok", (rollout(),)).to_json()
    mutate(obj)
    with pytest.raises(WorkerError, match=match):
        GroupResult.from_json(obj)
    with pytest.raises(WorkerError, match="not JSON"):
        GroupResult.from_bytes(b"<html>")

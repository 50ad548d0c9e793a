"""Issue #20 acceptance: random aborts (inside tool-call arguments, on chunk boundaries) lose
nothing and change nothing. 100 rollouts here; ``bench/partial_rollouts.py --acceptance 1000``
runs the recorded 1,000 (set ``HERMES_PARTIAL_ROLLOUTS`` to run more here)."""

from __future__ import annotations

import os

import pytest

from hermes_async.inference.tokenizer import load_tokenizer
from hermes_async.testing.partial import PartialConfig, run_partial_acceptance

pytestmark = pytest.mark.anyio

TOKENIZER = load_tokenizer()
ROLLOUTS = int(os.environ.get("HERMES_PARTIAL_ROLLOUTS", "100"))


async def test_random_aborts_lose_no_token_and_change_no_rollout() -> None:
    stats = await run_partial_acceptance(PartialConfig(rollouts=ROLLOUTS), tokenizer=TOKENIZER)
    assert stats.ok, stats.report()
    assert stats.rollouts == ROLLOUTS
    assert stats.lost_tokens == 0 and stats.sent_tokens == stats.kept_tokens > 0
    # The run exercised what it claims to.
    assert stats.aborts >= ROLLOUTS // 2
    assert stats.boundary_aborts > 0 and stats.argument_aborts > 0
    assert stats.resumes == stats.aborts  # every abort was resumed, none failed
    assert stats.version_splits > 0

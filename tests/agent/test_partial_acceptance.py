"""Issue #20 acceptance: random aborts (inside tool-call arguments, on chunk boundaries) lose
nothing and change nothing. 30 rollouts here, the recorded 100 with ``--run-slow``;
``bench/partial_rollouts.py --acceptance 1000`` runs 1,000."""

from __future__ import annotations

import pytest

from hermes_async.testing.partial import PartialConfig, run_partial_acceptance
from tests.support import TOKENIZER

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("rollouts", [30, pytest.param(100, marks=pytest.mark.slow)])
async def test_random_aborts_lose_no_token_and_change_no_rollout(rollouts: int) -> None:
    stats = await run_partial_acceptance(PartialConfig(rollouts=rollouts), tokenizer=TOKENIZER)
    assert stats.ok, stats.report()
    assert stats.rollouts == rollouts
    assert stats.lost_tokens == 0 and stats.sent_tokens == stats.kept_tokens > 0
    # The run exercised what it claims to.
    assert stats.aborts >= rollouts // 2
    assert stats.boundary_aborts > 0 and stats.argument_aborts > 0
    assert stats.resumes == stats.aborts  # every abort was resumed, none failed
    assert stats.version_splits > 0

"""Against a *stock* vLLM (started without ``--enable-scale-out``): the generate route answers
403, the probe picks ``/v1/completions``, and multi-turn rollouts over it keep every token."""

from __future__ import annotations

import pytest

from hermes_async.inference.completions import detect_token_endpoint
from hermes_async.inference.tokenizer import Tokenizer
from tests.integration import test_vllm_multiturn as multiturn

pytestmark = [pytest.mark.anyio, pytest.mark.vllm_stock]


async def test_the_probe_falls_back_to_completions(vllm_url: str) -> None:
    assert await detect_token_endpoint(vllm_url + "/v1") == "completions"


async def test_concurrent_three_turn_rollouts_on_a_stock_server(
    vllm_url: str, served_tokenizer: Tokenizer
) -> None:
    route = await detect_token_endpoint(vllm_url)
    await multiturn.test_concurrent_three_turn_rollouts_keep_every_sampled_token(
        vllm_url, served_tokenizer, route
    )


async def test_a_cut_call_on_a_stock_server(vllm_url: str, served_tokenizer: Tokenizer) -> None:
    route = await detect_token_endpoint(vllm_url)
    await multiturn.test_a_max_tokens_cut_inside_a_call_is_content_and_an_error(
        vllm_url, served_tokenizer, route
    )

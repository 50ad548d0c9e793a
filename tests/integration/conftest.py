"""Fixtures for the opt-in real-vLLM tests (`make test-vllm` sets HERMES_ASYNC_VLLM_URL).

Tests here carry ``pytest.mark.vllm``; tests/conftest.py skips them unless the URL is set.
"""

from __future__ import annotations

import os

import pytest

from hermes_async.inference.tokenizer import QwenTokenizer, Tokenizer, load_tokenizer


@pytest.fixture(scope="session")
def vllm_url() -> str:
    url = os.environ.get("HERMES_ASYNC_VLLM_URL")
    if not url:
        pytest.skip("HERMES_ASYNC_VLLM_URL is not set; run `make test-vllm`")
    return url.rstrip("/")


@pytest.fixture(scope="session")
def qwen() -> QwenTokenizer:
    return QwenTokenizer()


@pytest.fixture(scope="session")
def served_tokenizer() -> Tokenizer:
    """The HF tokenizer directory the server was started with (falls back to the built-in)."""
    return load_tokenizer(os.environ.get("HERMES_ASYNC_VLLM_TOKENIZER") or None)

"""Test harness: every async test runs on asyncio (debug mode) and trio; offline by default."""

from __future__ import annotations

import os
import tempfile

# Set before anything imports transformers / wandb / huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["WANDB_MODE"] = os.environ.get("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Hypothesis keeps its example database (and caches) in ./.hypothesis by default: tests must not
# write into the checkout, so it lives in the temp directory (still shared across runs).
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "hermes-async-hypothesis")
)

import importlib.metadata

import pytest

# The plugin environment authors get (hermes_async.testing.pytest_plugin): loaded through its
# pytest11 entry point once the package is installed with it, else (an older install of this
# checkout) from here -- never both, which pytest refuses.
if not any(
    ep.value == "hermes_async.testing.pytest_plugin"
    for ep in importlib.metadata.entry_points(group="pytest11")
):
    pytest_plugins = ["hermes_async.testing.pytest_plugin"]


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"debug": True}), id="asyncio"),
        pytest.param(("trio", {}), id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    return request.param  # type: ignore[no-any-return]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = config.getoption("--run-slow") or os.environ.get("HERMES_ASYNC_RUN_SLOW") == "1"
    vllm_url = os.environ.get("HERMES_ASYNC_VLLM_URL")
    skip_slow = pytest.mark.skip(reason="slow: opt in with --run-slow or HERMES_ASYNC_RUN_SLOW=1")
    skip_vllm = pytest.mark.skip(
        reason="vllm: needs a real vLLM server; run `make test-vllm` (sets HERMES_ASYNC_VLLM_URL)"
    )
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
        if "vllm" in item.keywords and not vllm_url:
            item.add_marker(skip_vllm)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how many tests passed on each async backend, so both are visible in every run."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") not in ("call", "setup"):
                continue
            if outcome == "passed" and report.when != "call":
                continue
            nodeid = getattr(report, "nodeid", "")
            for backend in ("asyncio", "trio"):
                if (
                    nodeid.endswith(f"[{backend}]")
                    or f"[{backend}-" in nodeid
                    or f"-{backend}]" in nodeid
                ):
                    counts.setdefault(backend, {}).setdefault(outcome, 0)
                    counts[backend][outcome] += 1
    if counts:
        terminalreporter.section("async backends")
        for backend, by_outcome in sorted(counts.items()):
            detail = ", ".join(f"{n} {o}" for o, n in sorted(by_outcome.items()))
            terminalreporter.write_line(f"{backend}: {detail}")

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

import pytest


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


# ------------------------------------------------------------------------------------------
# Blocking-call detector: the loop, sandbox and inference tests fail on any blocking call the
# package makes on the event loop (blockbuster, as anyio's own suite uses). It patches the
# blocking functions of the standard library and raises when one is called from
# hermes_async's code inside a running asyncio loop; trio runs the same code paths, so the
# asyncio run covers them. A call that must block stays in this list with its reason.

_BLOCKING_CHECKED_DIRS = ("tests/agent/", "tests/inference/")

#: (file, functions) where a blocking call is allowed, each with its reason.
_CAN_BLOCK: list[tuple[str, tuple[str, ...], str]] = [
    (
        "hermes_async/tools/sandbox/local.py",
        ("create",),
        "a sandbox's directories: one mkdtemp + 4 mkdir on a local disk, microseconds, once per "
        "sandbox (a thread hop would cost more than the calls)",
    ),
    (
        "hermes_async/tools/sandbox/archive.py",
        ("check_tar_members",),
        "tarfile.data_filter resolves member paths against a synthetic destination "
        "(os.path.realpath of a path that does not exist: a few lstat calls, no tree walked)",
    ),
    (
        "hermes_async/tools/sandbox/processes.py",
        ("_proc_names", "read_process_table", "sweep_process_table", "_sweep"),
        "process-isolation fallback only: the /proc sweep reads procfs (no disk) and yields "
        "to the loop every 2 ms (bench/sandbox_close.py: lag p99 < 20 ms at 500 closes)",
    ),
    (
        "hermes_async/agent/context.py",
        ("run",),
        "ToolContext transfers read tar members from in-memory BytesIO archives (no file "
        "descriptor behind them)",
    ),
]


@pytest.fixture(autouse=True)
def _no_blocking_calls(request: pytest.FixtureRequest) -> object:
    path = request.node.nodeid
    if not path.startswith(_BLOCKING_CHECKED_DIRS) or "[asyncio" not in path:
        yield None
        return
    from blockbuster import BlockBuster

    # The test infrastructure (loopback servers, fakes) may block at start-up; the library may not.
    buster = BlockBuster(
        scanned_modules=["hermes_async"], excluded_modules=["hermes_async.testing"]
    )
    for function in buster.functions.values():
        for filename, functions, _reason in _CAN_BLOCK:
            function.can_block_in(filename, functions)
    buster.activate()
    try:
        yield buster
    finally:
        buster.deactivate()

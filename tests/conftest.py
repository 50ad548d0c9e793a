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
from dataclasses import dataclass

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
    """Both backends; a test marked ``virtual_clock`` runs its trio half under a MockClock."""
    name, options = request.param
    if name == "asyncio" and request.node.get_closest_marker("slow") is not None:
        # A slow test is the large size of a test whose default size runs in debug mode in
        # every run: debug mode's per-future stacks would multiply its time, checking no more.
        return name, {**options, "debug": False}
    if name == "trio" and request.node.get_closest_marker("virtual_clock") is not None:
        import trio.testing

        # Time jumps ahead whenever every task waits: deadlines and back-offs cost no wall time.
        return name, {**options, "clock": trio.testing.MockClock(autojump_threshold=0)}
    return name, options


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run tests marked slow")
    parser.addoption(
        "--uvloop",
        action="store_true",
        help="run every asyncio test on uvloop (anyio's use_uvloop); also HERMES_ASYNC_TEST_UVLOOP=1",
    )


def on_uvloop(config: pytest.Config) -> bool:
    """Whether this run puts the asyncio tests on uvloop (``--uvloop``)."""
    return bool(config.getoption("--uvloop")) or os.environ.get("HERMES_ASYNC_TEST_UVLOOP") == "1"


def _put_asyncio_on_uvloop(config: pytest.Config) -> None:
    if not on_uvloop(config):
        return
    # anyio's plugin reads every test's backend through this one function (the shared fixture
    # and each module's own asyncio-only fixture alike): asyncio gains use_uvloop there.
    import anyio.pytest_plugin

    extract = anyio.pytest_plugin.extract_backend_and_options

    def with_uvloop(backend: object) -> tuple[str, dict[str, object]]:
        name, options = extract(backend)
        if name == "asyncio":
            options = {**options, "use_uvloop": True}
        return name, options

    anyio.pytest_plugin.extract_backend_and_options = with_uvloop


#: The longest test files, longest first (seconds per file under `.ci/run`'s settings). With
#: `--no-loadscope-reorder` (the Makefile's) pytest-xdist hands files to its workers in
#: collection order: the long ones start at once and the short ones fill in at the end. xdist's
#: own order (most tests first) started these last, one worker running alone for minutes.
LONGEST_FIRST = (
    "tests/tools/browser/test_sessions.py",
    "tests/parsers/test_hostile_properties.py",
    "tests/agent/test_loop_cancellation.py",
    "tests/envs/test_command.py",
    "tests/envs/test_preflight.py",
    "tests/envs/test_reference_port.py",
    "tests/agent/test_rollout_pool.py",
    "tests/envs/terminalbench/test_env.py",
    "tests/envs/test_serve.py",
    "tests/agent/test_partial_acceptance.py",
    "tests/envs/test_secrets.py",
    "tests/envs/test_cli.py",
    "tests/tools/sandbox/test_ssh.py",
    "tests/envs/test_cli_modes.py",
    "tests/envs/test_resume.py",
    "tests/test_cli.py",
    "tests/agent/test_without_atroposlib.py",
    "tests/tools/browser/test_bounds.py",
    "tests/envs/test_token_endpoint_auto.py",
    "tests/tools/sandbox/test_apptainer.py",
    "tests/envs/test_swe.py",
    "tests/tools/sandbox/test_local.py",
)


def _longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [path for path in LONGEST_FIRST if not (config.rootpath / path).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names missing files: {missing}")
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_first(config, items)
    run_slow = config.getoption("--run-slow") or os.environ.get("HERMES_ASYNC_RUN_SLOW") == "1"
    vllm_url = os.environ.get("HERMES_ASYNC_VLLM_URL")
    skip_slow = pytest.mark.skip(reason="slow: opt in with --run-slow or HERMES_ASYNC_RUN_SLOW=1")
    skip_vllm = pytest.mark.skip(
        reason="vllm: needs a real vLLM server; run `make test-vllm` (sets HERMES_ASYNC_VLLM_URL)"
    )
    stock = bool(vllm_url) and os.environ.get("HERMES_ASYNC_VLLM_SCALE_OUT") == "0"
    skip_stock = pytest.mark.skip(
        reason="vllm_stock: needs a stock vLLM (no --enable-scale-out); run `make test-vllm`"
    )
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
        if "vllm" in item.keywords and not vllm_url:
            item.add_marker(skip_vllm)
        if "vllm_stock" in item.keywords and not stock:
            item.add_marker(skip_stock)


_isolation_problem: list[str | None] = []


def isolation_problem() -> str | None:
    """Why namespaced local sandboxes cannot run here (``None``: they can). Checked once: the
    tools (root, bwrap, nsenter, unshare) and one throw-away bubblewrap world."""
    if not _isolation_problem:
        import subprocess

        from hermes_async.tools.sandbox.namespaces import (
            DEFAULT_RO_PATHS,
            _ro_args,
            namespace_support,
        )

        problem = namespace_support()
        if problem is None:
            argv = ["bwrap", "--unshare-pid", "--unshare-net", *_ro_args(DEFAULT_RO_PATHS)]
            argv += ["--proc", "/proc", "--dev", "/dev", "--", "/bin/sh", "-c", "exit 0"]
            try:
                done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                problem = f"bwrap could not run: {exc}"
            else:
                if done.returncode != 0:
                    problem = f"bwrap failed: {done.stderr.decode(errors='replace').strip()}"
        _isolation_problem.append(problem)
    return _isolation_problem[0]


def pytest_configure(config: pytest.Config) -> None:
    """Where namespaces cannot be made, the suite opts out of isolation explicitly (the local
    backend refuses to run unisolated otherwise), unless ``HERMES_ASYNC_REQUIRE_ISOLATION=1``.
    Tests of the default itself clear ``HERMES_SANDBOX_ISOLATION`` for themselves."""
    _put_asyncio_on_uvloop(config)
    if os.environ.get("HERMES_ASYNC_REQUIRE_ISOLATION") == "1" or isolation_problem() is None:
        return
    os.environ.setdefault("HERMES_SANDBOX_ISOLATION", "process")


def pytest_report_header(config: pytest.Config) -> str:
    problem = isolation_problem()
    if problem is None:
        return "local sandboxes: namespaced"
    chosen = os.environ.get("HERMES_SANDBOX_ISOLATION", "unset")
    return f"local sandboxes: NOT namespaced ({problem}); HERMES_SANDBOX_ISOLATION={chosen}"


@pytest.fixture(scope="session")
def without_bubblewrap(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a machine without bubblewrap, for a subprocess: ``PATH`` is one
    directory of links to every program on this ``PATH`` but ``bwrap``, and no isolation has
    been chosen (``HERMES_SANDBOX_ISOLATION`` empty, so merging it over ``os.environ`` clears
    the suite's own opt-out)."""
    bin_dir = tmp_path_factory.mktemp("no-bwrap-bin")
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = os.path.join(directory, name)
            link = bin_dir / name
            if name == "bwrap" or link.exists() or not os.access(target, os.X_OK):
                continue
            link.symlink_to(target)
    return {**os.environ, "PATH": str(bin_dir), "HERMES_SANDBOX_ISOLATION": ""}


def _needs_namespaces(item: pytest.Item) -> bool:
    if item.get_closest_marker("namespaces") is not None:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("isolation") == "namespaces"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Namespaced-sandbox tests skip where bubblewrap/root is missing, and FAIL instead under
    ``HERMES_ASYNC_REQUIRE_ISOLATION=1`` (CI, after ``scripts/sandbox/install.sh``); ``ssh``
    tests likewise without an sshd (``HERMES_ASYNC_REQUIRE_SSH=1``)."""
    if item.get_closest_marker("ssh") is not None:
        _skip_or_fail_without_sshd()
    if not _needs_namespaces(item):
        return
    problem = isolation_problem()
    if problem is None:
        return
    if os.environ.get("HERMES_ASYNC_REQUIRE_ISOLATION") == "1":
        pytest.fail(f"HERMES_ASYNC_REQUIRE_ISOLATION=1 but {problem}", pytrace=False)
    pytest.skip(f"namespaced sandboxes unavailable: {problem} (scripts/sandbox/install.sh)")


@dataclass(frozen=True)
class SshServer:
    """The sshd the ssh-marked tests log in to (``scripts/ssh/sshd.sh up`` exports it)."""

    host: str
    port: int
    user: str
    key_path: str
    known_hosts: str


def _ssh_settings() -> tuple[dict[str, str], str | None]:
    """``HERMES_ASYNC_SSH_*`` and why they are unusable (``None``: an sshd answers there)."""
    import socket

    names = ("HOST", "PORT", "USER", "KEY", "KNOWN_HOSTS")
    values = {name: os.environ.get(f"HERMES_ASYNC_SSH_{name}", "") for name in names}
    missing = [f"HERMES_ASYNC_SSH_{name}" for name, value in values.items() if not value]
    if missing:
        return values, f"{', '.join(missing)} not set"
    if not values["PORT"].isdigit():
        return values, f"HERMES_ASYNC_SSH_PORT={values['PORT']!r} is not a port"
    try:
        with socket.create_connection((values["HOST"], int(values["PORT"])), timeout=3):
            pass
    except OSError as exc:
        return values, f"nothing answers at {values['HOST']}:{values['PORT']} ({exc})"
    return values, None


def _skip_or_fail_without_sshd() -> dict[str, str]:
    values, problem = _ssh_settings()
    if problem is not None:
        if os.environ.get("HERMES_ASYNC_REQUIRE_SSH") == "1":
            pytest.fail(f"HERMES_ASYNC_REQUIRE_SSH=1 but {problem}", pytrace=False)
        pytest.skip(f'no sshd for the ssh tests: {problem} (eval "$(scripts/ssh/sshd.sh up)")')
    return values


@pytest.fixture(scope="session")
def ssh_server() -> SshServer:
    """The sshd from ``HERMES_ASYNC_SSH_HOST/PORT/USER/KEY/KNOWN_HOSTS``; skips when unset or
    not answering, and FAILS instead under ``HERMES_ASYNC_REQUIRE_SSH=1`` (CI, after
    ``scripts/ssh/sshd.sh up``). A test marked ``ssh`` gets the same treatment without it."""
    values = _skip_or_fail_without_sshd()
    return SshServer(
        values["HOST"], int(values["PORT"]), values["USER"], values["KEY"], values["KNOWN_HOSTS"]
    )


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

_BLOCKING_CHECKED_DIRS = ("tests/agent/", "tests/inference/", "tests/service/")

#: (file, functions) where a blocking call is allowed, each with its reason.
_CAN_BLOCK: list[tuple[str, tuple[str, ...], str]] = [
    (
        "hermes_async/tools/sandbox/local.py",
        ("create", "_write_marker"),
        "a sandbox's directories: one mkdtemp + 4 mkdir + its marker file on a local disk, "
        "microseconds, once per sandbox (a thread hop would cost more than the calls)",
    ),
    (
        "hermes_async/service/environments.py",
        ("_open_atropos",),
        "an atroposlib environment's constructor and setup (its config, its tokenizer), once "
        "per environment when a worker starts, before it serves anything",
    ),
    (
        "hermes_async/_asgi.py",
        ("serve_asgi",),
        "hypercorn's first import reads the working directory (os.getcwd), once per process, "
        "when a server starts",
    ),
    (
        "hermes_async/tools/sandbox/leftovers.py",
        (
            "claim_root",
            "sweep_dead_roots",
            "_owner",
            "_write_owner",
            "release_root",
            "_sandbox_dirs",
            "_marker",
            "count_sandboxes",
        ),
        "a worker's start (and a sweep): a directory listing and a few tiny files of the "
        "worker roots, once, on a local disk",
    ),
    (
        "hermes_async/tools/sandbox/namespaces.py",
        (
            "namespace_support",
            "_namespace_support",
            "_own_cgroup",
            "discover",
            "_sweep_dead_owners",
            "_ro_args",
            "_keeper_pids",
            "_read_info",
            "_read_cgroup",
            "_cgroup_members",
            "_abandon_cgroups",
            "signal_members",
            "start",
            "release",
            "processes_in_pid_namespace",  # diagnostics (live_processes), tests only
            "in_cgroups",  # the same diagnostics
        ),
        "namespaced sandboxes: procfs / cgroupfs reads and writes (kernel memory, no disk), "
        "PATH lookups and stat of the system paths a world shows (cached dentries), pipe and "
        "pidfd handles; microseconds each, a few per sandbox start and close. A start also "
        "copies the disk image in the kernel (copy_file_range of ~0.6 MiB, ~0.4 ms) and "
        "attaches its loop device (two ioctls)",
    ),
    (
        "hermes_async/tools/sandbox/host.py",
        ("_start_pidfd",),
        "a command's fork + exec: Popen reads its exec-status pipe until the child has exec'd "
        "(sub-millisecond; the same call asyncio's subprocess support makes inside its "
        "transport), then pidfd_open",
    ),
    (
        "hermes_async/tools/sandbox/archive.py",
        ("check_tar_members",),
        "tarfile.data_filter resolves member paths against a synthetic destination "
        "(os.path.realpath of a path that does not exist: a few lstat calls, no tree walked)",
    ),
    (
        "hermes_async/tools/sandbox/processes.py",
        (
            "_proc_names",
            "read_process_table",
            "sweep_process_table",
            "_sweep",
            "_read_stat",
            "group_alive",
            "_signal_entry",
            "_start_ticks",
            "process_tag",
            "tag_alive",
        ),
        "process-isolation fallback only: the /proc sweep reads procfs (no disk) and yields "
        "to the loop every 2 ms (bench/sandbox_close.py: lag p99 < 20 ms at 500 closes); "
        "a group's liveness / a signal reads one /proc/<pid>/stat (procfs, no disk)",
    ),
    (
        "hermes_async/agent/context.py",
        ("run",),
        "ToolContext transfers read tar members from in-memory BytesIO archives (no file "
        "descriptor behind them)",
    ),
    (
        "hermes_async/tools/standalone.py",
        ("close_local_now", "_remove_tree", "retry"),
        "the reference's synchronous `ctx.cleanup()` (no await) of a standalone local sandbox: "
        "it must kill and remove on the spot, as the reference's did; awaited cleanup "
        "(`await ctx.cleanup()`, `async with`) goes through the async release instead",
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

"""Harbor task folders: the task model and the ``task.toml`` parser (schemas 1.0 to 1.4).

Unknown keys are ignored and features we cannot run (compose, ``[[steps]]``) refused by
name. Every requested value is clamped to an operator maximum (:class:`TaskLimits`) and
the clamp recorded. A bad task is a :class:`TaskError` for that task only.
Design notes: ``docs/decisions/039-terminal-bench.md``.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypeVar, cast

from hermes_async._json import decode_problem
from hermes_async.envs.terminalbench.files import FolderLimits, TaskError, read_text, scan_tree
from hermes_async.tools.sandbox.base import USER_NAME
from hermes_async.tools.sandbox.docker_images import dockerfile_base_images, dockerfile_lines

__all__ = (
    "BASE_IMAGE",
    "DEFAULT_BUILD_TIMEOUT_SECONDS",
    "DEFAULT_VERIFIER_TIMEOUT_SECONDS",
    "LOCAL_IMAGES",
    "SUPPORTED_SCHEMA",
    "CollectHook",
    "HarborTask",
    "NetworkMode",
    "NetworkPolicy",
    "TaskEnvironment",
    "TaskError",
    "TaskLimits",
    "dockerfile_base_images",
    "load_task",
    "network_reasons",
    "parse_size_mb",
    "parse_task_config",
)

#: The offline base image ``scripts/docker/base_image.sh`` provisions.
BASE_IMAGE = "hermes-async-base:bookworm"
#: Images that need no registry: ``FROM`` one of these builds offline.
LOCAL_IMAGES: frozenset[str] = frozenset({BASE_IMAGE})
#: Harbor's default ``[verifier].timeout_sec`` when a task omits it.
DEFAULT_VERIFIER_TIMEOUT_SECONDS = 600.0
#: Harbor's default ``[environment].build_timeout_sec``.
DEFAULT_BUILD_TIMEOUT_SECONDS = 600.0
#: The schema versions this parser was written against (later 1.x minors load too).
SUPPORTED_SCHEMA = ("1.0", "1.1", "1.2", "1.3", "1.4")


@dataclass(frozen=True, slots=True)
class TaskLimits:
    """The operator's maxima for what a task may ask for; a larger value is clamped to them.

    Defaults sit above every Terminal-Bench 2 task (at most 3600 s, 4 CPUs, 8 GB) and below
    what would let one task hold the machine for days.
    """

    agent_timeout_sec: float = 4 * 3600.0
    verifier_timeout_sec: float = 2 * 3600.0
    build_timeout_sec: float = 3600.0
    cpus: float = 16.0
    memory_mb: int = 64 * 1024
    storage_mb: int = 256 * 1024
    gpus: int = 8
    folder: FolderLimits = field(default_factory=FolderLimits)


_N = TypeVar("_N", int, float)

NetworkMode = Literal["public", "no-network", "allowlist"]
_NETWORK_MODES: tuple[NetworkMode, ...] = ("public", "no-network", "allowlist")


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """The network a phase may use.

    Attributes:
        mode: ``"public"``, ``"no-network"`` or ``"allowlist"``.
        allowed_hosts: Hostnames (lower case, no trailing dot) for ``"allowlist"``.
    """

    mode: NetworkMode = "public"
    allowed_hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CollectHook:
    """A ``[[verifier.collect]]`` hook, run before grading, best effort; None means the default."""

    command: str
    user: str | None = None
    timeout_sec: float | None = None
    service: str | None = None


@dataclass(frozen=True, slots=True)
class TaskEnvironment:
    """How the task's container is built and sized (``[environment]``); None means unspecified.

    ``build_context`` is None for a prebuilt ``docker_image`` alone; ``base_images`` are the
    ``FROM`` images (build stages excluded); ``workdir`` None means the image's WORKDIR.
    """

    build_context: Path | None
    dockerfile: Path | None
    docker_image: str | None
    base_images: tuple[str, ...] = ()
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    build_timeout_sec: float = DEFAULT_BUILD_TIMEOUT_SECONDS


@dataclass(frozen=True, slots=True)
class HarborTask:
    """One Harbor task, every schema version normalised to one shape.

    Attributes:
        name: The task id (folder name or row ``task_name``); what the name filters match.
        tags: ``[metadata].tags`` plus ``[task].keywords``.
        network: Per-phase network policy: ``environment``, ``agent``, ``verifier``.
        metadata: The raw ``[metadata]`` table, for fields this model does not name.
        network_reasons: Why the task needs the network to build or verify (empty: offline).
        clamped: One note per value cut to an operator maximum.
    """

    name: str
    path: Path
    schema_version: str
    instruction: str
    category: str
    difficulty: str | None
    tags: tuple[str, ...]
    description: str | None
    environment: TaskEnvironment
    network: Mapping[str, NetworkPolicy]
    agent_timeout_sec: float | None
    agent_user: str | None
    verifier_timeout_sec: float
    verifier_user: str | None
    verifier_env: Mapping[str, str]
    solution_env: Mapping[str, str]
    collect: tuple[CollectHook, ...]
    solution_dir: Path | None
    tests_dir: Path
    metadata: Mapping[str, object] = field(default_factory=dict)
    network_reasons: tuple[str, ...] = ()
    clamped: tuple[str, ...] = ()

    @property
    def needs_network(self) -> bool:
        """True if the task cannot build or verify offline (see :attr:`network_reasons`)."""
        return bool(self.network_reasons)

    @property
    def test_script(self) -> Path:
        """The verifier entry point on the host (``tests/test.sh``)."""
        return self.tests_dir / "test.sh"


# --------------------------------------------------------------------------- parsing helpers


class _Fields:
    """Typed reads from one TOML table, with errors naming ``section.key``."""

    def __init__(self, task: str, section: str, table: object) -> None:
        if table is None:
            table = {}
        if not isinstance(table, dict):
            raise TaskError(task, f"[{section}] must be a table, got {type(table).__name__}")
        self.task = task
        self.section = section
        self.table = cast(dict[str, object], table)

    def _bad(self, key: str, want: str, value: object) -> TaskError:
        shown = repr(value)
        if len(shown) > 80:  # a megabyte string or a 4000-digit number: its start says enough
            shown = shown[:77] + "..."
        return TaskError(
            self.task, f"{self.section}.{key} must be {want}, got {shown} in task.toml"
        )

    def has(self, key: str) -> bool:
        return self.table.get(key) is not None

    def str_(self, key: str) -> str | None:
        value = self.table.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        return value

    def user(self, key: str) -> str | None:
        # Harbor accepts a user name or a numeric uid.
        value = self.table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise self._bad(key, "a user name or uid", value)
        text = str(value).strip()
        # The sandbox's rule for a user (ExecRequest): refused here, the task is task_invalid
        # before it runs, not an infra failure at its first command.
        if text and not USER_NAME.fullmatch(text):
            raise self._bad(key, "a user name or uid (letters, digits, '_', '-', '.')", value)
        return text or None

    def number(self, key: str, *, positive: bool = True) -> float | None:
        value = self.table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(key, "a number", value)
        try:
            number = float(value)
        except OverflowError:  # an integer past a float's range: as large as inf
            number = math.inf if value > 0 else -math.inf
        # +inf is clamped to the operator's maximum like any large value; NaN means nothing.
        if math.isnan(number) or number < 0 or (positive and number == 0):
            raise self._bad(key, "a positive number" if positive else "a number >= 0", value)
        return number

    def count(self, key: str) -> int | None:
        value = self.table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._bad(key, "an integer >= 0", value)
        # Any larger count is clamped to the operator's maximum; this keeps it a float's size.
        return min(value, _MAX_COUNT)

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.table.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, "a list of strings", value)
        return tuple(cast(list[str], value))

    def env(self, key: str = "env") -> dict[str, str]:
        value = self.table.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._bad(key, "a table of strings", value)
        env: dict[str, str] = {}
        for name, item in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise self._bad(f"{key}.{name}", "a valid environment variable name", name)
            if isinstance(item, bool):
                item = "true" if item else "false"
            if not isinstance(item, str | int | float):
                raise self._bad(f"{key}.{name}", "a string", item)
            if "\0" in str(item):
                raise self._bad(f"{key}.{name}", "a string without NUL bytes", item)
            env[name] = str(item)
        return env

    def sub(self, key: str) -> _Fields:
        return _Fields(self.task, f"{self.section}.{key}", self.table.get(key))


#: Counts above this are as large as any (every maximum is far below).
_MAX_COUNT = 1 << 62

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B?)\s*$", re.IGNORECASE)
_SIZE_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024.0}


def parse_size_mb(value: str | int) -> int:
    """A size as Harbor's deprecated ``memory`` / ``storage`` spell it, in MB (``"2G"`` -> 2048).

    Units are binary, as Harbor reads them; a bare integer is MB already.

    Raises:
        ValueError: Not a size.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"size must be positive, got {value!r}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"size must be a string like '2G' or '512M', got {value!r}")
    match = _SIZE.match(value)
    if match is None or not match.group(2):
        raise ValueError(f"size must be a string like '2G' or '512M', got {value!r}")
    mb_float = float(match.group(1)) * _SIZE_MB[match.group(2).upper()]
    # "99999999999999999999G" is a very large size, clamped later, not an error.
    mb = int(min(mb_float, float(1 << 62)))
    if mb <= 0:
        raise ValueError(f"size must be at least 1 MB, got {value!r}")
    return mb


def _size(fields: _Fields, new: str, old: str) -> int | None:
    if fields.has(new):
        count = fields.count(new)
        if count == 0:
            raise fields._bad(new, "a positive integer (MB)", 0)
        return count
    raw = fields.table.get(old)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise fields._bad(old, "a size like '2G'", raw)
    try:
        return parse_size_mb(raw)
    except ValueError:
        raise fields._bad(old, f"a size like '2G' (or use {new} = <MB>)", raw) from None


def _policy(fields: _Fields, baseline: NetworkPolicy | None) -> NetworkPolicy | None:
    """A phase's explicit policy, the baseline when it has none (Harbor's resolution)."""
    raw_mode = fields.str_("network_mode")
    hosts = tuple(
        dict.fromkeys(h.strip().lower().rstrip(".") for h in fields.strings("allowed_hosts"))
    )
    hosts = tuple(h for h in hosts if h)
    for host in hosts:
        if any(c in host for c in ":/"):
            raise fields._bad("allowed_hosts", "hostnames (no URL, port or path)", host)
    if raw_mode is None and not hosts:
        return baseline
    mode = raw_mode or "allowlist"
    if mode not in _NETWORK_MODES:
        raise fields._bad("network_mode", f"one of {', '.join(_NETWORK_MODES)}", raw_mode)
    if hosts and mode != "allowlist":
        raise fields._bad("allowed_hosts", "empty unless network_mode = 'allowlist'", list(hosts))
    return NetworkPolicy(mode, hosts)


def _schema_version(task: str, data: dict[str, object]) -> str:
    raw = data.get("schema_version", data.get("version", "1.0"))
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = str(raw)
    if not isinstance(raw, str) or not re.fullmatch(r"\d+(\.\d+)*", raw.strip()):
        raise TaskError(task, f"schema_version must be a string like '1.1', got {raw!r}")
    version = raw.strip()
    if version.split(".")[0] != "1":
        raise TaskError(
            task,
            f"schema_version {version!r} is not supported (this loader reads "
            f"{SUPPORTED_SCHEMA[0]} to {SUPPORTED_SCHEMA[-1]} and later 1.x)",
        )
    return version


# What a build step or a verifier script does when it reaches for the network.
_FETCHES = (
    (re.compile(r"\b(apt-get|apt|apk|yum|dnf|microdnf)\s+(-\S+\s+)*(update|install|add)\b"), "installs OS packages"),
    (re.compile(r"\bpip3?\s+(-\S+\s+)*install\b|\bpython3?\s+-m\s+pip\s+install\b"), "pip-installs"),
    (re.compile(r"\b(uv|uvx)\b\s+(-\S+\s+)*(pip|tool|run|sync|add|-w|--with)\b|\buvx\s"), "runs uv (downloads)"),
    (re.compile(r"\b(curl|wget)\b[^|;&]*\b(https?|ftp)://"), "downloads (curl/wget)"),
    (re.compile(r"\bgit\s+(clone|fetch|pull)\b"), "fetches a git repository"),
    (re.compile(r"\b(npm|pnpm|yarn)\s+(install|i|add)\b|\bnpx\s"), "installs node packages"),
    (re.compile(r"\bcargo\s+(install|fetch|build)\b|\bgo\s+(get|install|mod\s+download)\b"), "fetches build dependencies"),
)  # fmt: skip


def _fetch_reasons(where: str, text: str, *, run_only: bool) -> list[str]:
    reasons: list[str] = []
    for line in dockerfile_lines(text):
        if run_only and not re.match(r"^\s*RUN\s", line, re.IGNORECASE):
            continue
        for pattern, what in _FETCHES:
            if pattern.search(line) and f"{where} {what}" not in reasons:
                reasons.append(f"{where} {what}")
    return reasons


def network_reasons(
    *,
    dockerfile_text: str | None,
    docker_image: str | None,
    test_sh_text: str | None,
    local_images: frozenset[str] = LOCAL_IMAGES,
) -> tuple[str, ...]:
    """Why a task needs the network at build or verify time (empty: offline is fine)."""
    reasons: list[str] = []
    if dockerfile_text is None:
        if docker_image is not None and docker_image not in local_images:
            reasons.append(f"image {docker_image!r} must be pulled from a registry")
    else:
        for image in dockerfile_base_images(dockerfile_text):
            if image not in local_images and image.lower() != "scratch":
                reasons.append(f"Dockerfile builds FROM {image!r} (pulled from a registry)")
        reasons.extend(_fetch_reasons("Dockerfile RUN", dockerfile_text, run_only=True))
    if test_sh_text is not None:
        reasons.extend(_fetch_reasons("tests/test.sh", test_sh_text, run_only=False))
    return tuple(reasons)


# --------------------------------------------------------------------------- the parser


def parse_task_config(
    name: str,
    data: Mapping[str, object],
    *,
    path: Path,
    instruction: str,
    dockerfile_text: str | None = None,
    test_sh_text: str | None = None,
    local_images: frozenset[str] = LOCAL_IMAGES,
    limits: TaskLimits | None = None,
) -> HarborTask:
    """Build a :class:`HarborTask` from a parsed ``task.toml`` (pure: no file access).

    Args:
        dockerfile_text: The Dockerfile, for base images and network flags; None: none.
        test_sh_text: ``tests/test.sh``, for network flags.

    Raises:
        TaskError: An invalid or unsupported field, naming it.
    """
    cap = limits or TaskLimits()
    clamped: list[str] = []

    def clamp(field_name: str, value: _N | None, maximum: _N) -> _N | None:
        if value is None or value <= maximum:
            return value
        clamped.append(f"{field_name} {value:g} -> {maximum:g}")
        return maximum

    top = dict(data)
    schema = _schema_version(name, top)
    if top.get("steps"):
        raise TaskError(name, "multi-step tasks ([[steps]]) are not supported yet")
    meta = _Fields(name, "metadata", top.get("metadata"))
    task_table = _Fields(name, "task", top.get("task"))
    env_t = _Fields(name, "environment", top.get("environment"))
    agent_t = _Fields(name, "agent", top.get("agent"))
    verifier_t = _Fields(name, "verifier", top.get("verifier"))
    solution_t = _Fields(name, "solution", top.get("solution"))
    if verifier_t.table.get("environment"):
        raise TaskError(
            name, "separate verifier environments ([verifier.environment]) are not supported yet"
        )

    # [environment]: deprecated spellings first, then the network baseline.
    allow = env_t.table.get("allow_internet")
    if allow is not None and not isinstance(allow, bool):
        raise env_t._bad("allow_internet", "true or false", allow)
    baseline = _policy(env_t, None) or NetworkPolicy("no-network" if allow is False else "public")
    network = {
        "environment": baseline,
        "agent": _policy(agent_t, None) or baseline,
        "verifier": _policy(verifier_t, None) or baseline,
    }
    docker_image = env_t.str_("docker_image")
    if dockerfile_text is None and docker_image is None:
        raise TaskError(
            name,
            "no environment/Dockerfile and no [environment].docker_image: the task has no image",
        )
    workdir = env_t.str_("workdir")
    if workdir is not None and (not workdir.startswith("/") or "\0" in workdir):
        raise env_t._bad("workdir", "an absolute path", workdir)
    build_context = path / "environment" if dockerfile_text is not None else None
    environment = TaskEnvironment(
        build_context=build_context,
        dockerfile=build_context / "Dockerfile" if build_context is not None else None,
        docker_image=docker_image,
        base_images=dockerfile_base_images(dockerfile_text) if dockerfile_text else (),
        cpus=clamp("environment.cpus", env_t.number("cpus"), cap.cpus),
        memory_mb=clamp(
            "environment.memory_mb", _size(env_t, "memory_mb", "memory"), cap.memory_mb
        ),
        storage_mb=clamp(
            "environment.storage_mb", _size(env_t, "storage_mb", "storage"), cap.storage_mb
        ),
        gpus=clamp("environment.gpus", env_t.count("gpus"), cap.gpus),
        workdir=workdir,
        env=env_t.env(),
        build_timeout_sec=clamp(
            "environment.build_timeout_sec",
            env_t.number("build_timeout_sec") or DEFAULT_BUILD_TIMEOUT_SECONDS,
            cap.build_timeout_sec,
        )
        or DEFAULT_BUILD_TIMEOUT_SECONDS,
    )

    collect: list[CollectHook] = []
    raw_collect = verifier_t.table.get("collect") or []
    if not isinstance(raw_collect, list):
        raise verifier_t._bad("collect", "an array of tables ([[verifier.collect]])", raw_collect)
    for i, hook in enumerate(raw_collect):
        hook_t = _Fields(name, f"verifier.collect[{i}]", hook)
        command = hook_t.str_("command")
        if not command or "\0" in command:
            raise hook_t._bad("command", "a non-empty shell command without NUL bytes", command)
        collect.append(
            CollectHook(
                command=command,
                user=hook_t.user("user"),
                timeout_sec=clamp(
                    f"verifier.collect[{i}].timeout_sec",
                    hook_t.number("timeout_sec"),
                    cap.verifier_timeout_sec,
                ),
                service=hook_t.str_("service"),
            )
        )

    category = meta.str_("category") or "uncategorized"
    difficulty = meta.str_("difficulty")
    tags = tuple(dict.fromkeys((*meta.strings("tags"), *task_table.strings("keywords"))))
    solution_dir = path / "solution"
    return HarborTask(
        name=name,
        path=path,
        schema_version=schema,
        instruction=instruction,
        category=category,
        difficulty=difficulty,
        tags=tags,
        description=task_table.str_("description"),
        environment=environment,
        network=network,
        agent_timeout_sec=clamp(
            "agent.timeout_sec", agent_t.number("timeout_sec"), cap.agent_timeout_sec
        ),
        agent_user=agent_t.user("user"),
        verifier_timeout_sec=clamp(
            "verifier.timeout_sec",
            verifier_t.number("timeout_sec") or DEFAULT_VERIFIER_TIMEOUT_SECONDS,
            cap.verifier_timeout_sec,
        )
        or DEFAULT_VERIFIER_TIMEOUT_SECONDS,
        verifier_user=verifier_t.user("user"),
        verifier_env=verifier_t.env(),
        solution_env=solution_t.env(),
        collect=tuple(collect),
        solution_dir=solution_dir,
        tests_dir=path / "tests",
        metadata=dict(meta.table),
        network_reasons=network_reasons(
            dockerfile_text=dockerfile_text,
            docker_image=docker_image,
            test_sh_text=test_sh_text,
            local_images=local_images,
        ),
        clamped=tuple(clamped),
    )


def load_task(
    path: str | Path,
    *,
    name: str | None = None,
    local_images: frozenset[str] = LOCAL_IMAGES,
    limits: TaskLimits | None = None,
) -> HarborTask:
    """Load one Harbor task folder, reading files through :mod:`.files` (bounded).

    Raises:
        TaskError: The folder is not a valid task; the message says which file or field.
    """
    folder = Path(path)
    task_name = name or folder.resolve().name
    try:
        task_name.encode("utf-8")
    except UnicodeEncodeError:  # a folder name of non-UTF-8 bytes: no row or log could hold it
        shown = task_name.encode("utf-8", "backslashreplace").decode("utf-8")
        raise TaskError(shown, "the folder name is not UTF-8; rename the folder") from None
    cap = limits or TaskLimits()
    text_bytes = cap.folder.max_text_bytes

    def text(relative: str) -> str | None:
        return read_text(task_name, folder, relative, max_bytes=text_bytes)

    toml_text = text("task.toml")
    if toml_text is None:
        raise TaskError(task_name, f"no task.toml in {folder}")
    try:
        data = tomllib.loads(toml_text)
    except (ValueError, RecursionError) as exc:
        # TOMLDecodeError, an integer of over 4300 digits (ValueError), deep nesting.
        reason = decode_problem(exc)
        raise TaskError(task_name, f"task.toml is not valid TOML: {reason[:200]}") from None
    instruction = text("instruction.md")
    if instruction is None:
        raise TaskError(task_name, "no instruction.md (the agent's prompt)")
    if not instruction.strip():
        raise TaskError(task_name, "instruction.md is empty")
    test_sh = text("tests/test.sh")
    if test_sh is None:
        raise TaskError(task_name, "no tests/test.sh (the verifier entry point)")
    env_dir = folder / "environment"
    if any(os.path.lexists(env_dir / f) for f in ("docker-compose.yaml", "docker-compose.yml")):
        raise TaskError(task_name, "docker-compose environments are not supported yet")
    dockerfile_text = text("environment/Dockerfile")
    for sub in ("tests", "environment", "solution"):
        if os.path.lexists(folder / sub):
            scan_tree(task_name, folder / sub, limits=cap.folder, what=sub)
    task = parse_task_config(
        task_name,
        data,
        path=folder,
        instruction=instruction,
        dockerfile_text=dockerfile_text,
        test_sh_text=test_sh,
        local_images=local_images,
        limits=cap,
    )
    solve = folder / "solution" / "solve.sh"
    if not os.path.lexists(solve) or text("solution/solve.sh") is None:
        # A task without an oracle still runs with a model; an oracle run of it is task_invalid.
        task = replace(task, solution_dir=None)
    return task

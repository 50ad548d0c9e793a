"""Harbor trials on the plain docker CLI (a thin shell: every decision is in :mod:`.contract`).

For validating tasks and the contract now (``scripts/terminalbench/check_tasks.py``, the
docker-marked tests); the environment runs trials on the project's Docker sandbox backend
instead. Works under asyncio and trio (``anyio.run_process``), needs only a ``docker``
binary and an engine (``DOCKER_HOST``).

* **Images** are built from the task's ``environment/`` with ``--network none`` and tagged
  ``hermes-async-task/<task>:<hash>``, where the hash covers every file of the build context
  (path, executable bit, content, link target) and the ids of the ``FROM`` images: an
  unchanged context on an unchanged base is never rebuilt; a changed one (or a re-imported
  base image) gets a new tag. Builds run behind a limiter (one at a time by default: the
  box has two cores), and concurrent requests for the same tag wait for one build.
* **Containers** run ``tail -f /dev/null`` under ``--init`` with ``--network none``, the
  task's cpus and memory (swap = memory), ``[environment.env]`` and the workdir, labelled
  ``hermes-async.terminalbench=<pid>``; they are removed (shielded, bounded) on exit.
  ``storage_mb`` is not applied (overlay2 enforces it only on xfs with project quotas).
* Every docker call has a deadline; a command's timeout stops waiting for it (the process
  in the container is ended when the container is removed).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from hermes_async._cleanup import bounded_cleanup
from hermes_async.envs.terminalbench.contract import AgentKind, ExecSpec
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.envs.terminalbench.trial import ExecResult, TrialResult, run_trial
from hermes_async.errors import ConfigError, SandboxError

__all__ = (
    "CONTAINER_LABEL",
    "DockerCli",
    "DockerCliSandbox",
    "context_digest",
    "image_tag",
    "run_tasks",
)

#: Label on every container this module starts (value: the owning process id).
CONTAINER_LABEL = "hermes-async.terminalbench"
#: Deadline of quick engine calls (inspect, run -d, cp, rm).
ENGINE_CALL_SECONDS = 60.0
#: Deadline of a container's removal (shielded).
REMOVE_SECONDS = 30.0
#: How much of a command's output an :class:`ExecResult` keeps (the tail).
MAX_EXEC_OUTPUT_BYTES = 64 * 1024


def context_digest(context: Path, base_ids: Sequence[str] = ()) -> str:
    """A hash of a build context (every path, its executable bit, content or link target)
    and of the ids of the images it builds on (a rebuilt base image means a new tag)."""
    h = hashlib.sha256()
    for base in base_ids:
        h.update(b"B" + base.encode() + b"\0")
    for path in sorted(context.rglob("*")):
        rel = path.relative_to(context).as_posix()
        if path.is_symlink():
            h.update(b"L" + rel.encode() + b"\0" + os.readlink(path).encode() + b"\0")
        elif path.is_file():
            mode = b"x" if os.access(path, os.X_OK) else b"-"
            h.update(b"F" + mode + rel.encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
        elif path.is_dir():
            h.update(b"D" + rel.encode() + b"\0")
    return h.hexdigest()[:16]


def image_tag(task: HarborTask, base_ids: Sequence[str] = ()) -> str:
    """``hermes-async-task/<name>:<digest>`` (the name made a valid repository name)."""
    context = task.environment.build_context
    if context is None:
        raise ConfigError(f"task {task.name!r} has no build context")
    name = re.sub(r"[^a-z0-9._-]+", "-", task.name.lower()).strip("._-") or "task"
    return f"hermes-async-task/{name}:{context_digest(context, base_ids)}"


class DockerCli:
    """The docker CLI, with deadlines, a build limiter and an image cache by content.

    Args:
        docker: The docker binary.
        host: An engine URL (``-H``); None: the CLI's own rule (``DOCKER_HOST``).
        build_concurrency: Image builds at once.
    """

    def __init__(
        self, docker: str = "docker", *, host: str | None = None, build_concurrency: int = 1
    ) -> None:
        self.docker = docker
        self.host = host
        self.build_limiter = anyio.CapacityLimiter(build_concurrency)
        self._build_locks: dict[str, anyio.Lock] = {}
        self.builds = 0  # images this instance built (not found cached)

    def _argv(self, args: Sequence[str]) -> list[str]:
        return [self.docker, *(("-H", self.host) if self.host else ()), *args]

    async def run(
        self, args: Sequence[str], *, timeout: float = ENGINE_CALL_SECONDS, what: str
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a docker CLI command; its failure or timeout is a :class:`SandboxError`.

        **Cancellation**: the CLI process is killed (``anyio.run_process``).
        """
        try:
            with anyio.fail_after(timeout):
                done = await anyio.run_process(
                    self._argv(args), check=False, stdin=subprocess.DEVNULL
                )
        except TimeoutError:
            raise SandboxError(f"docker {what} did not finish within {timeout:g} s") from None
        except OSError as exc:
            raise SandboxError(
                f"cannot run {self.docker!r} for {what} ({exc}); install the docker CLI"
            ) from None
        if done.returncode != 0:
            err = (done.stderr or b"").decode("utf-8", "replace").strip()[-800:]
            raise SandboxError(f"docker {what} failed (exit {done.returncode}): {err}")
        return done

    async def image_id(self, image: str) -> str | None:
        """The image's id, None when the engine does not have it.

        **Cancellation**: the CLI process is killed.
        """
        try:
            done = await self.run(
                ["image", "inspect", "--format", "{{.Id}}", image], what="image inspect"
            )
        except SandboxError:
            return None
        return done.stdout.decode().strip()

    async def image_exists(self, image: str) -> bool:
        """Whether the engine has ``image``.

        **Cancellation**: the CLI process is killed.
        """
        return await self.image_id(image) is not None

    async def image_workdir(self, image: str) -> str | None:
        """The image's ``WORKDIR`` (None if it sets none).

        **Cancellation**: the CLI process is killed.
        """
        done = await self.run(
            ["image", "inspect", "--format", "{{.Config.WorkingDir}}", image], what="image inspect"
        )
        return done.stdout.decode().strip() or None

    async def ensure_image(self, task: HarborTask) -> str:
        """The task's image: built once per build-context content, or its ``docker_image``.

        Raises:
            ConfigError: The task has no build context and its image is not on the engine
                (this runner never pulls).
            SandboxError: The build failed or ran past ``build_timeout_sec``.

        **Cancellation**: the build is stopped; a partly built image is not tagged.
        """
        env = task.environment
        if env.build_context is None:
            image = env.docker_image or ""
            if not await self.image_exists(image):
                raise ConfigError(
                    f"task {task.name!r}: image {image!r} is not on the engine and this runner "
                    "does not pull; build it or give the task an environment/Dockerfile"
                )
            return image
        # A base that is not on the engine is left to the build to report (it cannot pull).
        base_ids = [await self.image_id(base) or base for base in env.base_images]
        tag = image_tag(task, base_ids)
        lock = self._build_locks.setdefault(tag, anyio.Lock())
        async with lock:
            if await self.image_exists(tag):
                return tag
            async with self.build_limiter:
                await self.run(
                    [
                        "build",
                        "--quiet",
                        "--network",
                        "none",
                        "--label",
                        f"{CONTAINER_LABEL}.task={task.name}",
                        "-t",
                        tag,
                        "-f",
                        str(env.build_context / "Dockerfile"),
                        str(env.build_context),
                    ],
                    timeout=env.build_timeout_sec,
                    what=f"build of {tag}",
                )
                self.builds += 1
        return tag

    @asynccontextmanager
    async def open_sandbox(self, task: HarborTask, image: str) -> AsyncIterator[DockerCliSandbox]:
        """Start the task's container; remove it on exit (shielded, bounded).

        Raises:
            ConfigError: The task asks for GPUs (not supported here).
            SandboxError: The container did not start.

        **Cancellation**: the container is removed, by name, even when cancelled while it
        was being created.
        """
        env = task.environment
        if env.gpus:
            raise ConfigError(f"task {task.name!r} needs {env.gpus} GPU(s); this runner has none")
        name = (
            f"hermes-tb-{re.sub(r'[^a-zA-Z0-9_.-]+', '-', task.name)[:40]}-{uuid.uuid4().hex[:8]}"
        )
        args = [
            "run",
            "-d",
            "--init",
            "--name",
            name,
            "--network",
            "none",
            "--label",
            f"{CONTAINER_LABEL}={os.getpid()}",
            "--label",
            f"{CONTAINER_LABEL}.task={task.name}",
        ]
        if env.cpus is not None:
            args += ["--cpus", f"{env.cpus:g}"]
        if env.memory_mb is not None:
            args += ["--memory", f"{env.memory_mb}m", "--memory-swap", f"{env.memory_mb}m"]
        if env.workdir is not None:
            args += ["-w", env.workdir]
        for key, value in env.env.items():
            args += ["-e", f"{key}={value}"]
        args += [image, "tail", "-f", "/dev/null"]
        try:
            await self.run(args, what=f"run of {image}")
            workdir = await self.image_workdir(image)
            yield DockerCliSandbox(self, name, workdir)
        finally:
            await bounded_cleanup(
                f"remove container {name}",
                lambda: self.run(["rm", "-f", "-v", name], what=f"rm of {name}"),
                timeout=REMOVE_SECONDS,
                reason=f"trial of {task.name} ended",
            )


class DockerCliSandbox:
    """A running task container, as :class:`~.trial.TrialSandbox` over the docker CLI."""

    def __init__(self, cli: DockerCli, container: str, image_workdir: str | None) -> None:
        self.cli = cli
        self.container = container
        self._image_workdir = image_workdir

    @property
    def image_workdir(self) -> str | None:
        """The image's ``WORKDIR``."""
        return self._image_workdir

    async def exec(self, spec: ExecSpec) -> ExecResult:
        """Run ``spec`` with ``docker exec``; stop waiting at ``spec.timeout``.

        **Cancellation**: the CLI process is killed; the command in the container runs on
        until the container is removed.
        """
        args = ["exec"]
        if spec.user is not None:
            args += ["-u", spec.user]
        if spec.cwd is not None:
            args += ["-w", spec.cwd]
        for key, value in spec.env.items():
            args += ["-e", f"{key}={value}"]
        argv = self.cli._argv([*args, self.container, *spec.argv])
        with anyio.move_on_after(spec.timeout) as scope:
            try:
                done = await anyio.run_process(argv, check=False, stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise SandboxError(f"cannot run docker exec for {spec.what}: {exc}") from None
        if scope.cancelled_caught:
            return ExecResult(exit_code=None, timed_out=True)
        output = (done.stdout or b"") + (done.stderr or b"")
        return ExecResult(
            exit_code=done.returncode,
            output=output[-MAX_EXEC_OUTPUT_BYTES:].decode("utf-8", "replace"),
        )

    async def upload_dir(self, source: Path, target: str) -> None:
        """``docker cp source/. container:target`` (files land owned by root).

        **Cancellation**: the copy is stopped part way.
        """
        await self.cli.run(
            ["cp", f"{source}/.", f"{self.container}:{target}"], what=f"cp to {target}"
        )

    async def read_file(self, path: str, *, max_bytes: int, tail: bool = False) -> bytes | None:
        """The head (or tail) of a file in the container, read as root; None if missing.

        **Cancellation**: nothing to clean up.
        """
        tool = "tail" if tail else "head"
        script = f'test -f "$1" || exit 3; {tool} -c {int(max_bytes)} "$1"'
        argv = self.cli._argv(
            ["exec", "-u", "root", self.container, "sh", "-c", script, "sh", path]
        )
        try:
            with anyio.fail_after(ENGINE_CALL_SECONDS):
                done = await anyio.run_process(argv, check=False, stdin=subprocess.DEVNULL)
        except TimeoutError:
            raise SandboxError(
                f"reading {path} in {self.container} took more than {ENGINE_CALL_SECONDS:g} s"
            ) from None
        if done.returncode == 3:
            return None
        if done.returncode != 0:
            err = (done.stderr or b"").decode("utf-8", "replace").strip()[-500:]
            raise SandboxError(
                f"cannot read {path} in {self.container}: {err or shlex.quote(path)}"
            )
        return done.stdout[:max_bytes]


async def run_tasks(
    tasks: Sequence[HarborTask],
    *,
    agents: Sequence[AgentKind] = ("oracle", "null"),
    cli: DockerCli | None = None,
    concurrency: int = 2,
    skip: Callable[[HarborTask, AgentKind], bool] | None = None,
) -> list[TrialResult]:
    """Run every (task, agent) pair, each in a fresh container; results in input order.

    Images are built first come, first served behind ``cli``'s build limiter; at most
    ``concurrency`` containers exist at once. A task that cannot be built or started is an
    ``infra`` result, not an exception.

    **Cancellation**: every running trial is cancelled and its container removed.
    """
    cli = cli or DockerCli()
    limiter = anyio.CapacityLimiter(concurrency)
    pairs = [(t, a) for t in tasks for a in agents if skip is None or not skip(t, a)]
    results: list[TrialResult | None] = [None] * len(pairs)

    async def one(index: int, task: HarborTask, agent: AgentKind) -> None:
        started = time.monotonic()
        try:
            image = await cli.ensure_image(task)
            async with limiter, cli.open_sandbox(task, image) as sandbox:
                results[index] = await run_trial(task, sandbox, agent=agent)
        except (SandboxError, ConfigError) as exc:
            results[index] = TrialResult.infra(
                task, agent, str(exc), agent_seconds=time.monotonic() - started
            )

    async with anyio.create_task_group() as tg:
        for index, (task, agent) in enumerate(pairs):
            tg.start_soon(one, index, task, agent, name=f"trial {task.name} ({agent})")
    return [r for r in results if r is not None]

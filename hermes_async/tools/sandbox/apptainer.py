"""The singularity backend: one Apptainer (or SingularityCE) instance per rollout, via its CLI.

No extra and no SDK: every step is a bounded host process of the ``apptainer`` (or
``singularity``) executable, so it runs on asyncio and trio. A creation that fails or is
cancelled stops the instance; close stops it and its PID namespace takes every process.
Not yet run against a real Apptainer. The exact argv: docs/decisions/037-e2b-daytona-apptainer.md.
"""

from __future__ import annotations

import logging
import math
import os
import posixpath
import re
import secrets
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import anyio

from hermes_async._checks import ABSOLUTE_PATH, POSITIVE_FINITE, check_fields
from hermes_async._cleanup import cleanup_scope
from hermes_async.errors import ConfigError, SandboxError
from hermes_async.tools.sandbox._container import ContainerExec, ContainerSandbox
from hermes_async.tools.sandbox.archive import check_tar_members
from hermes_async.tools.sandbox.base import DEFAULT_OUTPUT_LIMIT_BYTES
from hermes_async.tools.sandbox.host import DirectoryRemover, run_bounded
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = (
    "DEFAULT_SINGULARITY_IMAGE",
    "ApptainerBackend",
    "ApptainerSandbox",
    "ApptainerSandboxConfig",
    "apptainer_preflight",
)

logger = logging.getLogger(__name__)

#: The reference's default (``TERMINAL_SINGULARITY_IMAGE``).
DEFAULT_SINGULARITY_IMAGE = "docker://nikolaik/python-nodejs:python3.11-nodejs20"

#: Executables tried, in order, when none is configured.
_EXECUTABLES: tuple[str, ...] = ("apptainer", "singularity")

#: Host variables the CLI itself inherits (it needs PATH and HOME for its own config).
_HOST_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG")

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
#: Exit status of ``exec`` on an instance that does not exist (any other failure of the CLI
#: itself is 255 as well, so the instance list decides).
_CLI_FAILED = 255


@dataclass(frozen=True, slots=True)
class ApptainerSandboxConfig:
    """How instances are started.

    Attributes:
        image: A local ``.sif`` path or an image URI (``docker://...``); unset:
            ``TERMINAL_SINGULARITY_IMAGE`` or :data:`DEFAULT_SINGULARITY_IMAGE`.
        executable: The CLI, on ``PATH`` or a path; unset: ``apptainer``, else ``singularity``.
        home: ``$HOME`` inside the instance (bound from the scratch directory's ``home/``).
        start_args: More ``instance start`` flags (``--net --network none``, ``--fakeroot``).
        start_timeout: Deadline of ``instance start``, a first ``docker://`` pull included.
    """

    image: str | None = None
    executable: str | None = None
    workdir: str = "/root"
    home: str = "/root"
    scratch_dir: str | None = None
    start_args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    start_timeout: float = 600.0
    stop_timeout: float = 30.0
    kill_timeout: float = 30.0
    default_exec_timeout: float = 180.0

    def __post_init__(self) -> None:
        check_fields(self, ("workdir", "home"), ABSOLUTE_PATH)
        check_fields(
            self,
            (
                "start_timeout",
                "stop_timeout",
                "kill_timeout",
                "default_exec_timeout",
            ),
            POSITIVE_FINITE,
        )
        if isinstance(self.start_args, str):
            raise ConfigError("ApptainerSandboxConfig.start_args must be a list of flags")

    @property
    def resolved_image(self) -> str:
        """The image: ``image``, else ``TERMINAL_SINGULARITY_IMAGE``, else the default."""
        return (
            self.image or os.environ.get("TERMINAL_SINGULARITY_IMAGE") or DEFAULT_SINGULARITY_IMAGE
        )


def _find_executable(configured: str | None) -> str:
    """The CLI's path.

    Raises:
        ConfigError: It is not installed (the message names the ``executable`` setting).
    """
    names = (configured,) if configured else _EXECUTABLES
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    raise ConfigError(
        f"terminal_backend='singularity' needs the {' or '.join(names)} executable, which is "
        "not on PATH: install Apptainer (https://apptainer.org/docs/admin/main/installation.html"
        ") or set sandbox_options executable=/path/to/apptainer"
    )


def _env_prefix(executable: str) -> str:
    name = posixpath.basename(executable)
    return "SINGULARITYENV_" if name.startswith("singularity") else "APPTAINERENV_"


def _cli_env(executable: str, env: Mapping[str, str]) -> dict[str, str]:
    base = {k: os.environ[k] for k in _HOST_ENV if k in os.environ}
    prefix = _env_prefix(executable)
    return {**base, **{f"{prefix}{k}": v for k, v in env.items()}}


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").strip()


class ApptainerBackend:
    """Starts :class:`ApptainerSandbox` es: the ``factory(task_id)`` a ``SandboxManager`` takes.

    Raises:
        ConfigError: The executable is not installed (checked here, before the first rollout).
    """

    def __init__(self, config: ApptainerSandboxConfig | None = None) -> None:
        self.config = config or ApptainerSandboxConfig()
        self.executable = _find_executable(self.config.executable)
        self.remover = DirectoryRemover()

    def __repr__(self) -> str:
        return f"ApptainerBackend({self.executable}, image={self.config.resolved_image!r})"

    async def __call__(self, task_id: str, spec: SandboxSpec | None = None) -> ApptainerSandbox:
        """Start the instance for ``task_id``; a spec's image, env, workdir and timeout apply.

        Raises:
            SandboxError: ``instance start`` failed or exceeded ``start_timeout``.

        **Cancellation**: ``instance stop --force`` runs and the scratch directory is removed
        (shielded, bounded) before the cancellation propagates.
        """
        cfg = self.config
        image = spec.image if spec is not None and spec.image else cfg.resolved_image
        env = {**cfg.env, **(spec.env if spec is not None else {})}
        workdir = spec.workdir if spec is not None and spec.workdir else cfg.workdir
        name = f"hermes-{_SAFE.sub('_', task_id)[:40]}-{secrets.token_hex(4)}"
        scratch = tempfile.mkdtemp(prefix=f"{name}.", dir=cfg.scratch_dir)
        os.mkdir(os.path.join(scratch, "home"))
        argv = [
            self.executable,
            "instance",
            "start",
            "--containall",
            "--cleanenv",
            "--writable-tmpfs",
            "--home",
            f"{scratch}/home:{cfg.home}",
            *cfg.start_args,
            image,
            name,
        ]
        try:
            raw = await run_bounded(
                argv,
                env=_cli_env(self.executable, {}),
                timeout=cfg.start_timeout,
                output_limit=1 << 16,
            )
            if raw.timed_out:
                raise SandboxError(
                    f"apptainer instance start of {image!r} did not finish within "
                    f"{cfg.start_timeout:g} s (a docker:// image is pulled and converted "
                    "on first use); raise start_timeout or use a local .sif",
                    task_id=task_id,
                )
            if raw.exit_code != 0:
                raise SandboxError(
                    f"apptainer instance start of {image!r} failed (exit {raw.exit_code}): "
                    f"{_text(raw.stderr or raw.stdout)[:500]!r}",
                    task_id=task_id,
                )
            sandbox = ApptainerSandbox(
                task_id,
                self,
                name,
                scratch,
                cfg,
                workdir=workdir,
                env=env,
                default_exec_timeout=(
                    spec.exec_timeout
                    if spec is not None and spec.exec_timeout
                    else cfg.default_exec_timeout
                ),
            )
            if workdir != cfg.workdir:
                made = await sandbox.exec(
                    f"mkdir -p -- {shlex.quote(workdir)}", cwd="/", timeout=30
                )
                if made.exit_code != 0:
                    raise SandboxError(
                        f"cannot create the spec's workdir {workdir!r} in the instance: "
                        f"{made.stderr.strip()[:200]}",
                        task_id=task_id,
                    )
        except BaseException:
            with cleanup_scope(
                f"stop instance {name} after a failed or cancelled start",
                cfg.stop_timeout,
                reason="sandbox creation did not complete",
                log=logger,
            ):
                await self.stop(name, force=True)
                await self.remover.remove(scratch)
            raise
        return sandbox

    async def stop(self, name: str, *, force: bool) -> bool:
        """``instance stop [--force] NAME``; whether it stopped (logged otherwise, never raises).

        **Cancellation**: the CLI's process group is killed; run it under a cleanup scope.
        """
        argv = [self.executable, "instance", "stop", *(["--force"] if force else []), name]
        try:
            raw = await run_bounded(
                argv,
                env=_cli_env(self.executable, {}),
                timeout=self.config.stop_timeout,
                output_limit=1 << 16,
            )
        except OSError as exc:
            logger.warning("could not run %s: %s", argv[:3], exc)
            return False
        if raw.exit_code != 0:
            logger.debug("instance stop %s: exit %d: %s", name, raw.exit_code, _text(raw.stderr))
        return raw.exit_code == 0


class ApptainerSandbox(ContainerSandbox):
    """One rollout's Apptainer instance. Start it with :class:`ApptainerBackend`.

    Attributes:
        name: The instance's name (``instance://NAME``).
        scratch: Its scratch directory on this host.
    """

    kind = "Apptainer"

    def __init__(
        self,
        task_id: str,
        backend: ApptainerBackend,
        name: str,
        scratch: str,
        config: ApptainerSandboxConfig,
        *,
        workdir: str,
        env: Mapping[str, str],
        default_exec_timeout: float,
    ) -> None:
        super().__init__(
            task_id,
            workdir,
            home=config.home,
            default_exec_timeout=default_exec_timeout,
            kill_timeout=config.kill_timeout,
            close_timeout=config.stop_timeout,
        )
        self.name = name
        self.scratch = scratch
        self.config = config
        self.env = dict(env)
        self._backend = backend

    def __repr__(self) -> str:
        return f"ApptainerSandbox({self.task_id!r}, instance://{self.name})"

    @property
    def label(self) -> str:
        """``instance://NAME``."""
        return f"instance://{self.name}"

    async def _run_argv(self, run: ContainerExec) -> int:
        executable = self._backend.executable
        argv = [executable, "--quiet", "exec", "--cleanenv", self.label, *run.argv]
        env = {"HOME": self.home, **self.env, **(run.env or {})}
        backstop = run.limit + self.kill_timeout if math.isfinite(run.limit) else 1e9
        raw = await run_bounded(
            argv,
            env=_cli_env(executable, env),
            timeout=backstop,
            output_limit=DEFAULT_OUTPUT_LIMIT_BYTES,
            stdout_sink=run.write_out,
        )
        run.err.feed(raw.stderr)
        if raw.exit_code == _CLI_FAILED and not await self._instance_alive():
            raise self._mark_gone(f"instance {self.name} is no longer running", reason="exited")
        return raw.exit_code

    async def _instance_alive(self) -> bool:
        raw = await run_bounded(
            [self._backend.executable, "instance", "list", self.name],
            env=_cli_env(self._backend.executable, {}),
            timeout=self.kill_timeout,
            output_limit=1 << 16,
        )
        return raw.exit_code == 0 and self.name in raw.stdout.decode(errors="replace")

    async def _stage_file(self, path: str, data: bytes) -> None:
        await self._upload('mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', path, data)

    async def _upload(self, script: str, path: str, data: bytes) -> None:
        executable = self._backend.executable
        argv = [executable, "--quiet", "exec", "--cleanenv", self.label]
        argv += ["/bin/sh", "-c", script, "sh", path]
        raw = await run_bounded(
            argv,
            env=_cli_env(executable, {"HOME": self.home}),
            timeout=self.config.stop_timeout + self.kill_timeout,
            stdin=data,
            output_limit=1 << 16,
        )
        if raw.timed_out or raw.exit_code != 0:
            raise OSError(
                f"cannot write {path!r} in the instance (exit {raw.exit_code}): "
                f"{_text(raw.stderr)[:300]}"
            )

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        """Check, then extract a tar archive into ``dest_dir`` (a ``tar`` in the instance).

        **Cancellation**: the archive may be partly extracted.
        """
        self._check_open()
        check_tar_members(tar_data)
        await self._upload(
            'mkdir -p -- "$1" && tar -x --no-same-owner -f - -C "$1"',
            self._resolve(dest_dir),
            tar_data,
        )

    async def aclose(self, interrupted: bool = False) -> None:
        """Stop the instance (``--force`` when ``interrupted``) and remove the scratch. Idempotent.

        **Cancellation**: each step is bounded; the owner of the release shields them.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if not await self._backend.stop(self.name, force=interrupted):
                logger.warning("instance %s may still be running (instance stop failed)", self.name)
        finally:
            await self._backend.remover.remove(self.scratch)


async def apptainer_preflight(**options: object) -> None:
    """Check the CLI is installed and answers ``--version`` (bounded, 30 s).

    Raises:
        ConfigError: The executable is missing, or an invalid option.
        SandboxError: It does not run.
    """
    config = ApptainerSandboxConfig(**options)  # type: ignore[arg-type]
    executable = _find_executable(config.executable)
    with anyio.fail_after(35):
        raw = await run_bounded(
            [executable, "--version"], env=_cli_env(executable, {}), timeout=30, output_limit=4096
        )
    if raw.exit_code != 0:
        raise SandboxError(
            f"terminal_backend='singularity': `{executable} --version` failed (exit "
            f"{raw.exit_code}): {_text(raw.stderr)[:300]}; check the executable setting"
        )

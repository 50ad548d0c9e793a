"""A Harbor task on the project's sandboxes: its :class:`SandboxSpec`, and trials over any Sandbox.

* :func:`task_sandbox_spec` — what a task's ``[environment]`` asks for, as the per-item
  :class:`~hermes_async.tools.sandbox.spec.SandboxSpec` the manager creates the task's sandbox
  from: the image built from ``environment/`` (or its ``docker_image``), cpus, memory,
  storage, network (off unless allowed; then ``no-network`` is ``"none"`` and anything else
  ``"bridge"``: an allowlist is not enforceable in a plain container), workdir,
  ``[environment.env]``, and the build deadline. The container runs as root: the contract's
  bookkeeping steps need it, and each command runs as its phase's user.
* :class:`SandboxTrial` — :class:`~.trial.TrialSandbox` over a project
  :class:`~hermes_async.tools.sandbox.base.Sandbox` (the very sandbox the model used), so the
  verifier contract of :mod:`.trial` runs unchanged on the Docker, Modal or a fake backend.
  A command with a user runs through ``runuser -u USER --`` (util-linux, in Debian's base).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hermes_async.envs.terminalbench.contract import ExecSpec
from hermes_async.envs.terminalbench.task import HarborTask
from hermes_async.envs.terminalbench.trial import ExecResult
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.archive import directory_tar
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.spec import SandboxSpec

__all__ = ("SandboxTrial", "task_sandbox_spec")

#: How much of a command's output an :class:`ExecResult` keeps (per stream, head + tail).
MAX_EXEC_OUTPUT_BYTES = 64 * 1024
#: Deadline of reading a file back (``head``/``tail`` in the container).
READ_SECONDS = 60.0


def task_sandbox_spec(task: HarborTask, *, allow_network: bool = False) -> SandboxSpec:
    """The task's :class:`SandboxSpec` (see the module docs).

    Args:
        task: The task.
        allow_network: Give the container the network when the task's ``[environment]``
            policy allows it (default off: the project's rule, and the bundled tasks run
            offline; tasks flagged in ``network_reasons`` need it).
    """
    env = task.environment
    policy = task.network.get("environment")
    network = allow_network and (policy is None or policy.mode != "no-network")
    return SandboxSpec(
        image=env.docker_image if env.build_context is None else None,
        build_context=env.build_context,
        build_timeout=env.build_timeout_sec,
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        storage_mb=env.storage_mb,
        network_mode="bridge" if network else "none",
        workdir=env.workdir,
        env=dict(env.env),
        labels={"hermes-async.terminalbench.task": task.name},
    )


class SandboxTrial:
    """A project sandbox as the :class:`~.trial.TrialSandbox` a trial runs on.

    Args:
        sandbox: The task's sandbox (a ``ManagedSandbox`` from the run's manager).
    """

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    @property
    def image_workdir(self) -> str | None:
        """The sandbox's workdir: the task's, else the image's ``WORKDIR`` (the backend's)."""
        return self.sandbox.workdir

    async def exec(self, spec: ExecSpec) -> ExecResult:
        """Run ``spec`` (as its user, in its cwd, with its env) bounded by ``spec.timeout``.

        **Cancellation**: the sandbox kills the command's process group.
        """
        argv = list(spec.argv)
        if spec.user is not None and spec.user not in ("root", "0"):
            argv = ["runuser", "-u", spec.user, "--", *argv]
        result = await self.sandbox.exec(
            shlex.join(argv),
            cwd=spec.cwd,
            env=dict(spec.env) or None,
            timeout=spec.timeout,
            output_limit=MAX_EXEC_OUTPUT_BYTES,
        )
        if result.timed_out:
            return ExecResult(exit_code=None, timed_out=True, output=result.output)
        return ExecResult(exit_code=result.exit_code, output=result.output)

    async def upload_dir(self, source: Path, target: str) -> None:
        """Copy the contents of ``source`` into ``target`` (the archive API; owned by root).

        **Cancellation**: the copy may be left partial.
        """
        await self.sandbox.put_archive(target, directory_tar(source, prefix="./"))

    async def read_file(self, path: str, *, max_bytes: int, tail: bool = False) -> bytes | None:
        """The file's first (``tail``: last) ``max_bytes`` bytes, None when it does not exist.

        Read with ``head``/``tail`` as root, so a large file never crosses in full.

        **Cancellation**: the read is abandoned.
        """
        tool = "tail" if tail else "head"
        script = (
            f"test -f {shlex.quote(path)} || exit 3; {tool} -c {int(max_bytes)} {shlex.quote(path)}"
        )
        result = await self.sandbox.exec(
            script, timeout=READ_SECONDS, output_limit=max(max_bytes, 1024)
        )
        if result.exit_code == 3 and not result.stdout:
            return None
        if result.timed_out or result.exit_code != 0:
            raise SandboxError(
                f"cannot read {path} in the task's sandbox (exit {result.exit_code}): "
                f"{result.stderr.strip()[-300:]}"
            )
        return result.stdout.encode("utf-8")[:max_bytes]

"""Archive transfers through a file staged in the sandbox (Modal, E2B, Daytona).

Their file APIs move whole files, not streams: ``put_archive`` uploads the tar and extracts it
with ``tar`` in the sandbox; ``get_archive`` builds one there and downloads it.
"""

from __future__ import annotations

import logging
import uuid
from abc import abstractmethod

from hermes_async._cleanup import bounded_cleanup
from hermes_async.tools.sandbox._container import MISSING_EXIT, ContainerSandbox
from hermes_async.tools.sandbox.archive import check_tar_members
from hermes_async.tools.sandbox.base import small_int

__all__ = ("StagedTransferSandbox",)

logger = logging.getLogger("hermes_async.tools.sandbox")


class StagedTransferSandbox(ContainerSandbox):
    """A container sandbox whose archives travel as whole files staged in the sandbox.

    A backend implements :meth:`_sh` (a short helper script) and :meth:`_read` (one
    whole-file download) besides the :class:`ContainerSandbox` hooks. A staged archive is
    removed in a cleanup bounded by :attr:`kill_timeout`.
    """

    @abstractmethod
    async def _sh(self, script: str, *args: str) -> tuple[int, str, str]:
        """Run ``sh -c script sh args...`` to completion; (exit code, stdout, stderr) stripped."""

    @abstractmethod
    async def _read(self, path: str) -> bytes:
        """Download the absolute ``path`` whole."""

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        """Validate, upload and extract a tar archive into ``dest_dir`` (created if missing).

        **Cancellation**: the archive may be partly extracted; the staged tar is removed (bounded).
        """
        self._check_open()
        check_tar_members(tar_data)
        dest = self._resolve(dest_dir)
        staged = f"{self.exec_dir}/{uuid.uuid4().hex}.tar"
        removed = False  # the script below removes the staged tar itself once it has run
        try:
            await self._stage_file(staged, tar_data)
            code, _, err = await self._sh(
                'mkdir -p -- "$1" && tar -x -f "$2" -C "$1"; rc=$?; rm -f "$2"; exit $rc',
                dest,
                staged,
            )
            removed = True
        finally:
            if not removed and not self._closed and self._gone is None:
                await self._remove_staged(staged)
        if code != 0:
            raise OSError(f"cannot extract archive into {dest_dir!r}: {err}")

    async def _archive(self, path: str) -> tuple[str, int]:
        """Build the tar of ``path`` in the sandbox: (its staged path, its size or -1)."""
        source = self._resolve(path)
        staged = f"{self.exec_dir}/{uuid.uuid4().hex}.tar"
        code, out, err = await self._sh(
            f'[ -e "$1" ] || exit {MISSING_EXIT}; mkdir -p -- "$(dirname -- "$2")" || exit 1; '
            'if [ -d "$1" ]; then tar -c -f "$2" -C "$1" .; '
            'else tar -c -f "$2" -C "$(dirname -- "$1")" -- "$(basename -- "$1")"; fi; '
            'rc=$?; [ $rc -eq 0 ] && wc -c < "$2"; exit $rc',
            source,
            staged,
        )
        if code == MISSING_EXIT:
            raise FileNotFoundError(f"no such file or directory in the sandbox: {path!r}")
        if code != 0:
            raise OSError(f"cannot archive {path!r}: {err}")
        size = small_int(out)
        return staged, -1 if size is None or size < 0 else size

    async def _remove_staged(self, staged: str) -> None:
        await bounded_cleanup(
            f"remove the staged archive {staged} in {self.kind} sandbox {self.label}",
            lambda: self._sh('rm -f -- "$1"', staged),
            timeout=self.kill_timeout,
            log=logger,
        )

    async def get_archive(self, path: str) -> bytes:
        """Return a tar archive of ``path`` (directory members ``./x``; a file by its basename).

        Raises:
            FileNotFoundError: ``path`` does not exist.

        **Cancellation**: the staged archive is removed (bounded).
        """
        self._check_open()
        staged, _ = await self._archive(path)
        try:
            return await self._read(staged)
        finally:
            await self._remove_staged(staged)

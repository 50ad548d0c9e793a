"""Files between a sandbox and the host: streamed to disk, capped, extracted safely.

Downloads stream chunk by chunk into a host process that writes them, so host memory holds one
chunk. A cap (:data:`DEFAULT_TRANSFER_LIMIT_BYTES`, 1 GiB) refuses or stops a transfer and
leaves nothing partial. Trees are checked member by member before anything is written.
Every host-side read or write is a subprocess: no threads, no blocking file I/O on the loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import secrets
import subprocess
import sys
from dataclasses import dataclass

import anyio
from anyio.abc import Process

from hermes_async._cleanup import cleanup_scope
from hermes_async.tools.sandbox import archive
from hermes_async.tools.sandbox.base import Sandbox
from hermes_async.tools.sandbox.errors import TransferLimitError
from hermes_async.tools.sandbox.host import run_bounded, start_process
from hermes_async.tools.sandbox.output import OutputCapture

__all__ = (
    "DEFAULT_TRANSFER_LIMIT_BYTES",
    "DownloadedFile",
    "download_dir",
    "download_file",
    "pack_host_tree",
    "read_host_dir_archive",
    "read_host_file",
)

logger = logging.getLogger(__name__)

#: Largest file or archive one transfer moves (1 GiB): past it the transfer stops with
#: :class:`~hermes_async.tools.sandbox.errors.TransferLimitError`.
DEFAULT_TRANSFER_LIMIT_BYTES = 1 << 30

#: Deadline of the host-side process of one transfer (``cat``, ``tar``, the extractor).
_HOST_TRANSFER_TIMEOUT_SECONDS = 600.0

#: Bound of killing and reaping a host-side writer that is abandoned.
_ABORT_SECONDS = 10.0

#: Most bytes of the extractor's report (one JSON line per file) that are kept.
_REPORT_LIMIT_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class DownloadedFile:
    """One regular file a download wrote on the host."""

    path: str
    size: int


class _HostWriter:
    """A host process fed a stream on stdin; ``send`` waits on a full pipe (back-pressure)."""

    def __init__(self, proc: Process, what: str) -> None:
        self.proc = proc
        self.what = what
        self.out = OutputCapture(_REPORT_LIMIT_BYTES)
        self.err = OutputCapture(1 << 16)

    @classmethod
    async def open(cls, argv: list[str], what: str) -> _HostWriter:
        proc = await start_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        return cls(proc, what)

    async def send(self, chunk: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            await self.proc.stdin.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            # It exited early (e.g. the host disk is full): report what it said.
            await self._collect()
            raise OSError(f"{self.what} stopped: {self._stderr() or 'it exited'}") from exc

    def _stderr(self) -> str:
        return self.err.value().decode("utf-8", "replace").strip()[:1000]

    async def _collect(self) -> int:
        """Close stdin, read both outputs to the end, return the exit code (bounded)."""
        assert self.proc.stdin is not None
        with anyio.fail_after(_HOST_TRANSFER_TIMEOUT_SECONDS):
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self.proc.stdin.aclose()
            async with anyio.create_task_group() as tg:
                for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
                    tg.start_soon(_read_all, stream, sink)
            return await self.proc.wait()

    async def finish(self) -> int:
        """Close stdin and wait for the exit; return the exit code (the process is reaped)."""
        try:
            return await self._collect()
        finally:
            await self.abort()

    async def abort(self) -> None:
        """Kill it (if still running) and reap it: shielded, bounded, never raising."""
        with cleanup_scope(f"stop the host side of {self.what}", _ABORT_SECONDS, log=logger):
            if self.proc.returncode is None:
                self.proc.kill()
            await self.proc.aclose()


async def _read_all(stream: anyio.abc.ByteReceiveStream | None, sink: OutputCapture) -> None:
    if stream is None:
        return
    try:
        while True:
            sink.feed(await stream.receive(1 << 16))
    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass


async def _host_sh(script: str, *args: str) -> tuple[int, str]:
    raw = await run_bounded(
        ["/bin/sh", "-c", script, "sh", *args],
        timeout=_HOST_TRANSFER_TIMEOUT_SECONDS,
        output_limit=1 << 16,
    )
    return raw.exit_code, raw.stderr.decode("utf-8", "replace").strip()


async def download_file(
    sandbox: Sandbox,
    remote_path: str,
    local_path: str,
    *,
    max_bytes: int = DEFAULT_TRANSFER_LIMIT_BYTES,
) -> int:
    """Stream sandbox file ``remote_path`` to host file ``local_path``; return its size.

    The bytes go to ``<local_path>.hermes-part-<hex>`` and are renamed into place when complete.

    Raises:
        FileNotFoundError: ``remote_path`` is not a regular file in the sandbox.
        TransferLimitError: It is larger than ``max_bytes``.
        OSError: The host file cannot be written.
        SandboxError: The sandbox failed.

    **Cancellation**: the sandbox's ``cat`` and the host writer are killed, the partial file
    removed (shielded, bounded).
    """
    part = f"{local_path}.hermes-part-{secrets.token_hex(6)}"
    writer = await _HostWriter.open(
        ["/bin/sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"', "sh", part],
        f"the download of {remote_path!r}",
    )
    done = False
    try:
        size = await sandbox.stream_file(remote_path, writer.send, max_bytes=max_bytes)
        code = await writer.finish()
        if code != 0:
            raise OSError(f"cannot write {local_path!r}: {writer._stderr() or f'exit {code}'}")
        code, err = await _host_sh('exec mv -f -- "$1" "$2"', part, local_path)
        if code != 0:
            raise OSError(f"cannot write {local_path!r}: {err}")
        done = True
        return size
    finally:
        if not done:
            await writer.abort()
            with cleanup_scope("remove a partial download", _ABORT_SECONDS, log=logger):
                await _host_sh('rm -f -- "$1"', part)


async def download_dir(
    sandbox: Sandbox,
    remote_dir: str,
    local_dir: str,
    *,
    max_bytes: int = DEFAULT_TRANSFER_LIMIT_BYTES,
) -> list[DownloadedFile]:
    """Stream a tar of ``remote_dir`` into the archive extractor; return the files written.

    The extractor checks every member and extracts with the ``data`` filter into a fresh
    directory, then moves it into place.

    Raises:
        FileNotFoundError: ``remote_dir`` does not exist in the sandbox.
        TransferLimitError: The archive is larger than ``max_bytes``.
        ValueError: The archive has an unsafe member (nothing was written).

    **Cancellation**: the ``tar`` and the extractor are killed; a kill mid-extraction can leave
    a hidden ``.hermes-*`` directory next to ``local_dir``.
    """
    workdir = posixpath.join(
        posixpath.dirname(posixpath.abspath(local_dir)), f".hermes-download-{secrets.token_hex(6)}"
    )
    writer = await _HostWriter.open(
        [
            sys.executable,
            "-I",
            "-S",
            archive.__file__,
            "extract",
            local_dir,
            str(max_bytes),
            workdir,
        ],
        f"the download of {remote_dir!r}",
    )
    code = -1
    try:
        try:
            await sandbox.stream_archive(remote_dir, writer.send, max_bytes=max_bytes)
        except TransferLimitError:
            raise
        except OSError:
            # The extractor stopped reading: past its own cap (a backend that ignored ours)?
            if writer.proc.returncode == archive.EXIT_TOO_LARGE:
                code = archive.EXIT_TOO_LARGE
                raise TransferLimitError(f"archive of {remote_dir!r}", limit=max_bytes) from None
            raise
        code = await writer.finish()
    finally:
        await writer.abort()
        if code == -1:  # killed mid-way: its spool and staging directory are ours to remove
            with cleanup_scope("remove a partial download", _ABORT_SECONDS, log=logger):
                await _host_sh('rm -rf -- "$1"', workdir)
    detail = writer._stderr()
    if code == archive.EXIT_REFUSED:
        raise ValueError(f"refused the archive of {remote_dir!r}: {detail}")
    if code == archive.EXIT_TOO_LARGE:
        raise TransferLimitError(f"archive of {remote_dir!r}", limit=max_bytes)
    if code != 0:
        raise OSError(f"cannot extract into {local_dir!r}: {detail or f'exit {code}'}")
    files = []
    for line in writer.out.value().decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # the cut of a report over its limit: the files are written all the same
        if isinstance(item, list):
            files.append(DownloadedFile(posixpath.join(local_dir, item[0]), int(item[1])))
    if writer.out.truncated:
        logger.warning(
            "the download of %r listed only %d of its files (the report passed %d bytes)",
            remote_dir,
            len(files),
            _REPORT_LIMIT_BYTES,
        )
    return files


async def read_host_file(path: str, *, max_bytes: int = DEFAULT_TRANSFER_LIMIT_BYTES) -> bytes:
    """The bytes of host file ``path`` (through ``cat``), at most ``max_bytes``.

    **Cancellation**: the ``cat`` is killed.
    """
    return await _read_host(
        '[ -f "$1" ] || exit 66; exec cat -- "$1"', path, max_bytes, "file", "read"
    )


async def read_host_dir_archive(
    path: str, *, max_bytes: int = DEFAULT_TRANSFER_LIMIT_BYTES
) -> bytes:
    """A tar of host directory ``path`` (members ``./x``), setuid/setgid bits stripped.

    **Cancellation**: the ``tar`` is killed.
    """
    return await _read_host(
        '[ -d "$1" ] || exit 66; exec tar -c --mode=a-s -f - -C "$1" .',
        path,
        max_bytes,
        "directory",
        "archive",
    )


async def pack_host_tree(
    source: str,
    dest: str,
    *,
    max_bytes: int = DEFAULT_TRANSFER_LIMIT_BYTES,
    gzip: bool = False,
    replace_file: tuple[str, str] | None = None,
) -> int:
    """Write a tar of host directory ``source`` to host file ``dest``; return its size.

    Links stay links, setuid/setgid bits are stripped. ``replace_file`` = ``(name, folder)``
    takes the top-level file ``name`` from ``folder`` (a rewritten Dockerfile).

    Raises:
        FileNotFoundError: ``source`` is not a directory.
        TransferLimitError: The archive is larger than ``max_bytes`` (``dest`` is removed).
        OSError: ``tar`` failed.

    **Cancellation**: the ``tar`` is killed.
    """
    flags = "-cz" if gzip else "-c"
    script = f'[ -d "$1" ] || exit 66; exec tar {flags} --mode=a-s -f "$2" -C "$1"'
    args = ["sh", source, dest]
    if replace_file is not None:
        script += ' --exclude="./$3" . -C "$4" "$3"'
        args += list(replace_file)
    else:
        script += " ."
    raw = await run_bounded(
        ["/bin/sh", "-c", script, *args], timeout=_HOST_TRANSFER_TIMEOUT_SECONDS
    )
    if raw.exit_code == 66:
        raise FileNotFoundError(f"Local directory not found: {source}")
    if raw.exit_code != 0:
        detail = raw.stderr.decode("utf-8", "replace").strip()[:500]
        raise OSError(f"Cannot archive {source}: {detail}")
    size = os.stat(dest).st_size
    if size > max_bytes:
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise TransferLimitError(f"archive of local directory {source!r}", limit=max_bytes)
    return size


async def _read_host(script: str, path: str, max_bytes: int, kind: str, verb: str) -> bytes:
    """Run ``script`` on the host and return its stdout, at most ``max_bytes``."""
    raw = await run_bounded(
        ["/bin/sh", "-c", script, "sh", path],
        timeout=_HOST_TRANSFER_TIMEOUT_SECONDS,
        output_limit=max_bytes + 1,
    )
    if raw.exit_code == 66:
        raise FileNotFoundError(f"Local {kind} not found: {path}")
    if raw.truncated or len(raw.stdout) > max_bytes:
        raise TransferLimitError(f"local {kind} {path!r}", limit=max_bytes)
    if raw.exit_code != 0:
        detail = raw.stderr.decode("utf-8", "replace").strip()[:500]
        raise OSError(f"Cannot {verb} {path}: {detail}")
    return raw.stdout

"""A conformance suite every sandbox backend runs (local, Docker, Modal, yours).

Each check in :data:`CONFORMANCE_CHECKS` is an ``async (sandbox) -> None`` that raises
``AssertionError``; give each a fresh sandbox and close it after, or call
:func:`run_conformance`. The sandbox needs ``sh``, ``bash``, ``tar``, ``setsid``,
``mkfifo``, ``head`` and ``sleep`` (any Debian/Ubuntu image).
"""

from __future__ import annotations

import io
import secrets
import tarfile
from collections.abc import Awaitable, Callable, Iterable, Mapping

import anyio

from hermes_async._cleanup import cleanup_scope
from hermes_async.errors import SandboxError
from hermes_async.tools.sandbox.archive import pack_files
from hermes_async.tools.sandbox.base import (
    BACKGROUND_LOG_LIMIT_BYTES,
    TIMEOUT_EXIT_CODE,
    BackgroundStatus,
    Sandbox,
)
from hermes_async.tools.sandbox.errors import TransferLimitError

__all__ = (
    "CONFORMANCE_CHECKS",
    "ConformanceCheck",
    "check_archive_keeps_in_tree_links",
    "check_archive_rejects_traversal",
    "check_archive_rejects_unsafe_members",
    "check_archive_roundtrip",
    "check_background_lifecycle",
    "check_background_log_is_bounded",
    "check_background_stdin",
    "check_exec_cwd_and_env",
    "check_exec_output_and_exit_code",
    "check_exec_output_is_bounded",
    "check_exec_stdin",
    "check_exec_timeout_kills_group",
    "check_exec_undecodable_bytes",
    "check_files_roundtrip",
    "check_home_is_inside",
    "check_interrupted_close_is_final",
    "check_read_missing_raises",
    "check_stream_file_and_archive",
    "check_stream_sink_error_stops_the_transfer",
    "make_tar",
    "run_conformance",
)

#: One check: gets an open sandbox, raises ``AssertionError`` on a violation.
ConformanceCheck = Callable[[Sandbox], Awaitable[None]]


def make_tar(members: Mapping[str, bytes]) -> bytes:
    """A tar archive of regular files (names used verbatim, so ``../x`` makes a hostile one)."""
    return pack_files(members)


async def check_exec_output_and_exit_code(sb: Sandbox) -> None:
    """stdout, stderr and the exit code come back separately."""
    r = await sb.exec("echo out; echo err >&2; exit 3")
    assert r.stdout == "out\n", r
    assert r.stderr == "err\n", r
    assert r.exit_code == 3 and not r.timed_out, r


async def check_exec_stdin(sb: Sandbox) -> None:
    """``stdin`` bytes reach the command and are closed afterwards."""
    r = await sb.exec("wc -c", stdin=b"x" * 100_000)
    assert r.exit_code == 0 and r.stdout.strip() == "100000", r


async def check_exec_cwd_and_env(sb: Sandbox) -> None:
    """``cwd`` and extra ``env`` apply; the default cwd is ``workdir``."""
    r = await sb.exec("pwd")
    assert r.stdout.strip() == sb.workdir.rstrip("/") or sb.workdir == "/", (r, sb.workdir)
    await sb.exec("mkdir -p sub")
    r = await sb.exec("pwd; echo $GREETING", cwd="sub", env={"GREETING": "hi there"})
    lines = r.stdout.splitlines()
    assert lines[0].endswith("/sub") and lines[1] == "hi there", r
    r = await sb.exec("pwd", cwd="does-not-exist")
    assert r.exit_code != 0, r


async def check_exec_timeout_kills_group(sb: Sandbox) -> None:
    """A timeout kills the whole process group, ``&`` children included: exit 124."""
    n = f"{secrets.randbelow(10**6) + 10**6}"  # a sleep length no other process uses
    start = anyio.current_time()
    r = await sb.exec(f"sleep {n} & sleep {n}", timeout=1)
    assert r.exit_code == TIMEOUT_EXIT_CODE and r.timed_out, r
    assert anyio.current_time() - start < 30
    count = (
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
        f" | grep -c '^sleep {n} *$' || true"
    )
    r = await sb.exec(count)
    assert r.stdout.strip() == "0", f"'sleep {n}' survived the timeout: {r}"


async def check_exec_output_is_bounded(sb: Sandbox) -> None:
    """Huge output is cut to head + tail within ``output_limit`` and flagged."""
    r = await sb.exec("head -c 5000000 /dev/zero | tr '\\0' a; echo END", output_limit=10_000)
    assert r.exit_code == 0 and r.truncated, (r.exit_code, r.truncated)
    assert len(r.stdout) < 12_000, len(r.stdout)
    assert r.stdout.startswith("aaa") and r.stdout.rstrip().endswith("END"), r.stdout[-50:]


async def check_exec_undecodable_bytes(sb: Sandbox) -> None:
    """Invalid UTF-8 is replaced, never an exception."""
    r = await sb.exec("printf 'ok \\377\\376 done'")
    assert r.exit_code == 0 and r.stdout.startswith("ok ") and r.stdout.endswith(" done"), r
    assert "\ufffd" in r.stdout, r


async def check_home_is_inside(sb: Sandbox) -> None:
    """``~`` is writable and readable through the file API."""
    r = await sb.exec("echo hello > ~/greeting.txt && cat ~/greeting.txt && echo $HOME")
    assert r.exit_code == 0 and r.stdout.startswith("hello\n"), r
    home = r.stdout.splitlines()[1]
    assert await sb.read_bytes(f"{home}/greeting.txt") == b"hello\n"


async def check_files_roundtrip(sb: Sandbox) -> None:
    """Bytes written come back identical; parents are created; odd names work."""
    payload = bytes(range(256)) * 64
    name = "d ir/sub/fïle 'q\".bin"
    await sb.write_bytes(name, payload)
    assert await sb.read_bytes(name) == payload
    await sb.write_bytes("empty", b"")
    assert await sb.read_bytes("empty") == b""
    r = await sb.exec("ls 'd ir/sub'")
    assert "fïle" in r.stdout, r


async def check_read_missing_raises(sb: Sandbox) -> None:
    """Reading a missing file (or a directory) raises ``FileNotFoundError``."""
    for path in ("nope.txt", "."):
        try:
            await sb.read_bytes(path)
        except FileNotFoundError:
            continue
        raise AssertionError(f"read_bytes({path!r}) did not raise FileNotFoundError")


async def check_archive_roundtrip(sb: Sandbox) -> None:
    """``put_archive`` then ``get_archive`` returns the same files, empty ones included."""
    files = {"a.txt": b"alpha", "dir/b.bin": bytes(range(256)), "dir/empty": b""}
    await sb.put_archive("arch", make_tar(files))
    data = await sb.get_archive("arch")
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        got = {
            m.name.removeprefix("./"): (tf.extractfile(m) or io.BytesIO()).read()
            for m in tf.getmembers()
            if m.isfile()
        }
    assert got == files, got
    single = await sb.get_archive("arch/a.txt")
    with tarfile.open(fileobj=io.BytesIO(single)) as tf:
        assert [m.name for m in tf.getmembers()] == ["a.txt"]
    try:
        await sb.get_archive("missing-dir")
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("get_archive of a missing path did not raise FileNotFoundError")


async def check_archive_rejects_traversal(sb: Sandbox) -> None:
    """Archives with ``..`` or absolute members are refused with ``ValueError``."""
    for hostile in ({"../escape.txt": b"x"}, {"/abs.txt": b"x"}, {"ok/../../x": b"x"}):
        try:
            await sb.put_archive("dest", make_tar(hostile))
        except ValueError:
            continue
        raise AssertionError(f"put_archive accepted {list(hostile)}")
    r = await sb.exec("ls escape.txt ../escape.txt 2>/dev/null | wc -l")
    assert r.stdout.strip() == "0", r


def _hostile_tar(kind: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:

        def add(name: str, **fields: object) -> None:
            info = tarfile.TarInfo(name)
            for key, value in fields.items():
                setattr(info, key, value)
            data = b"pwned" if info.type == tarfile.REGTYPE else b""
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data else None)

        if kind == "chain":  # each link passes a lexical check; together they escape
            add("x", type=tarfile.SYMTYPE, linkname=".")
            add("esc", type=tarfile.SYMTYPE, linkname="x/..")
            add("esc/escaped.txt")
        elif kind == "dotdot-link":  # leaves the tree (an in-tree one, ../sub, is kept)
            add("sub", type=tarfile.DIRTYPE, mode=0o755)
            add("sub/up", type=tarfile.SYMTYPE, linkname="../../sub")
        elif kind == "absolute-link":
            add("etc", type=tarfile.SYMTYPE, linkname="/etc")
        elif kind == "hardlink-out":
            add("h", type=tarfile.LNKTYPE, linkname="../../etc/passwd")
        elif kind == "setuid":
            add("suid", mode=0o4755)
        elif kind == "device":
            add("null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
    return buf.getvalue()


async def check_archive_rejects_unsafe_members(sb: Sandbox) -> None:
    """Link chains, links with ``..`` or absolute targets, setuid files and devices are refused
    before anything is written."""
    for kind in ("chain", "dotdot-link", "absolute-link", "hardlink-out", "setuid", "device"):
        try:
            await sb.put_archive("unsafe-dest", _hostile_tar(kind))
        except ValueError:
            continue
        raise AssertionError(f"put_archive accepted the {kind!r} archive")
    r = await sb.exec("ls -A unsafe-dest 2>/dev/null | wc -l; ls escaped.txt 2>/dev/null | wc -l")
    assert r.stdout.split() == ["0", "0"], r


async def check_archive_keeps_in_tree_links(sb: Sandbox) -> None:
    """A relative link with ``..`` that stays inside the tree (``dd/x -> ..``) is extracted."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kind, target in (("dd", tarfile.DIRTYPE, ""), ("dd/x", tarfile.SYMTYPE, "..")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, target, 0o755
            tf.addfile(info)
    await sb.put_archive("intree-dest", buf.getvalue())
    r = await sb.exec("readlink intree-dest/dd/x")
    assert r.stdout.strip() == "..", r


async def check_stream_file_and_archive(sb: Sandbox) -> None:
    """``stream_file`` / ``stream_archive`` deliver chunks, stop at ``max_bytes``, miss with ``FileNotFoundError``."""
    payload = bytes(range(256)) * 1024
    await sb.write_bytes("stream/blob.bin", payload)
    got = bytearray()

    async def sink(chunk: bytes) -> None:
        got.extend(chunk)

    assert await sb.stream_file("stream/blob.bin", sink) == len(payload)
    assert bytes(got) == payload
    for path in ("stream/missing.bin", "stream"):
        try:
            await sb.stream_file(path, sink)
        except FileNotFoundError:
            continue
        raise AssertionError(f"stream_file({path!r}) did not raise FileNotFoundError")
    for stream in (sb.stream_file, sb.stream_archive):
        try:
            await stream(
                "stream/blob.bin" if stream == sb.stream_file else "stream", sink, max_bytes=1000
            )
        except TransferLimitError:
            continue
        raise AssertionError(f"{stream.__name__} with max_bytes=1000 did not stop")
    got.clear()
    size = await sb.stream_archive("stream", sink)
    assert size == len(got) > len(payload), (size, len(got))
    with tarfile.open(fileobj=io.BytesIO(bytes(got))) as tf:
        files = {
            m.name.removeprefix("./"): (tf.extractfile(m) or io.BytesIO()).read()
            for m in tf.getmembers()
            if m.isfile()
        }
    assert files == {"blob.bin": payload}, list(files)


class _SinkStop(Exception):
    """What the check's sink raises: it must come back out of the stream, unwrapped."""


async def check_stream_sink_error_stops_the_transfer(sb: Sandbox) -> None:
    """A raising sink ends the stream at once with its own exception; the sandbox stays usable.

    Even while the command has more to send than a pipe holds: a backend that waited for the
    command to end would wait for the transfer's deadline instead.
    """
    r = await sb.exec("mkdir -p sinkstop && head -c 16000000 /dev/zero > sinkstop/big.bin")
    assert r.exit_code == 0, r

    async def sink(chunk: bytes) -> None:
        raise _SinkStop(len(chunk))

    for stream, path in ((sb.stream_file, "sinkstop/big.bin"), (sb.stream_archive, "sinkstop")):
        with anyio.fail_after(30):
            try:
                await stream(path, sink)
            except _SinkStop:
                pass
            else:
                raise AssertionError(f"{stream.__name__}: the sink's exception did not come out")
    r = await sb.exec("rm -rf sinkstop; echo ok")
    assert r.stdout == "ok\n", r


async def check_background_log_is_bounded(sb: Sandbox) -> None:
    """Endless background output costs a bounded log on disk; the model is told the start was
    dropped (a marker, ``dropped_bytes``) and still sees the end."""
    total = 3 * BACKGROUND_LOG_LIMIT_BYTES
    proc = await sb.start_background(f"head -c {total} /dev/zero | tr '\\0' y; echo; echo END")
    status = await _wait_exit(sb, proc.session_id, timeout=120)
    assert status.exit_code == 0, status.exit_code
    assert status.dropped_bytes > 0, status.dropped_bytes
    assert "bytes of earlier output dropped" in status.output.splitlines()[0], status.output[:200]
    assert status.output.rstrip().endswith("END"), status.output[-100:]
    r = await sb.exec(f"cat {proc.state_dir}/log* | wc -c")
    kept = int(r.stdout.strip() or -1)
    assert 0 < kept <= BACKGROUND_LOG_LIMIT_BYTES, kept
    assert kept + status.dropped_bytes == total + len("\nEND\n"), (kept, status.dropped_bytes)


async def _wait_exit(sb: Sandbox, session_id: str, *, timeout: float = 20) -> BackgroundStatus:
    with anyio.fail_after(timeout):
        while True:
            status = await sb.background_status(session_id)
            if not status.running:
                return status
            await anyio.sleep(0.05)


async def check_background_lifecycle(sb: Sandbox) -> None:
    """A background process runs detached, reports output and exit code, and can be killed."""
    proc = await sb.start_background("echo started; sleep 0.3; echo finished; exit 7")
    assert proc.session_id.startswith("proc_") and proc.pid, proc
    status = await _wait_exit(sb, proc.session_id)
    assert status.exit_code == 7, status
    assert "started\nfinished" in status.output, status
    long = await sb.start_background("sleep 1000")
    assert (await sb.background_status(long.session_id)).running
    assert await sb.kill_background(long.session_id) is True
    status = await sb.background_status(long.session_id)
    assert not status.running, status
    assert await sb.kill_background(long.session_id) is False


async def check_background_stdin(sb: Sandbox) -> None:
    """Writes reach the process's stdin; closing stdin delivers end-of-file."""
    proc = await sb.start_background("cat; echo EOF-SEEN")
    assert await sb.write_background_stdin(proc.session_id, b"line one\n") == 9
    await sb.close_background_stdin(proc.session_id)
    status = await _wait_exit(sb, proc.session_id)
    assert status.output == "line one\nEOF-SEEN\n", status
    assert status.exit_code == 0


async def check_interrupted_close_is_final(sb: Sandbox) -> None:
    """``aclose(interrupted=True)`` closes at once, even with a running (TERM-ignoring) process;
    afterwards every operation raises ``SandboxError`` and ``aclose()`` is a no-op."""
    await sb.start_background("trap '' TERM; sleep 1000")
    with anyio.fail_after(30):
        await sb.aclose(interrupted=True)
    for operation in (lambda: sb.exec("true"), lambda: sb.start_background("true")):
        try:
            await operation()
        except SandboxError:
            continue
        raise AssertionError("an operation on a closed sandbox did not raise SandboxError")
    with anyio.fail_after(5):
        await sb.aclose()  # idempotent


#: Every check, by name.
CONFORMANCE_CHECKS: dict[str, ConformanceCheck] = {
    "exec_output_and_exit_code": check_exec_output_and_exit_code,
    "exec_stdin": check_exec_stdin,
    "exec_cwd_and_env": check_exec_cwd_and_env,
    "exec_timeout_kills_group": check_exec_timeout_kills_group,
    "exec_output_is_bounded": check_exec_output_is_bounded,
    "exec_undecodable_bytes": check_exec_undecodable_bytes,
    "home_is_inside": check_home_is_inside,
    "files_roundtrip": check_files_roundtrip,
    "read_missing_raises": check_read_missing_raises,
    "archive_roundtrip": check_archive_roundtrip,
    "archive_rejects_traversal": check_archive_rejects_traversal,
    "archive_rejects_unsafe_members": check_archive_rejects_unsafe_members,
    "archive_keeps_in_tree_links": check_archive_keeps_in_tree_links,
    "stream_file_and_archive": check_stream_file_and_archive,
    "stream_sink_error_stops_the_transfer": check_stream_sink_error_stops_the_transfer,
    "background_lifecycle": check_background_lifecycle,
    "background_stdin": check_background_stdin,
    "background_log_is_bounded": check_background_log_is_bounded,
    "interrupted_close_is_final": check_interrupted_close_is_final,
}


async def run_conformance(
    factory: Callable[[str], Awaitable[Sandbox]],
    names: Iterable[str] | None = None,
    *,
    close_timeout: float = 30.0,
) -> dict[str, str | None]:
    """Run checks (all by default), each on a fresh sandbox; return ``name -> failure or None``.

    A close that fails raises; one that overruns ``close_timeout`` is logged and abandoned.

    **Cancellation**: the running check's sandbox is closed (shielded, bounded, interrupted).
    """
    results: dict[str, str | None] = {}
    for name in names or CONFORMANCE_CHECKS:
        check = CONFORMANCE_CHECKS[name]
        sandbox = await factory(f"conformance-{name}")
        interrupted = True
        try:
            await check(sandbox)
            results[name] = None
            interrupted = False
        except AssertionError as exc:
            results[name] = str(exc) or repr(exc)
            interrupted = False
        finally:
            with cleanup_scope(
                f"close the sandbox of conformance check {name}",
                close_timeout,
                reason="the check ended" if not interrupted else "the check was interrupted",
            ):
                await sandbox.aclose(interrupted=interrupted)
    return results

"""Transfers between sandbox and host: streamed, capped, extracted safely (issue #15, item 3-4).

Downloads go through ``ToolContext`` (the reward function's API) on a real namespaced local
sandbox, and through a sandbox double whose archive stream is crafted byte by byte (what a
compromised backend could send).
"""

from __future__ import annotations

import io
import os
import pathlib
import resource
import tarfile
from collections.abc import AsyncIterator

import anyio
import pytest

from hermes_async.agent.context import ToolContext
from hermes_async.testing.fake_sandbox import FakeSandbox
from hermes_async.tools.sandbox.base import ByteSink
from hermes_async.tools.sandbox.errors import TransferLimitError
from hermes_async.tools.sandbox.local import local_factory
from hermes_async.tools.sandbox.manager import SandboxManager
from hermes_async.tools.sandbox.namespaces import NamespaceOptions, namespace_support
from hermes_async.tools.sandbox.transfer import (
    DEFAULT_TRANSFER_LIMIT_BYTES,
    download_dir,
    download_file,
)

pytestmark = pytest.mark.anyio

#: Namespaced where they work (always under HERMES_ASYNC_REQUIRE_ISOLATION=1: then a machine
#: without them fails here); else the same checks in process mode.
ISOLATION = (
    "namespaces"
    if namespace_support() is None or os.environ.get("HERMES_ASYNC_REQUIRE_ISOLATION") == "1"
    else "process"
)
PAGE = resource.getpagesize()


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE


class RssSampler:
    """The largest resident set size seen while the block runs (sampled every 10 ms)."""

    def __init__(self) -> None:
        self.before = rss_bytes()
        self.peak = self.before

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        while True:
            self.peak = max(self.peak, rss_bytes())
            await anyio.sleep(0.01)

    @property
    def growth(self) -> int:
        return self.peak - self.before


@pytest.fixture
async def manager(tmp_path: pathlib.Path) -> AsyncIterator[SandboxManager]:
    root = tmp_path / "sandboxes"
    root.mkdir()
    factory = local_factory(
        str(root), isolation=ISOLATION, namespace=NamespaceOptions(disk_limit_mb=256)
    )
    async with SandboxManager(factory, idle_timeout=None) as m:
        yield m
    assert list(root.iterdir()) == []


@pytest.mark.parametrize(
    "tree_cap",
    [
        pytest.param(128 << 20, id="128MiB"),
        pytest.param(DEFAULT_TRANSFER_LIMIT_BYTES, id="default", marks=pytest.mark.slow),
    ],
)
async def test_five_gib_sparse_file_costs_no_host_memory(
    manager: SandboxManager, tmp_path: pathlib.Path, tree_cap: int
) -> None:
    """Acceptance: a 5 GiB sparse file is refused with the size error, host RSS grows < 50 MB,
    both for a file (size known: refused before a byte moves) and inside a directory (the tar
    stream is cut at the cap: 128 MiB here, the 1 GiB default with --run-slow)."""
    ctx = ToolContext("big", manager=manager)
    made = await ctx.terminal("mkdir -p big && truncate -s 5G big/sparse.bin && ls -l big")
    assert made["exit_code"] == 0, made
    out = tmp_path / "out"
    sampler = RssSampler()
    async with anyio.create_task_group() as tg:
        await tg.start(sampler.run)
        single = await ctx.download_file("big/sparse.bin", str(out / "sparse.bin"))
        start = anyio.current_time()
        tree = await ctx.download_dir("big", str(out / "tree"), max_bytes=tree_cap)
        streamed = anyio.current_time() - start
        tg.cancel_scope.cancel("measured")
    print(
        f"5 GiB sparse: file refused up front, dir stream cut at the cap after {streamed:.1f}s; "
        f"host RSS grew {sampler.growth / 1e6:.1f} MB"
    )
    assert single["success"] is False
    assert "5,368,709,120 bytes" in str(single["error"])
    assert f"the cap is {DEFAULT_TRANSFER_LIMIT_BYTES:,} bytes" in str(single["error"])
    assert tree[0]["success"] is False and "too large to transfer" in str(tree[0]["error"]), tree
    assert sampler.growth < 50e6, sampler.growth
    assert list(out.rglob("*")) == []  # nothing partial, no spool left (only the parent made)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "sandboxes"]


async def test_downloads_stream_intact_and_replace_only_when_complete(
    manager: SandboxManager, tmp_path: pathlib.Path
) -> None:
    ctx = ToolContext("dl", manager=manager)
    r = await ctx.terminal(
        "mkdir -p d/sub && head -c 3000000 /dev/urandom > d/blob.bin && "
        "printf 'x' > d/sub/one && ln -s blob.bin d/link && cp d/blob.bin d/sub/copy"
    )
    assert r["exit_code"] == 0, r
    remote = bytes.fromhex(
        str((await ctx.terminal("head -c 64 d/blob.bin | od -An -tx1 | tr -d ' \\n'"))["output"])
    )
    dest = tmp_path / "host" / "blob.bin"
    got = await ctx.download_file("d/blob.bin", str(dest))
    assert got == {"success": True, "bytes": 3_000_000}
    data = dest.read_bytes()
    assert len(data) == 3_000_000 and data[:64] == remote
    # Over the cap: refused, and the old file stays as it was.
    refused = await ctx.download_file("d/blob.bin", str(dest), max_bytes=1_000_000)
    assert refused["success"] is False and "too large" in str(refused["error"])
    assert dest.read_bytes() == data
    assert sorted(p.name for p in dest.parent.iterdir()) == ["blob.bin"]  # no .hermes-part-*
    files = await ctx.download_dir("d", str(tmp_path / "tree"))
    assert sorted((f["path"], f["bytes"]) for f in files) == [
        (str(tmp_path / "tree" / "blob.bin"), 3_000_000),
        (str(tmp_path / "tree" / "sub" / "copy"), 3_000_000),
        (str(tmp_path / "tree" / "sub" / "one"), 1),
    ]
    assert os.readlink(tmp_path / "tree" / "link") == "blob.bin"
    assert (tmp_path / "tree" / "sub" / "copy").read_bytes() == data
    # Cancelled mid-stream (once its partial file exists): no partial file is left. (A fixed
    # 0.3 s cancel was a race: on a fast moment the whole file had arrived by then.)
    big = tmp_path / "host" / "cancelled.bin"
    await ctx.terminal("head -c 300000000 /dev/zero > huge.bin")

    def partial() -> bool:
        return any(".hermes-part-" in p.name for p in big.parent.iterdir())

    async def download() -> None:
        await ctx.download_file("huge.bin", str(big))

    async with anyio.create_task_group() as tg:
        tg.start_soon(download)
        with anyio.fail_after(30):
            while not partial():
                await anyio.sleep(0.001)
        tg.cancel_scope.cancel()
    assert sorted(p.name for p in big.parent.iterdir()) == ["blob.bin"]


async def test_hostile_trees_made_in_the_sandbox_are_refused(
    manager: SandboxManager, tmp_path: pathlib.Path
) -> None:
    """What a model can build with its own shell: the x -> . / esc -> x/.. chain, a link out,
    a setuid file. Each download is refused and writes nothing, outside or inside."""
    ctx = ToolContext("hostile", manager=manager)
    cases = {
        "chain": "mkdir chain && (cd chain && ln -s . x && ln -s x/.. esc && echo hi > ok)",
        "out": "mkdir out && ln -s /etc/passwd out/passwd",
        "setuid": "mkdir setuid && echo x > setuid/f && chmod 4755 setuid/f",
    }
    for name, script in cases.items():
        made = await ctx.terminal(script)
        assert made["exit_code"] == 0, made
        area = tmp_path / name
        area.mkdir()
        result = await ctx.download_dir(name, str(area / "dest"))
        assert result[0]["success"] is False and "refus" in str(result[0]["error"]), result
        assert list(area.iterdir()) == [], name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain", "out", "sandboxes", "setuid"]


class CraftedArchive(FakeSandbox):
    """A sandbox whose ``stream_archive`` sends whatever bytes the test crafted."""

    def __init__(self, data: bytes) -> None:
        super().__init__("crafted")
        self.data = data

    async def stream_archive(
        self, path: str, sink: ByteSink, *, max_bytes: int | None = None
    ) -> int:
        for i in range(0, len(self.data), 1000):
            await sink(self.data[i : i + 1000])
        return len(self.data)


def _tar(*members: tuple[str, bytes, dict[str, object]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data, fields in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for key, value in fields.items():
                setattr(info, key, value)
            tf.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buf.getvalue()


@pytest.mark.parametrize(
    "data",
    [
        _tar(
            ("x", b"", {"type": tarfile.SYMTYPE, "linkname": "."}),
            ("esc", b"", {"type": tarfile.SYMTYPE, "linkname": "x/.."}),
            ("esc/pwned.txt", b"pwned", {}),
        ),
        _tar(("../pwned.txt", b"pwned", {})),
        _tar(("/tmp/pwned.txt", b"pwned", {})),
        _tar(("l", b"", {"type": tarfile.SYMTYPE, "linkname": "/etc"}), ("l/x", b"p", {})),
        _tar(("h", b"", {"type": tarfile.LNKTYPE, "linkname": "../../etc/passwd"})),
        _tar(("ok.txt", b"fine", {}), ("suid", b"#!/bin/sh\n", {"mode": 0o4755})),
        _tar(("ok.txt", b"fine", {}), ("zero", b"", {"type": tarfile.CHRTYPE, "devmajor": 1})),
        b"this is not a tar archive at all" * 100,
    ],
    ids=["chain", "dotdot", "absolute", "absolute-link", "hardlink", "setuid", "device", "junk"],
)
async def test_crafted_archive_streams_are_refused_before_any_write(
    tmp_path: pathlib.Path, data: bytes
) -> None:
    area = tmp_path / "area"
    area.mkdir()
    with pytest.raises(ValueError, match="refused the archive"):
        await download_dir(CraftedArchive(data), "d", str(area / "dest"))
    assert list(area.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["area"]


async def test_the_cap_holds_even_if_a_backend_ignores_it(tmp_path: pathlib.Path) -> None:
    data = _tar(("big.bin", b"\0" * 200_000, {}))
    with pytest.raises(TransferLimitError, match="too large to transfer"):
        await download_dir(CraftedArchive(data), "d", str(tmp_path / "dest"), max_bytes=50_000)
    assert list(tmp_path.iterdir()) == []
    fake = FakeSandbox(files={"f.bin": b"x" * 5000})
    with pytest.raises(TransferLimitError, match="it is 5,000 bytes, the cap is 100 bytes"):
        await download_file(fake, "f.bin", str(tmp_path / "f.bin"), max_bytes=100)
    assert list(tmp_path.iterdir()) == []


async def test_uploads_strip_setuid_and_refuse_links_out(
    manager: SandboxManager, tmp_path: pathlib.Path
) -> None:
    ctx = ToolContext("up", manager=manager)
    src = tmp_path / "src"
    (src / "bin").mkdir(parents=True)
    tool = src / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho tool\n")
    tool.chmod(0o4755)
    files = await ctx.upload_dir(str(src), "uploaded")
    assert [f["path"] for f in files] == ["uploaded/bin/tool"], files
    mode = await ctx.terminal("stat -c %a uploaded/bin/tool")
    assert mode["output"] == "755\n", mode
    (src / "escape").symlink_to("/etc")
    refused = await ctx.upload_dir(str(src), "again")
    assert refused[0]["exit_code"] == -1 and "absolute path '/etc'" in str(refused[0]["output"])
    too_big = await ctx.upload_file(str(tool), "t", max_bytes=4)
    assert too_big["exit_code"] == -1 and "too large" in str(too_big["output"])


async def test_a_file_report_over_its_limit_still_lists_what_it_kept(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Many files with long names make the extractor's report (a JSON line per file) pass its
    # limit; the cut through the middle once raised a JSON error although every file was written.
    from hermes_async.tools.sandbox import transfer

    monkeypatch.setattr(transfer, "_REPORT_LIMIT_BYTES", 400)
    names = [f"{i:03d}-" + "n" * 60 for i in range(40)]
    data = _tar(*((name, b"x", {}) for name in names))
    files = await download_dir(CraftedArchive(data), "d", str(tmp_path / "dest"))
    assert 0 < len(files) < len(names)
    assert {f.size for f in files} == {1}
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == names

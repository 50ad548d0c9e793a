"""The Sandbox ABC: exec as a template over one ExecRequest hook, async-with as a release owner."""

from __future__ import annotations

import math

import anyio
import pytest

from hermes_async.errors import SandboxError
from hermes_async.testing.fake_sandbox import FakeSandbox, FakeSandboxFactory
from hermes_async.tools.sandbox.base import (
    DEFAULT_OUTPUT_LIMIT_BYTES,
    ExecRequest,
    Sandbox,
    resolve_path,
    small_int,
)
from hermes_async.tools.sandbox.manager import SandboxManager

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]


def test_exec_request_validates_and_normalises() -> None:
    r = ExecRequest("ls", cwd="", env={}, timeout=-3)
    assert (r.cwd, r.env, r.timeout, r.output_limit) == (
        None,
        None,
        0.0,
        DEFAULT_OUTPUT_LIMIT_BYTES,
    )
    env = {"A": "1"}
    r = ExecRequest("ls", env=env)
    env["A"] = "changed"
    assert r.env == {"A": "1"}  # a copy
    with pytest.raises(TypeError):
        r.env["B"] = "2"  # type: ignore[index]  # read-only
    with pytest.raises(ValueError, match=r"invalid environment variable name\(s\): \['A=B'\]"):
        ExecRequest("ls", env={"A=B": "x"})
    with pytest.raises(ValueError, match="invalid environment variable"):
        ExecRequest("ls", env={"": "x"})
    with pytest.raises(ValueError, match=r"value\(s\) with a NUL byte: \['A'\]"):
        ExecRequest("ls", env={"A": "a\0b"})
    with pytest.raises(ValueError, match="NaN"):
        ExecRequest("ls", timeout=math.nan)
    with pytest.raises(ValueError, match="output_limit must be >= 0 bytes, got -1"):
        ExecRequest("ls", output_limit=-1)
    with pytest.raises(ValueError, match="NUL"):
        ExecRequest("a\0b")
    with pytest.raises(ValueError, match="cwd contains a NUL"):
        ExecRequest("ls", cwd="a\0")
    with pytest.raises(TypeError, match="command must be a string, got bytes"):
        ExecRequest(b"ls")  # type: ignore[arg-type]


def test_resolve_path() -> None:
    assert resolve_path("/w", "a/../b", "/h") == "/w/b"
    assert resolve_path("/w", "/abs", "/h") == "/abs"
    assert resolve_path("/w", "~", "/h") == "/h"
    assert resolve_path("/w", "~/x", "/h") == "/h/x"
    with pytest.raises(ValueError, match="invalid sandbox path"):
        resolve_path("/w", "", "/h")


async def test_exec_builds_one_request_for_the_hook() -> None:
    fake = FakeSandbox(exec_script={"*": "ok"})
    result = await fake.exec("run", cwd="sub", env={"K": "v"}, timeout=5, stdin=b"in")
    assert result.stdout == "ok"
    (call,) = fake.calls
    assert call == ExecRequest("run", cwd="sub", env={"K": "v"}, timeout=5.0, stdin=b"in")
    with pytest.raises(ValueError, match="invalid environment variable"):
        await fake.exec("run", env={"A=B": "x"})
    assert len(fake.calls) == 1  # validation happens before the backend sees anything


def test_a_backend_without_the_hook_is_abstract() -> None:
    class Incomplete(Sandbox):
        async def read_bytes(self, path: str) -> bytes:
            return b""

        async def write_bytes(self, path: str, data: bytes) -> None:
            return None

        async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
            return None

        async def get_archive(self, path: str) -> bytes:
            return b""

        async def aclose(self, interrupted: bool = False) -> None:
            return None

    with pytest.raises(TypeError, match="exec_request"):
        Incomplete()  # type: ignore[abstract]


async def test_async_with_owns_the_release_shielded_and_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed = anyio.Event()

    class SlowClose(FakeSandbox):
        async def aclose(self, interrupted: bool = False) -> None:
            await anyio.sleep(0.05)
            await super().aclose(interrupted)
            closed.set()

    slow = SlowClose()
    with anyio.CancelScope() as scope:
        async with slow:
            scope.cancel("test: the block is cancelled")
            await anyio.sleep(1)
    assert closed.is_set() and slow.closes == [True]  # closed despite the cancellation
    async with FakeSandbox() as plain:
        pass
    assert plain.closes == [False]

    class Hang(FakeSandbox):
        async def aclose(self, interrupted: bool = False) -> None:
            await anyio.sleep_forever()

    hang = Hang()
    hang.close_timeout = 0.1
    start = anyio.current_time()
    with pytest.raises(RuntimeError, match="boom"):
        async with hang:
            raise RuntimeError("boom")
    assert anyio.current_time() - start < 5
    assert "cleanup overran its deadline and was abandoned: close the sandbox of 'fake'" in (
        caplog.text
    )


async def test_managed_sandbox_async_with_releases_through_the_manager() -> None:
    factory = FakeSandboxFactory()
    async with SandboxManager(factory) as manager:
        with pytest.raises(RuntimeError):
            async with await manager.get("t"):
                raise RuntimeError("rollout failed")
        assert "t" not in manager
        assert factory.created[0].closes == [True]
        sb = await manager.get("u")
        await sb.aclose()
        assert factory.created[1].closes == [False]
        with pytest.raises(SandboxError, match="was released"):
            await sb.exec("x")


@pytest.mark.parametrize(
    ("text", "number"),
    [("42", 42), (" 7\n", 7), ("-1", -1), ("\u00b2", None), ("\u0663", None), ("9" * 19, None),
     ("", None), ("1e3", None), ("+5", None)],
)  # fmt: skip
def test_a_number_from_the_sandbox_is_short_ascii_or_none(text: str, number: int | None) -> None:
    # int() refuses "²" (isdigit() takes it) and takes "٣" (Arabic three): neither is a number
    # a sandbox's `stat` or `echo $$` prints.
    assert small_int(text) == number

"""A container as a dict of files, for the contract: it recognises the contract's commands and
plays their effects (``solve`` / ``test`` callbacks for the scripts), so trials and passes run
on asyncio and trio without Docker."""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from hermes_async.tools.sandbox.base import ExecRequest, ExecResult, Sandbox

Files = dict[str, bytes]
Script = Callable[[Files, ExecRequest], int]


def run_test_sh(files: Files, request: ExecRequest) -> int:
    """Play an uploaded ``/tests/test.sh`` made of ``printf '%s' 'X' > PATH`` / ``echo X > PATH``
    lines (what the hostile-task generator and the helpers write); ``sleep infinity`` hangs."""
    script = files.get("/tests/test.sh", b"").decode()
    for line in script.splitlines():
        printed = re.fullmatch(r"printf '%s' '(.*)' > (\S+)", line.strip())
        echoed = re.fullmatch(r"echo (.*) > (\S+)", line.strip())
        if printed:
            files[printed.group(2)] = printed.group(1).replace("'\"'\"'", "'").encode()
        elif echoed:
            files[echoed.group(2)] = echoed.group(1).encode() + b"\n"
    return 0


def _what(command: str) -> str:
    if command.startswith("mkdir -p /logs/agent"):
        return "create /logs"
    if command.startswith("rm -rf /solution"):
        return "empty /solution"
    if command.startswith("chmod -R a+rX"):
        return "chmod " + command.split()[-1]
    if "bash /solution/solve.sh" in command:
        return "solution/solve.sh"
    if "bash /tests/test.sh" in command:
        return "tests/test.sh"
    if "rm -rf /tests /logs/verifier" in command:
        return "empty /tests and /logs/verifier"
    if command.startswith("test -f "):
        return "read"
    if command.startswith("du -sb"):
        return "du"
    return command


@dataclass(eq=False)
class ContractSandbox(Sandbox):
    """See the module docstring. ``hang`` / ``fail``: step names that time out / exit 1."""

    solve: Script = lambda files, request: 0
    test: Script = run_test_sh
    hang: set[str] = field(default_factory=set)
    fail: set[str] = field(default_factory=set)
    files: Files = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    requests: dict[str, ExecRequest] = field(default_factory=dict)
    workdir: str = "/app"
    task_id: str = "contract"
    closed: bool = False
    close_timeout: float | None = 5.0

    @property
    def switches_users(self) -> bool:
        return True

    def _drop(self, *prefixes: str) -> None:
        for name in list(self.files):
            if name.startswith(prefixes):
                del self.files[name]

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        await anyio.lowlevel.checkpoint()
        what = _what(request.command)
        if what != "read":
            self.log.append(what)
        self.requests[what] = request
        if what in self.hang or (
            what == "tests/test.sh" and b"sleep infinity" in self.files.get("/tests/test.sh", b"")
        ):
            # The sandbox's timeout, played at once (the real backends' is tested with them).
            return ExecResult("", "", 124, timed_out=True)
        if what in self.fail:
            return ExecResult("", "boom", 1)
        if what == "empty /solution":
            self._drop("/solution/")
        elif what == "empty /tests and /logs/verifier":
            self._drop("/tests/", "/logs/verifier/")
        elif what == "solution/solve.sh":
            return ExecResult("", "", self.solve(self.files, request))
        elif what == "tests/test.sh":
            self.files["/logs/verifier/test-stdout.txt"] = b"ran the tests\n"
            return ExecResult("", "", self.test(self.files, request))
        elif what == "read":
            path = request.command.split()[-1]
            data = self.files.get(path)
            if data is None:
                return ExecResult("", "", 3)
            return ExecResult(data.decode("utf-8", "replace"), "", 0)
        elif what == "du":
            return ExecResult("10\n", "", 0)
        return ExecResult("", "", 0)

    async def put_tree(self, dest_dir: str, source: Path) -> None:
        await anyio.lowlevel.checkpoint()
        self.log.append(f"upload {dest_dir}")
        for path in sorted(source.rglob("*")):
            if path.is_file() and not path.is_symlink():
                self.files[f"{dest_dir}/{path.relative_to(source).as_posix()}"] = path.read_bytes()

    async def read_bytes(self, path: str) -> bytes:
        return self.files[path]

    async def write_bytes(self, path: str, data: bytes) -> None:
        self.files[path] = data

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        raise NotImplementedError

    async def get_archive(self, path: str) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in self.files.items():
                if name.startswith(path + "/"):
                    info = tarfile.TarInfo("./" + name[len(path) + 1 :])
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    async def aclose(self, interrupted: bool = False) -> None:
        self.closed = True

"""The file tools end to end: dispatch -> handler -> shell commands in a real LocalSandbox."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from hermes_async.errors import SandboxError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools._search import SearchRequest, build_search_script
from hermes_async.tools.files import MAX_READ_CHARS, TOOLS
from hermes_async.tools.registry import ToolRegistry, ToolRuntime, builtin_registry, dispatch
from hermes_async.tools.sandbox.base import ExecRequest, ExecResult, Sandbox
from hermes_async.tools.sandbox.local import LocalSandbox

pytestmark = pytest.mark.anyio

# Paths with spaces, quotes, unicode, shell metacharacters and a colon.
ODD_DIR = "dir with 'quotes' \"and\" spaces $HOME `x` ü"
ODD_FILE = f"{ODD_DIR}/naïve: file;.txt"


class Provider:
    def __init__(self, sandbox: Sandbox | None = None, error: Exception | None = None) -> None:
        self.sandbox, self.error = sandbox, error

    async def get(self, task_id: str) -> Sandbox:
        if self.error is not None:
            raise self.error
        assert self.sandbox is not None
        return self.sandbox


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[LocalSandbox]:
    sbx = await LocalSandbox.create(
        "files-test", root_dir=str(tmp_path), isolation="process"
    )  # the tests read the files from the host; namespaced runs: test_file_paths_resolve
    try:
        yield sbx
    finally:
        await sbx.aclose()


@pytest.fixture
def runtime(sandbox: LocalSandbox) -> ToolRuntime:
    return ToolRuntime("files-test", sandboxes=Provider(sandbox))


def work(sandbox: LocalSandbox, rel: str) -> Path:
    return Path(sandbox.workdir) / rel


async def call(runtime: ToolRuntime, name: str, **args: object) -> JSONObject:
    out = await dispatch(name, json.dumps(args), runtime)
    value = json.loads(out.content)  # every result is valid JSON
    assert isinstance(value, dict)
    return value


# --------------------------------------------------------------------------------------------
# Schemas


def test_schemas_match_the_reference() -> None:
    by_name = {t.name: t for t in TOOLS}
    assert list(by_name) == ["read_file", "write_file", "patch", "search_files"]
    assert all(t.toolset == "file" for t in TOOLS)
    assert all(t.name in builtin_registry() for t in TOOLS)

    def shape(name: str) -> dict[str, object]:
        params = by_name[name].parameters
        props = {
            k: {f: v[f] for f in ("type", "default", "enum", "minimum", "maximum") if f in v}
            for k, v in params["properties"].items()
        }
        return {"required": params["required"], "properties": props}

    assert shape("read_file") == {
        "required": ["path"],
        "properties": {
            "path": {"type": "string"},
            "offset": {"type": "integer", "default": 1, "minimum": 1},
            "limit": {"type": "integer", "default": 500, "maximum": 2000},
        },
    }
    assert shape("write_file") == {
        "required": ["path", "content"],
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    }
    assert shape("patch") == {
        "required": ["mode"],
        "properties": {
            "mode": {"type": "string", "enum": ["replace", "patch"], "default": "replace"},
            "path": {"type": "string"},
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean", "default": False},
            "patch": {"type": "string"},
        },
    }
    assert shape("search_files") == {
        "required": ["pattern"],
        "properties": {
            "pattern": {"type": "string"},
            "target": {"type": "string", "enum": ["content", "files"], "default": "content"},
            "path": {"type": "string", "default": "."},
            "file_glob": {"type": "string"},
            "limit": {"type": "integer", "default": 50},
            "offset": {"type": "integer", "default": 0},
            "output_mode": {
                "type": "string",
                "enum": ["content", "files_only", "count"],
                "default": "content",
            },
            "context": {"type": "integer", "default": 0},
        },
    }
    # read_file is exempt from the result budget; the others use the reference's 100 K.
    assert by_name["read_file"].max_result_size_chars is None
    assert {by_name[n].max_result_size_chars for n in ("write_file", "patch", "search_files")} == {
        100_000
    }


# --------------------------------------------------------------------------------------------
# read_file


async def test_read_file_numbering_pagination_and_hint(
    runtime: ToolRuntime, sandbox: LocalSandbox
) -> None:
    work(sandbox, "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    r = await call(runtime, "read_file", path="a.txt", offset=3, limit=4)
    assert r == {
        "content": "     3|line 3\n     4|line 4\n     5|line 5\n     6|line 6",
        "total_lines": 10,
        "file_size": 71,
        "truncated": True,
        "hint": "Use offset=7 to continue reading (showing 3-6 of 10 lines)",
    }
    r = await call(runtime, "read_file", path="a.txt", offset=7)
    assert r["truncated"] is False and "hint" not in r
    assert str(r["content"]).endswith("    10|line 10")


async def test_read_file_last_line_without_newline_is_counted(
    runtime: ToolRuntime, sandbox: LocalSandbox
) -> None:
    work(sandbox, "b.txt").write_text("one\ntwo")
    r = await call(runtime, "read_file", path="b.txt")
    assert (r["content"], r["total_lines"], r["truncated"]) == ("     1|one\n     2|two", 2, False)
    work(sandbox, "crlf.txt").write_bytes(b"a\r\nb\r\n")
    r = await call(runtime, "read_file", path="crlf.txt")
    assert r["content"] == "     1|a\n     2|b"
    work(sandbox, "empty.txt").write_text("")
    r = await call(runtime, "read_file", path="empty.txt")
    assert (r["content"], r["total_lines"], r["file_size"]) == ("", 0, 0)


async def test_read_file_odd_path_and_home(runtime: ToolRuntime, sandbox: LocalSandbox) -> None:
    target = work(sandbox, ODD_FILE)
    target.parent.mkdir(parents=True)
    target.write_text("héllo wörld\n")
    r = await call(runtime, "read_file", path=ODD_FILE)
    assert r["content"] == "     1|héllo wörld"
    (Path(sandbox.home) / "greeting.txt").write_text("hi\n")
    r = await call(runtime, "read_file", path="~/greeting.txt")
    assert r["content"] == "     1|hi"


async def test_read_file_errors(runtime: ToolRuntime, sandbox: LocalSandbox) -> None:
    work(sandbox, "config.yaml").write_text("x: 1\n")
    r = await call(runtime, "read_file", path="confg.yaml")
    assert r == {"error": "File not found: confg.yaml", "similar_files": ["config.yaml"]}

    work(sandbox, "blob.dat").write_bytes(b"\x00\x01\x02binary")
    r = await call(runtime, "read_file", path="blob.dat")
    assert r["is_binary"] is True and "Binary file" in str(r["error"])

    work(sandbox, "pic.png").write_bytes(b"\x89PNG....")
    r = await call(runtime, "read_file", path="pic.png")
    assert r["is_image"] is True and r["is_binary"] is True and "error" in r

    r = await call(runtime, "read_file", path=".")
    assert "is a directory" in str(r["error"])

    r = await call(runtime, "read_file", path="/dev/zero")
    assert "blocked" in str(r["error"])
    # A symlink to a device is resolved first, then blocked like the device itself.
    work(sandbox, "z").symlink_to("/dev/zero")
    r = await call(runtime, "read_file", path="z")
    assert "resolves to /dev/zero" in str(r["error"]) and "blocked" in str(r["error"])
    # A FIFO is not a regular file.
    os.mkfifo(work(sandbox, "fifo"))
    r = await call(runtime, "read_file", path="fifo")
    assert "not a regular file" in str(r["error"])

    out = await dispatch("read_file", json.dumps({"path": "a", "limit": 5000}), runtime)
    assert out.error is not None and "limit" in out.error


async def test_read_file_page_over_100k_chars_is_refused(
    runtime: ToolRuntime, sandbox: LocalSandbox
) -> None:
    work(sandbox, "wide.txt").write_text(("x" * 1500 + "\n") * 300)
    r = await call(runtime, "read_file", path="wide.txt", limit=300)
    assert "limit=" in str(r["error"]) and f"{MAX_READ_CHARS:,}" in str(r["error"])
    assert r["total_lines"] == 300
    # The suggested page size works.
    fits = int(str(r["error"]).rsplit("limit=", 1)[1].rstrip("."))
    ok = await call(runtime, "read_file", path="wide.txt", limit=fits)
    assert "error" not in ok and len(str(ok["content"])) <= MAX_READ_CHARS


async def test_read_file_huge_line_and_far_offset(
    runtime: ToolRuntime, sandbox: LocalSandbox
) -> None:
    # One 3 MB line, then the numbers 2..200000 (made in the sandbox: no blocking I/O here).
    made = await sandbox.exec(
        "{ head -c 3000000 /dev/zero | tr '\\0' y; echo; seq 2 200000; } > big.txt"
    )
    assert made.exit_code == 0, made.stderr
    r = await call(runtime, "read_file", path="big.txt", limit=2)
    first, second = str(r["content"]).split("\n")
    assert first == "     1|" + "y" * 2000 + "... [truncated]"
    assert second == "     2|2"
    r = await call(runtime, "read_file", path="big.txt", offset=199_999)
    assert r["content"] == "199999|199999\n200000|200000"
    assert r["total_lines"] == 200_000
    r = await call(runtime, "read_file", path="big.txt", offset=300_000)
    assert r["content"] == "" and "past the end" in str(r["hint"])


# --------------------------------------------------------------------------------------------
# write_file


async def test_write_file_creates_parents(runtime: ToolRuntime, sandbox: LocalSandbox) -> None:
    r = await call(runtime, "write_file", path=ODD_FILE, content="ünïcode\n")
    assert r == {"bytes_written": len("ünïcode\n".encode()), "dirs_created": True}
    assert work(sandbox, ODD_FILE).read_text() == "ünïcode\n"
    r = await call(runtime, "write_file", path=ODD_FILE, content="")
    assert r == {"bytes_written": 0, "dirs_created": False}
    r = await call(runtime, "write_file", path="~/notes/x.md", content="hi")
    assert (Path(sandbox.home) / "notes" / "x.md").read_text() == "hi"


async def test_write_file_large_content_via_stdin(
    runtime: ToolRuntime, sandbox: LocalSandbox
) -> None:
    content = "".join(f"{i}: {'z' * 90}\n" for i in range(30_000))  # ~2.9 MB
    r = await call(runtime, "write_file", path="big/out.txt", content=content)
    assert r["bytes_written"] == len(content)
    assert work(sandbox, "big/out.txt").read_text() == content


async def test_write_file_errors(runtime: ToolRuntime, sandbox: LocalSandbox) -> None:
    work(sandbox, "adir").mkdir()
    r = await call(runtime, "write_file", path="adir", content="x")
    assert r == {"error": "Cannot write adir: it is a directory."}
    work(sandbox, "afile").write_text("")
    r = await call(runtime, "write_file", path="afile/child.txt", content="x")
    assert str(r["error"]).startswith("Failed to write file afile/child.txt")
    work(sandbox, "dev-link").symlink_to("/dev/null")
    r = await call(runtime, "write_file", path="dev-link", content="x")
    assert "resolves to /dev/null" in str(r["error"]) and "blocked" in str(r["error"])
    os.mkfifo(work(sandbox, "a-fifo"))
    r = await call(runtime, "write_file", path="a-fifo", content="x")
    assert "not a regular file" in str(r["error"])
    r = await call(runtime, "write_file", path="/dev/sda", content="x")
    assert "blocked" in str(r["error"])
    out = await dispatch("write_file", json.dumps({"path": "x"}), runtime)
    assert out.error is not None and "content" in out.error


# --------------------------------------------------------------------------------------------
# patch (replace mode)


async def test_patch_replace_and_diff(runtime: ToolRuntime, sandbox: LocalSandbox) -> None:
    target = work(sandbox, ODD_FILE)
    target.parent.mkdir(parents=True)
    target.write_text("def f():\n    return 1\n")
    r = await call(
        runtime,
        "patch",
        mode="replace",
        path=ODD_FILE,
        old_string="return 1",
        new_string="return 2",
    )
    assert r["success"] is True and r["files_modified"] == [ODD_FILE]
    assert "-    return 1\n+    return 2\n" in str(r["diff"])
    assert target.read_text() == "def f():\n    return 2\n"


async def test_patch_replace_uniqueness_and_replace_all(
    runtime: ToolRuntime, sandbox: LocalSandbox
) -> None:
    work(sandbox, "m.py").write_text("a = 1\nb = 1\n")
    r = await call(runtime, "patch", mode="replace", path="m.py", old_string="1", new_string="2")
    assert r["success"] is False
    assert "Found 2 matches for old_string in m.py" in str(r["error"])
    assert "replace_all" in str(r["error"])
    assert work(sandbox, "m.py").read_text() == "a = 1\nb = 1\n"
    r = await call(
        runtime,
        "patch",
        mode="replace",
        path="m.py",
        old_string="1",
        new_string="2",
        replace_all=True,
    )
    assert r["success"] is True
    assert work(sandbox, "m.py").read_text() == "a = 2\nb = 2\n"


async def test_patch_replace_keeps_non_utf8_neighbours_out(
    runtime: ToolRuntime, sandbox: LocalSandbox
) -> None:
    work(sandbox, "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    r = await call(
        runtime, "patch", path="latin1.txt", mode="replace", old_string="caf", new_string="x"
    )
    assert r["success"] is False and "not valid UTF-8" in str(r["error"])


async def test_patch_replace_errors(runtime: ToolRuntime, sandbox: LocalSandbox) -> None:
    work(sandbox, "m.py").write_text("a = 1\n")
    r = await call(runtime, "patch", mode="replace", path="m.py", old_string="zzz", new_string="y")
    assert r["success"] is False and "Could not find old_string in m.py" in str(r["error"])
    assert "read_file" in str(r["_hint"])
    r = await call(runtime, "patch", mode="replace", path="nope.py", old_string="a", new_string="b")
    assert r == {"success": False, "error": "File not found: nope.py"}
    r = await call(runtime, "patch", mode="replace", path="m.py")
    assert r["success"] is False and "old_string and new_string are required" in str(r["error"])
    r = await call(runtime, "patch", mode="patch")
    assert r["success"] is False and "patch is required" in str(r["error"])


# --------------------------------------------------------------------------------------------
# patch (V4A mode)


async def test_v4a_add_update_delete(runtime: ToolRuntime, sandbox: LocalSandbox) -> None:
    work(sandbox, "src").mkdir()
    work(sandbox, "src/app.py").write_text("def a():\n    return 1\n\ndef b():\n    return 1\n")
    work(sandbox, "old.txt").write_text("bye\n")
    patch = (
        "*** Begin Patch\n"
        "*** Update File: src/app.py\n"
        "@@ def a():\n"
        "-    return 1\n"
        "+    return 'a'\n"
        "@@ def b():\n"
        "-    return 1\n"
        "+    return 'b'\n"
        f"*** Add File: {ODD_FILE}\n"
        "+new\n"
        "*** Delete File: old.txt\n"
        "*** End Patch"
    )
    r = await call(runtime, "patch", mode="patch", patch=patch)
    assert r["success"] is True, r
    assert r["files_modified"] == ["src/app.py"]
    assert r["files_created"] == [ODD_FILE]
    assert r["files_deleted"] == ["old.txt"]
    assert work(sandbox, "src/app.py").read_text() == (
        "def a():\n    return 'a'\n\ndef b():\n    return 'b'\n"
    )
    assert work(sandbox, ODD_FILE).read_text() == "new\n"
    assert not work(sandbox, "old.txt").exists()
    assert "+    return 'b'" in str(r["diff"]) and f"+++ b/{ODD_FILE}" in str(r["diff"])


async def test_v4a_failing_hunk_changes_nothing(
    runtime: ToolRuntime, sandbox: LocalSandbox
) -> None:
    work(sandbox, "keep.txt").write_text("one\ntwo\n")
    work(sandbox, "x.py").write_text("x = 1\n")
    patch = (
        "*** Begin Patch\n*** Add File: created.txt\n+c\n"
        "*** Update File: keep.txt\n-one\n+ONE\n"
        "*** Update File: x.py\n@@\n x = 1\n-y = 2\n+y = 3\n*** End Patch"
    )
    r = await call(runtime, "patch", mode="patch", patch=patch)
    assert r["success"] is False
    assert "x.py" in str(r["error"]) and "'y = 2'" in str(r["error"])
    assert work(sandbox, "keep.txt").read_text() == "one\ntwo\n"
    assert not work(sandbox, "created.txt").exists()


async def test_v4a_errors(runtime: ToolRuntime, sandbox: LocalSandbox) -> None:
    r = await call(runtime, "patch", mode="patch", patch="*** Begin Patch\n*** End Patch")
    assert r["success"] is False and "Failed to parse patch" in str(r["error"])
    r = await call(
        runtime, "patch", mode="patch", patch="*** Begin Patch\n*** Update File: nope\n-a\n+b\n"
    )
    assert r["success"] is False and "Cannot update nope: file not found" in str(r["error"])
    r = await call(runtime, "patch", mode="patch", patch="*** Delete File: ghost.txt\n")
    assert r["success"] is False and "ghost.txt" in str(r["error"])


async def test_v4a_move(runtime: ToolRuntime, sandbox: LocalSandbox) -> None:
    work(sandbox, "a.txt").write_text("x\n")
    r = await call(
        runtime,
        "patch",
        mode="patch",
        patch="*** Update File: a.txt\n*** Move to: moved/b.txt\n@@\n-x\n+y\n",
    )
    assert r["success"] is True and r["files_modified"] == ["a.txt -> moved/b.txt"]
    assert work(sandbox, "moved/b.txt").read_text() == "y\n"
    assert not work(sandbox, "a.txt").exists()


# --------------------------------------------------------------------------------------------
# search_files


VENV_BIN = str(Path(sys.executable).parent)
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(params=["grep", "rg"])
async def search_sandbox(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[LocalSandbox]:
    """A sandbox whose search engine is grep (no rg on PATH) or ripgrep (dev dependency)."""
    path = SYSTEM_PATH if request.param == "grep" else f"{VENV_BIN}:{SYSTEM_PATH}"
    sbx = await LocalSandbox.create(
        "search-test", root_dir=str(tmp_path), extra_env={"PATH": path}, isolation="process"
    )
    try:
        has_rg = (await sbx.exec("command -v rg")).exit_code == 0
        if has_rg != (request.param == "rg"):
            pytest.skip(f"cannot arrange a sandbox whose search engine is {request.param}")
        yield sbx
    finally:
        await sbx.aclose()


@pytest.fixture
def tree(search_sandbox: LocalSandbox) -> None:
    sandbox = search_sandbox
    odd = work(sandbox, ODD_FILE)
    odd.parent.mkdir(parents=True)
    odd.write_text("alpha\nneedle: one\ngamma\n")
    work(sandbox, "src").mkdir()
    work(sandbox, "src/m.py").write_text("".join(f"needle {i}\nfiller\n" for i in range(7)))
    work(sandbox, "src/n.txt").write_text("no match here\n")
    work(sandbox, ".git").mkdir()
    work(sandbox, ".git/HEAD").write_text("needle in git\n")


@pytest.fixture
def sruntime(search_sandbox: LocalSandbox) -> ToolRuntime:
    return ToolRuntime("search-test", sandboxes=Provider(search_sandbox))


async def test_search_content(sruntime: ToolRuntime, tree: None) -> None:
    runtime = sruntime
    r = await call(runtime, "search_files", pattern="needle", path=ODD_DIR)
    assert r == {
        "total_count": 1,
        "matches": [{"path": f"{ODD_DIR}/naïve: file;.txt", "line": 2, "content": "needle: one"}],
    }
    r = await call(runtime, "search_files", pattern="needle [0-9]", file_glob="*.py", limit=3)
    assert r["total_count"] == 7 and r["truncated"] is True
    assert [m["line"] for m in r["matches"]] == [1, 3, 5]
    assert "offset=3" in str(r["hint"])
    r = await call(runtime, "search_files", pattern="needle [0-9]", file_glob="*.py", offset=6)
    assert [m["content"] for m in r["matches"]] == ["needle 6"]
    assert "truncated" not in r


async def test_search_context_and_modes(sruntime: ToolRuntime, tree: None) -> None:
    runtime = sruntime
    r = await call(runtime, "search_files", pattern="needle: ", context=1)
    assert [(m["line"], m["content"]) for m in r["matches"]] == [
        (1, "alpha"),
        (2, "needle: one"),
        (3, "gamma"),
    ]
    r = await call(runtime, "search_files", pattern="needle", output_mode="files_only")
    assert sorted(r["files"]) == sorted([ODD_FILE, "src/m.py"])
    r = await call(runtime, "search_files", pattern="needle", output_mode="count")
    assert r == {"total_count": 8, "counts": {ODD_FILE: 1, "src/m.py": 7}} or r == {
        "total_count": 8,
        "counts": {"src/m.py": 7, ODD_FILE: 1},
    }


async def test_search_files_by_name(sruntime: ToolRuntime, tree: None) -> None:
    runtime = sruntime
    r = await call(runtime, "search_files", pattern="*.txt", target="files")
    assert sorted(r["files"]) == sorted([ODD_FILE, "src/n.txt"])
    r = await call(runtime, "search_files", pattern="src/*.py", target="files")
    assert r["files"] == ["src/m.py"]
    r = await call(runtime, "search_files", pattern="*", target="files", limit=1)
    assert r["total_count"] == 3 and r["truncated"] is True and "offset=1" in str(r["hint"])


async def test_search_errors(sruntime: ToolRuntime, tree: None) -> None:
    runtime = sruntime
    r = await call(runtime, "search_files", pattern="(unclosed")
    assert r["total_count"] == 0 and "Invalid search pattern" in str(r["error"])
    r = await call(runtime, "search_files", pattern="x", path="no/such dir")
    assert r == {"total_count": 0, "error": "Path not found: no/such dir"}
    r = await call(runtime, "search_files", pattern="zzz_nothing")
    assert r == {"total_count": 0}
    out = await dispatch("search_files", json.dumps({"pattern": "x", "target": "grep"}), runtime)
    assert out.error is not None and "target" in out.error


# --------------------------------------------------------------------------------------------
# Without a usable sandbox


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("read_file", {"path": "a"}),
        ("write_file", {"path": "a", "content": "b"}),
        ("patch", {"mode": "replace", "path": "a", "old_string": "b", "new_string": "c"}),
        ("search_files", {"pattern": "a"}),
    ],
)
@pytest.mark.parametrize("provider", ["none", "broken"])
async def test_no_sandbox_is_a_model_visible_error(
    name: str, args: dict[str, object], provider: str
) -> None:
    sandboxes = None if provider == "none" else Provider(error=SandboxError("docker is down"))
    out = await dispatch(name, json.dumps(args), ToolRuntime("t", sandboxes=sandboxes))
    assert out.error is not None
    assert ("docker is down" if sandboxes else "no sandbox") in out.error or (
        "none configured" in out.error
    )


async def test_registry_offers_file_toolset() -> None:
    defs = ToolRegistry(TOOLS).definitions(["file"])
    assert defs.valid_names == {"read_file", "write_file", "patch", "search_files"}


async def test_search_engine_is_the_one_arranged(
    search_sandbox: LocalSandbox, request: pytest.FixtureRequest
) -> None:
    script = build_search_script(SearchRequest(pattern="x"))
    first = (await search_sandbox.exec(script)).stdout.split("\n")[0]
    assert first == f"@engine {request.node.callspec.params['search_sandbox']}"


class _ScriptedSandbox(Sandbox):
    """exec either raises SandboxError or hangs (after setting ``entered``)."""

    task_id = "scripted"
    workdir = "/w"

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.entered = anyio.Event()

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        self.entered.set()
        if self.mode == "raise":
            raise SandboxError("container vanished")
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def read_bytes(self, path: str) -> bytes:
        raise FileNotFoundError(path)

    async def write_bytes(self, path: str, data: bytes) -> None:
        raise OSError("no")

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        raise OSError("no")

    async def get_archive(self, path: str) -> bytes:
        raise FileNotFoundError(path)

    async def aclose(self, interrupted: bool = False) -> None:
        return None


ALL_CALLS = [
    ("read_file", {"path": "a"}),
    ("write_file", {"path": "a", "content": "b"}),
    ("patch", {"mode": "replace", "path": "a", "old_string": "b", "new_string": "c"}),
    ("patch", {"mode": "patch", "patch": "*** Delete File: a\n"}),
    ("search_files", {"pattern": "a"}),
]


@pytest.mark.parametrize(("name", "args"), ALL_CALLS)
async def test_sandbox_failure_during_exec_is_model_visible(
    name: str, args: dict[str, object]
) -> None:
    runtime = ToolRuntime("t", sandboxes=Provider(_ScriptedSandbox("raise")))
    out = await dispatch(name, json.dumps(args), runtime)
    assert out.error is not None and "container vanished" in out.error
    assert "Tool execution failed" not in out.error  # handled by the tool, not the dispatcher


@pytest.mark.parametrize(("name", "args"), ALL_CALLS)
async def test_cancellation_propagates_out_of_the_tools(name: str, args: dict[str, object]) -> None:
    sandbox = _ScriptedSandbox("hang")
    runtime = ToolRuntime("t", sandboxes=Provider(sandbox))
    outcomes: list[object] = []

    async def run() -> None:
        outcomes.append(await dispatch(name, json.dumps(args), runtime))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await sandbox.entered.wait()
            tg.cancel_scope.cancel()
    assert outcomes == []


class _Recording(Sandbox):
    """Delegates to a real sandbox and records how much output each command returned."""

    def __init__(self, inner: LocalSandbox) -> None:
        self.inner = inner
        self.task_id, self.workdir = inner.task_id, inner.workdir
        self.output_sizes: list[int] = []

    async def exec_request(self, request: ExecRequest) -> ExecResult:
        result = await self.inner.exec_request(request)
        self.output_sizes.append(len(result.stdout) + len(result.stderr))
        return result

    async def read_bytes(self, path: str) -> bytes:
        return await self.inner.read_bytes(path)

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self.inner.write_bytes(path, data)

    async def put_archive(self, dest_dir: str, tar_data: bytes) -> None:
        await self.inner.put_archive(dest_dir, tar_data)

    async def get_archive(self, path: str) -> bytes:
        return await self.inner.get_archive(path)

    async def aclose(self, interrupted: bool = False) -> None:
        return None


async def test_large_file_reads_only_the_page(sandbox: LocalSandbox) -> None:
    made = await sandbox.exec("yes 'some text in a line' | head -c 64000000 > huge.txt")
    assert made.exit_code == 0
    recording = _Recording(sandbox)
    runtime = ToolRuntime("t", sandboxes=Provider(recording))
    r = await call(runtime, "read_file", path="huge.txt", offset=2_000_000, limit=3)
    rows = range(2_000_000, 2_000_003)
    assert r["content"] == "\n".join(f"{n}|some text in a line" for n in rows)
    assert r["total_lines"] == 3_200_000 and r["file_size"] == 64_000_000
    assert max(recording.output_sizes) < 1_000  # the page came back, not the file
    # patch refuses files it would have to load whole.
    r = await call(
        runtime, "patch", mode="replace", path="huge.txt", old_string="a", new_string="b"
    )
    assert r["success"] is False and "too large to patch" in str(r["error"])
    assert max(recording.output_sizes) < 1_000


@pytest.mark.parametrize(
    ("tool", "args", "name"),
    [
        ("read_file", {"path": "a\0b"}, "path"),
        ("write_file", {"path": "a\0b", "content": "x"}, "path"),
        (
            "patch",
            {"mode": "replace", "path": "a\0b", "old_string": "a", "new_string": "b"},
            "path",
        ),
        ("patch", {"mode": "patch", "patch": "*** Add File: a\0b\n+x\n"}, "path"),
        ("search_files", {"pattern": "a\0"}, "pattern"),
        ("search_files", {"pattern": "a", "path": "a\0"}, "path"),
        ("search_files", {"pattern": "a", "file_glob": "*\0"}, "file_glob"),
    ],
)
async def test_nul_byte_in_an_argument_is_a_clear_error(
    runtime: ToolRuntime, tool: str, args: dict[str, object], name: str
) -> None:
    r = await call(runtime, tool, **args)
    assert str(r["error"]).startswith(f"{name} contains a NUL byte")

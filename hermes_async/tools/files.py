"""File tools (toolset ``file``): ``read_file``, ``write_file``, ``patch``, ``search_files``.

Each call is a short shell script through ``Sandbox.exec``; paths resolve inside the sandbox
and ``/dev``, ``/proc``, ``/sys`` are refused; failures are returned as the reference's JSON.
Shapes and reach: docs/architecture.md, "The file tools".
"""

from __future__ import annotations

import base64
import binascii
import difflib
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from hermes_async.errors import SandboxError
from hermes_async.jsontypes import JSONObject
from hermes_async.tools._fuzzy import ReplaceError, fuzzy_replace
from hermes_async.tools._search import (
    SearchRequest,
    build_search_script,
    parse_search_output,
    shell_path,
)
from hermes_async.tools._v4a import (
    FileOp,
    PatchApplyError,
    PatchParseError,
    apply_update,
    parse_patch,
)
from hermes_async.tools.registry import Tool, ToolRuntime
from hermes_async.tools.sandbox.base import ExecResult, Sandbox
from hermes_async.tools.sandbox.errors import SandboxUnavailableError

__all__ = (
    "MAX_READ_CHARS",
    "PATCH_TOOL",
    "READ_FILE_TOOL",
    "SEARCH_FILES_TOOL",
    "TOOLS",
    "WRITE_FILE_TOOL",
)

#: Most lines one read_file call returns (the schema's maximum).
_MAX_READ_LINES = 2_000
#: Default page size.
DEFAULT_READ_LINES = 500
#: A page whose numbered text is longer than this is refused with a hint to read fewer lines.
MAX_READ_CHARS = 100_000
#: Characters of one line shown; the rest is replaced by ``... [truncated]``.
_MAX_LINE_CHARS = 2_000
#: Largest file ``patch`` edits (it must read, rewrite and diff the whole file).
_MAX_PATCH_FILE_BYTES = 10 * 1024 * 1024
#: Deadline of each sandbox command a file tool runs.
FILE_OP_TIMEOUT_SECONDS = 60.0
#: Bytes sampled from the start of a file to decide whether it is binary.
BINARY_SAMPLE_BYTES = 8_192

#: Extensions treated as binary without looking (the content check catches the rest).
_BINARY_EXTS = (
    ".png .jpg .jpeg .gif .webp .bmp .ico .tiff .tif .mp3 .mp4 .wav .avi .mov .mkv .flac "
    ".ogg .webm .zip .tar .gz .tgz .bz2 .xz .zst .7z .rar .pdf .doc .docx .xls .xlsx .ppt "
    ".pptx .exe .dll .so .dylib .o .a .pyc .pyo .class .jar .wasm .bin .ttf .otf .woff "
    ".woff2 .eot .db .sqlite .sqlite3 .npy .npz .pt .pth .safetensors .parquet .pkl"
)
_IMAGE_EXTS = ".png .jpg .jpeg .gif .webp .bmp .ico .tiff .tif"
BINARY_EXTENSIONS = frozenset(_BINARY_EXTS.split())
IMAGE_EXTENSIONS = frozenset(_IMAGE_EXTS.split())

_LINE_BYTES = _MAX_LINE_CHARS * 4 + 4
_BLOCKED_PREFIXES = ("/dev/", "/proc/", "/sys/")


# --------------------------------------------------------------------------------------------
# Pure helpers


def _looks_binary(path: str, sample_len: int, nul_count: int, control_count: int) -> bool:
    """Whether a file is binary: a binary extension, a NUL byte, or > 30 % control characters."""
    if posixpath.splitext(path)[1].lower() in BINARY_EXTENSIONS:
        return True
    if nul_count > 0:
        return True
    return sample_len > 0 and control_count * 10 > sample_len * 3


def _cut_line(line: str) -> str:
    if len(line) > _MAX_LINE_CHARS or len(line.encode("utf-8", "replace")) >= _LINE_BYTES:
        return line[:_MAX_LINE_CHARS] + "... [truncated]"
    return line


def _format_numbered(lines: Sequence[str], first_line: int) -> str:
    r"""``lines`` as ``N|line`` (6 wide); long lines cut, CRLF's ``\r`` hidden."""
    return "\n".join(
        f"{n:6d}|{_cut_line(line.removesuffix(chr(13)))}"
        for n, line in enumerate(lines, first_line)
    )


def _blocked(path: str) -> bool:
    """Lexical pre-check of an absolute path (``//proc`` and ``/a/../proc`` included); the
    authoritative check runs in the sandbox after symlinks are resolved (:func:`_guard`)."""
    if not path.startswith("/"):
        return False
    normalized = "/" + posixpath.normpath(path).lstrip("/") + "/"
    return normalized.startswith(_BLOCKED_PREFIXES)


#: Shell function: print the absolute, normalised, symlink-resolved form of "$1" (resolving
#: what exists; a missing tail is kept as given). GNU ``realpath -m`` does it all; busybox has
#: ``readlink -f`` (existing paths); ``cd -P`` + ``pwd -P`` resolves the directory otherwise.
_RESOLVE_FN = r"""hermes_resolve() {
  p=$1
  case $p in /*) ;; *) p=$(pwd -P)/$p ;; esac
  r=$(realpath -m -- "$p" 2>/dev/null) && [ -n "$r" ] && { printf '%s
' "$r"; return; }
  r=$(readlink -f -- "$p" 2>/dev/null) && [ -n "$r" ] && { printf '%s
' "$r"; return; }
  d=$(dirname -- "$p"); b=$(basename -- "$p")
  d=$(cd -P -- "$d" 2>/dev/null && pwd -P) || d=$(dirname -- "$p")
  printf '%s/%s
' "${d%/}" "$b"
}
"""


def _guard(path: str, *, drain_stdin: bool = False) -> str:
    """Script prologue: ``f`` = ``path`` resolved in the sandbox; ``@blocked <resolved>`` and
    exit when it lies under /dev, /proc or /sys (``drain_stdin``: read stdin away first)."""
    drain = "cat > /dev/null; " if drain_stdin else ""
    return (
        _RESOLVE_FN
        + f"f=$(hermes_resolve {shell_path(path)})\n"
        + 'case "$f" in /dev|/dev/*|/proc|/proc/*|/sys|/sys/*) '
        + f"{drain}printf '@blocked %s\\n' \"$f\"; exit 0;; esac\n"
    )


def _blocked_error(path: str, stdout: str, verb: str) -> str | None:
    """The model-visible error if a guarded script answered ``@blocked``, else ``None``."""
    head, _, _ = stdout.partition("\n")
    if not head.startswith("@blocked"):
        return None
    resolved = head[len("@blocked ") :].strip()
    where = f" (it resolves to {resolved})" if resolved and resolved != path else ""
    return f"Cannot {verb} {path}{where}: device and kernel paths (/dev, /proc, /sys) are blocked."


def _similar(name: str, entries: Sequence[str], directory: str) -> list[str]:
    close = difflib.get_close_matches(name, list(entries), n=5, cutoff=0.5)
    lowered = name.lower()
    close += [e for e in entries if lowered and lowered in e.lower() and e not in close]
    base = "" if directory in ("", ".") else directory.rstrip("/") + "/"
    return [base + e for e in close[:5]]


def _unified_diff(old: str, new: str, path: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


def _err(message: str, **extra: object) -> JSONObject:
    return {"error": message, **extra}


def _nul_error(**values: object) -> str | None:
    """The error for the first argument holding a NUL byte (no shell command can carry one)."""
    for name, value in values.items():
        if isinstance(value, str) and "\0" in value:
            return f"{name} contains a NUL byte, which no file name or shell command can hold."
    return None


# --------------------------------------------------------------------------------------------
# Sandbox access


class _Unavailable(Exception):
    """The rollout has no usable sandbox; ``str()`` is the model-visible message."""


async def _sandbox(runtime: ToolRuntime) -> Sandbox:
    if runtime.sandboxes is None:
        raise _Unavailable("File tools need a sandbox, and this rollout has none configured.")
    try:
        return await runtime.sandboxes.get(runtime.task_id)
    except anyio.get_cancelled_exc_class():
        raise
    except (SandboxError, OSError) as exc:
        raise _Unavailable(f"Sandbox unavailable: {exc}") from exc


async def _run(
    sandbox: Sandbox, script: str, *, stdin: bytes | None = None, output_limit: int | None = None
) -> ExecResult:
    try:
        if output_limit is None:
            return await sandbox.exec(script, stdin=stdin, timeout=FILE_OP_TIMEOUT_SECONDS)
        return await sandbox.exec(
            script, stdin=stdin, timeout=FILE_OP_TIMEOUT_SECONDS, output_limit=output_limit
        )
    except anyio.get_cancelled_exc_class():
        raise
    except SandboxUnavailableError as exc:
        raise _Unavailable(f"Sandbox unavailable: {exc.message}") from exc
    except (SandboxError, OSError) as exc:
        raise _Unavailable(f"Sandbox command failed: {exc}") from exc


def _first_line(text: str) -> tuple[str, str]:
    head, _, rest = text.partition("\n")
    return head, rest


# --------------------------------------------------------------------------------------------
# read_file


READ_FILE_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "File to read: absolute, relative to the working directory, or ~/...",
        },
        "offset": {
            "type": "integer",
            "description": "First line to return, counting from 1 (default: 1)",
            "default": 1,
            "minimum": 1,
        },
        "limit": {
            "type": "integer",
            "description": "How many lines to return (default: 500, max: 2000)",
            "default": DEFAULT_READ_LINES,
            "maximum": _MAX_READ_LINES,
        },
    },
    "required": ["path"],
}


def _read_script(path: str, offset: int, limit: int, want_content: bool) -> str:
    return (
        _guard(path)
        + f"""if [ -d "$f" ]; then echo '@dir'; exit 0; fi
if [ ! -e "$f" ]; then echo '@missing'; ls -1A -- "$(dirname -- "$f")" 2>/dev/null | head -n 500; exit 0; fi
if [ ! -f "$f" ]; then echo '@special'; exit 0; fi
if [ ! -r "$f" ]; then echo '@unreadable'; exit 0; fi
size=$(wc -c < "$f")
nul=$(head -c {BINARY_SAMPLE_BYTES} < "$f" | tr -dc '\\000' | wc -c)
ctl=$(head -c {BINARY_SAMPLE_BYTES} < "$f" | LC_ALL=C tr -dc '\\001-\\010\\016-\\037' | wc -c)
smp=$(head -c {BINARY_SAMPLE_BYTES} < "$f" | wc -c)
if [ {1 if want_content else 0} -eq 0 ] || [ "$nul" -gt 0 ]; then
  echo "@meta $size -1 $nul $ctl $smp"; exit 0
fi
lines=$(wc -l < "$f")
if [ "$size" -gt 0 ] && [ "$(tail -c 1 < "$f" | wc -l)" -eq 0 ]; then lines=$((lines + 1)); fi
echo "@meta $size $lines $nul $ctl $smp"
tail -n +{offset} < "$f" | head -n {limit} | cut -b 1-{_LINE_BYTES}
"""
    )


@dataclass(frozen=True, slots=True)
class _Meta:
    size: int
    lines: int
    nul: int
    ctl: int
    sample: int


def _parse_meta(line: str) -> _Meta | None:
    parts = line.split()
    if len(parts) != 6 or parts[0] != "@meta":
        return None
    try:
        return _Meta(*(int(x) for x in parts[1:]))
    except ValueError:
        return None


def _shape_read(
    path: str, offset: int, limit: int, stdout: str, exec_truncated: bool
) -> JSONObject:
    """The read_file result for the read script's output (pure; exposed for tests)."""
    head, body = _first_line(stdout)
    if head == "@dir":
        return _err(
            f"{path} is a directory, not a file. Use search_files(target='files', path=...) "
            "to list its files."
        )
    if head == "@missing":
        directory, name = posixpath.split(path)
        entries = [x for x in body.split("\n") if x]
        similar = _similar(name, entries, directory)
        return _err(f"File not found: {path}", **({"similar_files": similar} if similar else {}))
    if head == "@special":
        return _err(f"{path} is not a regular file (device, FIFO or socket); it cannot be read.")
    if head == "@unreadable":
        return _err(f"Permission denied: {path} is not readable.")
    meta = _parse_meta(head)
    if meta is None:
        return _err(f"Failed to read file {path}: unexpected output from the sandbox.")
    ext = posixpath.splitext(path)[1].lower()
    if ext in IMAGE_EXTENSIONS:
        return {
            "is_binary": True,
            "is_image": True,
            "file_size": meta.size,
            "error": "Image file: it cannot be displayed as text, and no image tool is "
            "available here.",
        }
    if meta.lines < 0 or _looks_binary(path, meta.sample, meta.nul, meta.ctl):
        return {
            "is_binary": True,
            "file_size": meta.size,
            "error": "Binary file: it cannot be displayed as text. Use the terminal with a "
            "suitable tool (e.g. `xxd FILE | head`, `file FILE`) to inspect it.",
        }
    total = meta.lines
    lines = body.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = lines[:limit]
    content = _format_numbered(lines, offset)
    if exec_truncated or len(content) > MAX_READ_CHARS:
        fits, used = 0, 0
        for line in lines:
            used += len(_cut_line(line)) + 8
            if used > MAX_READ_CHARS:
                break
            fits += 1
        fits = max(fits, 1)
        return _err(
            f"Reading {len(lines)} lines from line {offset} of {path} would return more than "
            f"{MAX_READ_CHARS:,} characters. Read fewer lines at a time, e.g. "
            f"offset={offset}, limit={fits}.",
            total_lines=total,
            file_size=meta.size,
        )
    end = offset + len(lines) - 1
    result: JSONObject = {
        "content": content,
        "total_lines": total,
        "file_size": meta.size,
        "truncated": total > end,
    }
    if not lines and total > 0 and offset > total:
        result["hint"] = f"offset={offset} is past the end of the file ({total} lines)."
    elif total > end:
        result["hint"] = (
            f"Use offset={end + 1} to continue reading (showing {offset}-{end} of {total} lines)"
        )
    return result


async def _read_file(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    path = str(args.get("path") or "")
    if not path:
        return _err("path is required: the file to read.")
    if (nul := _nul_error(path=path)) is not None:
        return _err(nul)
    offset = max(1, int(args.get("offset") or 1))
    limit = min(max(1, int(args.get("limit") or DEFAULT_READ_LINES)), _MAX_READ_LINES)
    if _blocked(path):
        return _err(f"Cannot read {path}: device and kernel paths (/dev, /proc, /sys) are blocked.")
    want = posixpath.splitext(path)[1].lower() not in BINARY_EXTENSIONS
    try:
        sandbox = await _sandbox(runtime)
        res = await _run(sandbox, _read_script(path, offset, limit, want))
    except _Unavailable as exc:
        return _err(str(exc))
    if res.timed_out:
        return _err(f"Reading {path} timed out after {FILE_OP_TIMEOUT_SECONDS:g} seconds.")
    if not res.stdout.startswith("@"):
        return _err(f"Failed to read file {path}: {res.stderr.strip()[:500] or 'no output'}")
    blocked = _blocked_error(path, res.stdout, "read")
    if blocked is not None:
        return _err(blocked)
    return _shape_read(path, offset, limit, res.stdout, res.truncated)


# --------------------------------------------------------------------------------------------
# write_file


WRITE_FILE_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "File to write; created if missing (with its parent directories), "
            "replaced if it exists",
        },
        "content": {"type": "string", "description": "The complete new content of the file"},
    },
    "required": ["path", "content"],
}


def _write_script(path: str) -> str:
    return (
        _guard(path, drain_stdin=True)
        + """if [ -d "$f" ]; then cat > /dev/null; echo '@isdir'; exit 0; fi
if [ -e "$f" ] && [ ! -f "$f" ]; then cat > /dev/null; echo '@special'; exit 0; fi
d=$(dirname -- "$f")
created=false
if [ ! -d "$d" ]; then
  mkdir -p -- "$d" || { cat > /dev/null; exit 3; }
  created=true
fi
cat > "$f" || exit 4
echo "@ok $created $(wc -c < "$f")"
"""
    )


async def _write(sandbox: Sandbox, path: str, data: bytes) -> JSONObject:
    """Write ``data`` to ``path`` in ``sandbox``; the write_file result (may be an error)."""
    res = await _run(sandbox, _write_script(path), stdin=data)
    blocked = _blocked_error(path, res.stdout, "write")
    if blocked is not None:
        return _err(blocked)
    head = res.stdout.strip()
    if head == "@isdir":
        return _err(f"Cannot write {path}: it is a directory.")
    if head == "@special":
        return _err(f"Cannot write {path}: it is not a regular file (device, FIFO or socket).")
    parts = head.split()
    if res.exit_code != 0 or len(parts) != 3 or parts[0] != "@ok":
        detail = res.stderr.strip()[:500] or f"exit code {res.exit_code}"
        return _err(f"Failed to write file {path}: {detail}")
    return {"bytes_written": int(parts[2]), "dirs_created": parts[1] == "true"}


async def _write_file(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    path = str(args.get("path") or "")
    content = args.get("content")
    if not path:
        return _err("path is required: the file to write.")
    if not isinstance(content, str):
        return _err("content is required: the complete text of the file.")
    if (nul := _nul_error(path=path)) is not None:
        return _err(nul)
    if _blocked(path):
        return _err(
            f"Cannot write {path}: device and kernel paths (/dev, /proc, /sys) are blocked."
        )
    try:
        sandbox = await _sandbox(runtime)
        return await _write(sandbox, path, content.encode("utf-8", "surrogatepass"))
    except _Unavailable as exc:
        return _err(str(exc))


# --------------------------------------------------------------------------------------------
# patch


PATCH_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "mode": {
            "type": "string",
            "enum": ["replace", "patch"],
            "description": "'replace': replace one string in one file. 'patch': apply a V4A "
            "patch that may add, update and delete several files",
            "default": "replace",
        },
        "path": {"type": "string", "description": "The file to edit (replace mode)"},
        "old_string": {
            "type": "string",
            "description": "The text to replace (replace mode). It must occur exactly once "
            "unless replace_all is true: include enough surrounding lines to make it unique.",
        },
        "new_string": {
            "type": "string",
            "description": "The replacement text (replace mode); empty to delete old_string.",
        },
        "replace_all": {
            "type": "boolean",
            "description": "Replace every occurrence of old_string (default: false)",
            "default": False,
        },
        "patch": {
            "type": "string",
            "description": "The V4A patch (patch mode), e.g.:\n*** Begin Patch\n"
            "*** Update File: src/app.py\n@@ def main():\n context line\n-old line\n+new line\n"
            "*** Add File: notes.txt\n+content\n*** Delete File: old.txt\n*** End Patch",
        },
    },
    "required": ["mode"],
}


class _PatchFailure(Exception):
    """A patch step failed; ``str()`` is the model-visible error."""


async def _read_exact(sandbox: Sandbox, path: str) -> str | None:
    """The text of ``path`` (``None`` if it does not exist). Raises _PatchFailure otherwise."""
    script = (
        _guard(path)
        + f"""if [ ! -e "$f" ]; then echo '@missing'; exit 0; fi
if [ ! -f "$f" ]; then echo '@special'; exit 0; fi
size=$(wc -c < "$f")
if [ "$size" -gt {_MAX_PATCH_FILE_BYTES} ]; then echo "@toolarge $size"; exit 0; fi
echo "@ok $size"
base64 < "$f"
"""
    )
    res = await _run(sandbox, script, output_limit=_MAX_PATCH_FILE_BYTES * 2)
    blocked = _blocked_error(path, res.stdout, "patch")
    if blocked is not None:
        raise _PatchFailure(blocked)
    head, body = _first_line(res.stdout)
    if head == "@missing":
        return None
    if head == "@special":
        raise _PatchFailure(f"{path} is not a regular file.")
    if head.startswith("@toolarge"):
        raise _PatchFailure(
            f"{path} is too large to patch ({head.split()[-1]} bytes; the limit is "
            f"{_MAX_PATCH_FILE_BYTES:,}). Edit it with the terminal instead."
        )
    if not head.startswith("@ok") or res.exit_code != 0 or res.truncated:
        detail = res.stderr.strip()[:500] or f"exit code {res.exit_code}"
        raise _PatchFailure(f"Failed to read {path}: {detail}")
    try:
        data = base64.b64decode("".join(body.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _PatchFailure(f"Failed to read {path}: corrupt transfer ({exc})") from exc
    if b"\0" in data[:BINARY_SAMPLE_BYTES]:
        raise _PatchFailure(f"{path} is a binary file; patch edits text files only.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _PatchFailure(
            f"{path} is not valid UTF-8 text (byte {exc.start}); patch edits UTF-8 text files only."
        ) from exc


async def _write_or_fail(sandbox: Sandbox, path: str, text: str) -> None:
    result = await _write(sandbox, path, text.encode("utf-8", "surrogatepass"))
    if "error" in result:
        raise _PatchFailure(str(result["error"]))


async def _remove(sandbox: Sandbox, path: str) -> None:
    res = await _run(sandbox, _guard(path) + 'rm -f -- "$f"')
    blocked = _blocked_error(path, res.stdout, "delete")
    if blocked is not None:
        raise _PatchFailure(blocked)
    if res.exit_code != 0:
        raise _PatchFailure(f"Failed to delete {path}: {res.stderr.strip()[:500]}")


_NOT_FOUND_HINT = (
    "Use read_file to see the file's current content and copy old_string exactly from it "
    "(without the line-number prefixes)."
)


async def _patch_replace(sandbox: Sandbox, args: JSONObject) -> JSONObject:
    path = args.get("path")
    old, new = args.get("old_string"), args.get("new_string")
    if not isinstance(path, str) or not path:
        return {"success": False, "error": "path is required for mode 'replace'."}
    if not isinstance(old, str) or not isinstance(new, str):
        return {
            "success": False,
            "error": "old_string and new_string are required for mode 'replace'.",
        }
    if (nul := _nul_error(path=path)) is not None:
        return {"success": False, "error": nul}
    if _blocked(path):
        return {"success": False, "error": f"Cannot patch {path}: device paths are blocked."}
    current = await _read_exact(sandbox, path)
    if current is None:
        return {"success": False, "error": f"File not found: {path}"}
    try:
        replaced = fuzzy_replace(current, old, new, replace_all=bool(args.get("replace_all")))
    except ReplaceError as exc:
        message = str(exc).replace("old_string", f"old_string in {path}", 1)
        out: JSONObject = {"success": False, "error": message}
        if message.startswith("Could not find"):
            out["_hint"] = _NOT_FOUND_HINT
        return out
    await _write_or_fail(sandbox, path, replaced.content)
    return {
        "success": True,
        "diff": _unified_diff(current, replaced.content, path),
        "files_modified": [path],
    }


async def _patch_v4a(sandbox: Sandbox, text: str) -> JSONObject:
    try:
        ops = parse_patch(text)
    except PatchParseError as exc:
        return {"success": False, "error": f"Failed to parse patch: {exc}"}
    for op in ops:
        if (nul := _nul_error(path=op.path, move_to=op.move_to)) is not None:
            return {"success": False, "error": f"{nul} (in '*** {op.kind.title()} File:')"}
        for p in (op.path, op.move_to):
            if p is not None and _blocked(p):
                return {"success": False, "error": f"Cannot patch {p}: device paths are blocked."}

    # Plan every change before writing anything: a patch applies completely or not at all
    # (except for a sandbox failure in the middle of the writes).
    planned: list[tuple[FileOp, str | None, str | None]] = []  # (op, old, new)
    pending: dict[str, str | None] = {}  # content after earlier operations of this patch
    for op in ops:
        if op.path in pending:
            old = pending[op.path]
        else:
            old = await _read_exact(sandbox, op.path)
        if op.kind == "add":
            planned.append((op, old, op.content))
            pending[op.path] = op.content
        elif op.kind == "delete":
            if old is None:
                raise _PatchFailure(f"Cannot delete {op.path}: file not found.")
            planned.append((op, old, None))
            pending[op.path] = None
        else:
            if old is None:
                raise _PatchFailure(
                    f"Cannot update {op.path}: file not found (use '*** Add File:' to create it)."
                )
            try:
                new = apply_update(op.path, old, op.hunks)
            except PatchApplyError as exc:
                raise _PatchFailure(str(exc)) from exc
            planned.append((op, old, new))
            if op.move_to is not None:
                pending[op.path] = None
                pending[op.move_to] = new
            else:
                pending[op.path] = new

    diffs: list[str] = []
    modified: list[str] = []
    created: list[str] = []
    deleted: list[str] = []
    for op, before, after in planned:
        if op.kind == "add":
            assert after is not None
            await _write_or_fail(sandbox, op.path, after)
            created.append(op.path)
            diffs.append(
                _unified_diff(before or "", after, op.path) if before else _add_diff(op.path, after)
            )
        elif op.kind == "delete":
            await _remove(sandbox, op.path)
            deleted.append(op.path)
            diffs.append(f"--- a/{op.path}\n+++ /dev/null\n")
        else:
            assert after is not None and before is not None
            target = op.move_to or op.path
            await _write_or_fail(sandbox, target, after)
            if op.move_to is not None and op.move_to != op.path:
                await _remove(sandbox, op.path)
                modified.append(f"{op.path} -> {op.move_to}")
            else:
                modified.append(op.path)
            diffs.append(_unified_diff(before, after, target))
    result: JSONObject = {
        "success": True,
        "diff": "".join(d if d.endswith("\n") else d + "\n" for d in diffs),
    }
    if modified:
        result["files_modified"] = modified
    if created:
        result["files_created"] = created
    if deleted:
        result["files_deleted"] = deleted
    return result


def _add_diff(path: str, content: str) -> str:
    lines = content.splitlines()
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(
        f"+{x}\n" for x in lines
    )


async def _patch(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    mode = args.get("mode") or "replace"
    if mode not in ("replace", "patch"):
        return {"success": False, "error": f"Unknown mode {mode!r}: use 'replace' or 'patch'."}
    if mode == "patch" and not (isinstance(args.get("patch"), str) and args["patch"].strip()):
        return {"success": False, "error": "patch is required for mode 'patch' (V4A text)."}
    try:
        sandbox = await _sandbox(runtime)
        if mode == "replace":
            return await _patch_replace(sandbox, args)
        return await _patch_v4a(sandbox, args["patch"])
    except _PatchFailure as exc:
        out: JSONObject = {"success": False, "error": str(exc)}
        if str(exc).startswith("Could not apply"):
            out["_hint"] = _NOT_FOUND_HINT
        return out
    except _Unavailable as exc:
        return {"success": False, "error": str(exc)}


# --------------------------------------------------------------------------------------------
# search_files


SEARCH_FILES_PARAMETERS: JSONObject = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "description": "For target='content': a regular expression to find in files. For "
            "target='files': a file-name glob such as '*.py' or '*config*'",
        },
        "target": {
            "type": "string",
            "enum": ["content", "files"],
            "description": "'content' searches inside files; 'files' finds files by name",
            "default": "content",
        },
        "path": {
            "type": "string",
            "description": "Directory or file to search (default: the working directory)",
            "default": ".",
        },
        "file_glob": {
            "type": "string",
            "description": "Only search files whose name matches this glob, e.g. '*.py' "
            "(content search)",
        },
        "limit": {
            "type": "integer",
            "description": "Most results to return (default: 50)",
            "default": 50,
        },
        "offset": {
            "type": "integer",
            "description": "Results to skip, for paging (default: 0)",
            "default": 0,
        },
        "output_mode": {
            "type": "string",
            "enum": ["content", "files_only", "count"],
            "description": "Content search output: 'content' gives matching lines with line "
            "numbers, 'files_only' the paths of matching files, 'count' matches per file",
            "default": "content",
        },
        "context": {
            "type": "integer",
            "description": "Lines of context before and after each match (content search)",
            "default": 0,
        },
    },
    "required": ["pattern"],
}

_TARGET_ALIASES = {"grep": "content", "find": "files"}
#: Largest page and context a search may ask for (bigger values are clamped).
MAX_SEARCH_LIMIT = 1_000
MAX_SEARCH_CONTEXT = 20


async def _search_files(args: JSONObject, runtime: ToolRuntime) -> JSONObject:
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        return {"total_count": 0, "error": "pattern is required: a regex or a file-name glob."}
    target = str(args.get("target") or "content")
    target = _TARGET_ALIASES.get(target, target)
    mode = str(args.get("output_mode") or "content")
    if target not in ("content", "files"):
        return {"total_count": 0, "error": f"Unknown target {target!r}: use 'content' or 'files'."}
    if mode not in ("content", "files_only", "count"):
        return {
            "total_count": 0,
            "error": f"Unknown output_mode {mode!r}: use 'content', 'files_only' or 'count'.",
        }
    glob = args.get("file_glob")
    nul = _nul_error(pattern=pattern, path=args.get("path"), file_glob=glob)
    if nul is not None:
        return {"total_count": 0, "error": nul}
    req = SearchRequest(
        pattern=pattern,
        target=target,
        path=str(args.get("path") or "."),
        file_glob=glob if isinstance(glob, str) and glob else None,
        limit=min(max(1, int(args.get("limit") or 50)), MAX_SEARCH_LIMIT),
        offset=max(0, int(args.get("offset") or 0)),
        output_mode=mode,
        context=min(max(0, int(args.get("context") or 0)), MAX_SEARCH_CONTEXT),
    )
    try:
        sandbox = await _sandbox(runtime)
        res = await _run(sandbox, _guard(req.path) + build_search_script(req))
    except _Unavailable as exc:
        return {"total_count": 0, "error": str(exc)}
    blocked = _blocked_error(req.path, res.stdout, "search")
    if blocked is not None:
        return {"total_count": 0, "error": blocked}
    if res.timed_out:
        return {
            "total_count": 0,
            "error": f"Search timed out after {FILE_OP_TIMEOUT_SECONDS:g} seconds; narrow it "
            "with path or file_glob.",
        }
    if res.exit_code == 2 and not res.stdout.startswith("@"):
        detail = res.stderr.strip()[:500] or "invalid pattern"
        return {"total_count": 0, "error": f"Invalid search pattern {pattern!r}: {detail}"}
    if not res.stdout.startswith("@"):
        detail = res.stderr.strip()[:500] or f"exit code {res.exit_code}"
        return {"total_count": 0, "error": f"Search failed: {detail}"}
    return parse_search_output(req, res.stdout)


# --------------------------------------------------------------------------------------------
# Registration


READ_FILE_TOOL = Tool(
    name="read_file",
    description=(
        "Read a text file with line numbers, one page at a time. Prefer it to cat/head/tail in "
        "the terminal. Each line is shown as 'LINE_NUM|CONTENT'; use offset and limit to page "
        "through large files. If the file is missing, similar names are suggested. Binary and "
        "image files cannot be read."
    ),
    parameters=READ_FILE_PARAMETERS,
    handler=_read_file,
    toolset="file",
    max_result_size_chars=None,
)

WRITE_FILE_TOOL = Tool(
    name="write_file",
    description=(
        "Write a whole file, replacing any existing content; parent directories are created. "
        "Prefer it to echo or heredocs in the terminal. To change part of a file, use patch."
    ),
    parameters=WRITE_FILE_PARAMETERS,
    handler=_write_file,
    toolset="file",
)

PATCH_TOOL = Tool(
    name="patch",
    description=(
        "Edit files without rewriting them. Prefer it to sed/awk in the terminal.\n\n"
        "mode='replace' (default): replace old_string by new_string in path. old_string must "
        "be unique unless replace_all=true; small whitespace and indentation differences are "
        "tolerated.\nmode='patch': apply a V4A patch that can update, add and delete several "
        "files at once; nothing is changed if any hunk does not apply.\n"
        "Returns a unified diff of the change."
    ),
    parameters=PATCH_PARAMETERS,
    handler=_patch,
    toolset="file",
)

SEARCH_FILES_TOOL = Tool(
    name="search_files",
    description=(
        "Search inside files or find files by name. Prefer it to grep/find/ls in the "
        "terminal.\n\ntarget='content': regex search in file contents; output_mode chooses "
        "matching lines with line numbers, file paths only, or counts per file.\n"
        "target='files': find files whose name matches a glob (e.g. '*.py'), newest first.\n"
        "Results are paged with limit and offset."
    ),
    parameters=SEARCH_FILES_PARAMETERS,
    handler=_search_files,
    toolset="file",
)

TOOLS: tuple[Tool, ...] = (READ_FILE_TOOL, WRITE_FILE_TOOL, PATCH_TOOL, SEARCH_FILES_TOOL)

"""A stand-in ``apptainer`` executable: the CLI subset the singularity backend uses, on host processes.

:func:`write_launcher` writes it; pass its path as ``ApptainerSandboxConfig(executable=...)``.
It models the CLI (``instance start/list/stop``, ``exec``), not isolation: commands see
this host, so tests point ``workdir`` and ``home`` at private folders.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ("STATE_DIR_ENV", "main", "write_launcher")

#: Where the stand-in keeps its instances (set by the launcher).
STATE_DIR_ENV = "HERMES_APPTAINER_STANDIN_DIR"

_MARKER = "HERMES_ASYNC_SANDBOX"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def write_launcher(directory: Path, *, state_dir: Path, name: str = "apptainer") -> Path:
    """Write an executable ``directory/name`` that runs the stand-in with ``state_dir``.

    The backend gives the CLI an allowlisted environment, so the launcher carries the state
    directory and import path itself. It runs this file as a script: ``exec`` then imports
    only the standard library (0.1 s instead of 1 s for the package).
    """
    directory.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    package_root = Path(__file__).resolve().parents[2]
    launcher = directory / name
    launcher.write_text(
        "#!/bin/sh\n"
        f"{STATE_DIR_ENV}={shlex.quote(str(state_dir))} "
        f"PYTHONPATH={shlex.quote(str(package_root))} "
        f"exec {shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} "
        '"$@"\n'
    )
    launcher.chmod(0o755)
    return launcher


def _fatal(message: str) -> int:
    print(f"FATAL:   {message}", file=sys.stderr)
    return 255


def _state() -> Path:
    return Path(os.environ[STATE_DIR_ENV])


def _info(name: str) -> dict[str, str] | None:
    try:
        data: dict[str, str] = json.loads((_state() / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return data


def _start(args: list[str]) -> int:
    delay, fail, home = 0.0, False, ""
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--standin-start-delay":
            delay, i = float(args[i + 1]), i + 2
        elif arg == "--standin-fail":
            fail, i = True, i + 1
        elif arg == "--home":
            home, i = args[i + 1].split(":", 1)[-1], i + 2
        elif arg in ("--overlay", "--bind", "-B", "--network", "--net-args", "--workdir"):
            i += 2
        elif arg.startswith("-"):
            i += 1
        else:
            rest.append(arg)
            i += 1
    if len(rest) != 2:
        return _fatal(f"usage: instance start [options] IMAGE NAME (got {rest})")
    image, name = rest
    if fail:
        return _fatal(f"could not start instance {name}: --standin-fail")
    if "://" not in image and not os.path.isfile(image):
        return _fatal(f"could not open image {image}: no such file")
    if _info(name) is not None:
        return _fatal(f"instance {name} already exists")
    home = home or str(_state() / f"{name}.home")
    os.makedirs(home, exist_ok=True)
    init = subprocess.Popen(
        ["sleep", "2147483647"],
        env={"PATH": _PATH, _MARKER: name},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    (_state() / f"{name}.json").write_text(
        json.dumps({"image": image, "home": home, "pid": str(init.pid)})
    )
    if delay:
        time.sleep(delay)
    print(f"INFO:    instance started successfully ({name})", file=sys.stderr)
    return 0


def _list(args: list[str]) -> int:
    print("INSTANCE NAME    PID      IMAGE")
    for path in sorted(_state().glob("*.json")):
        name = path.stem
        info = _info(name)
        if info is not None and (not args or name in args):
            print(f"{name}    {info['pid']}    {info['image']}")
    return 0


def _members(name: str) -> list[int]:
    from hermes_async.tools.sandbox.processes import find_sandbox_processes

    return [pid for pid in find_sandbox_processes(name) if pid != os.getpid()]


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _stop(args: list[str]) -> int:
    force = any(a in ("--force", "-F") for a in args)
    names = [a for a in args if not a.startswith("-")]
    if len(names) != 1:
        return _fatal("usage: instance stop [--force] NAME")
    name = names[0]
    if _info(name) is None:
        return _fatal(f"no instance found with name {name}")
    if not force:
        _signal(_members(name), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while _members(name) and time.monotonic() < deadline:
            time.sleep(0.05)
    for _ in range(100):
        left = _members(name)
        if not left:
            break
        _signal(left, signal.SIGKILL)
        time.sleep(0.02)
    (_state() / f"{name}.json").unlink(missing_ok=True)
    print(f"INFO:    Stopping {name} instance", file=sys.stderr)
    return 0


def _exec(args: list[str]) -> int:
    while args and args[0].startswith("-"):
        args = args[2:] if args[0] in ("--pwd", "--env", "--bind", "-B") else args[1:]
    if len(args) < 2 or not args[0].startswith("instance://"):
        return _fatal("usage: exec [--cleanenv] instance://NAME PROGRAM [ARGS...]")
    name = args[0].removeprefix("instance://")
    info = _info(name)
    if info is None:
        return _fatal(f"instance {name} not found")
    env = {"PATH": _PATH, "HOME": info["home"]}
    for key, value in os.environ.items():
        if key.startswith("APPTAINERENV_"):
            env[key.removeprefix("APPTAINERENV_")] = value
    env[_MARKER] = name
    try:
        os.execvpe(args[1], args[1:], env)
    except OSError as exc:
        return _fatal(f"{args[1]}: {exc}")


def main(argv: list[str] | None = None) -> int:
    """Run one CLI call; the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    while args and args[0] in ("-q", "--quiet", "-s", "--silent"):
        args = args[1:]
    if args[:1] == ["--version"]:
        print("apptainer version 1.3.0-standin")
        return 0
    if args[:2] == ["instance", "start"]:
        return _start(args[2:])
    if args[:2] == ["instance", "stop"]:
        return _stop(args[2:])
    if args[:2] == ["instance", "list"]:
        return _list(args[2:])
    if args[:1] == ["exec"]:
        return _exec(args[1:])
    return _fatal(f"the stand-in does not implement {' '.join(args[:2])!r}")


if __name__ == "__main__":
    sys.exit(main())

"""Hostile Harbor task folders (issue #38, rows T1-T8): one function per attack.

Each writes a task folder (or rows file) under ``root`` and returns its path, for tests
and environment authors to point their loaders at. The function docstrings say the
attack; docs/security.md says what a loader that holds must do with each. Two controls:
:func:`in_tree_link` (a legitimate link, kept) and :func:`plain_task`.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import tarfile
from pathlib import Path

__all__ = (
    "HOSTILE_BASE_IMAGE",
    "huge_file",
    "huge_integer_reward",
    "in_tree_link",
    "link_out",
    "member_bomb",
    "nan_reward",
    "out_of_range_reward",
    "plain_task",
    "unbounded_task",
)

#: The image the generated tasks build from (``scripts/docker/base_image.sh`` builds it).
HOSTILE_BASE_IMAGE = "hermes-async-base:bookworm"


def _task(
    root: Path,
    name: str,
    *,
    test_sh: str,
    toml: str = 'schema_version = "1.1"\n[verifier]\ntimeout_sec = 60.0\n',
    instruction: str = "Do nothing; the verifier decides.\n",
) -> Path:
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "task.toml").write_text(toml)
    (folder / "instruction.md").write_text(instruction)
    (folder / "environment" / "Dockerfile").write_text(f"FROM {HOSTILE_BASE_IMAGE}\nWORKDIR /app\n")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    return folder


def _writes(path: str, content: str) -> str:
    quoted = content.replace("'", "'\"'\"'")
    return f"printf '%s' '{quoted}' > {path}\n"


def plain_task(root: Path, name: str = "plain", reward: float = 1.0) -> Path:
    """A well-behaved task whose verifier writes ``reward`` to ``reward.txt``."""
    return _task(root, name, test_sh=_writes("/logs/verifier/reward.txt", f"{reward:g}"))


def link_out(root: Path, name: str = "t1-link-out", target: str = "/proc/self/environ") -> Path:
    """T1: ``instruction.md`` links to ``/proc/self/environ``; refused at load."""
    folder = plain_task(root, name)
    (folder / "instruction.md").unlink()
    os.symlink(target, folder / "instruction.md")
    return folder


def huge_file(root: Path, name: str = "t3-huge-file", size: int = 3 << 30) -> Path:
    """T3: a sparse file of ``size`` bytes in ``tests/``; refused at load by size."""
    folder = plain_task(root, name)
    with (folder / "tests" / "big.bin").open("wb") as f:
        f.truncate(size)
    return folder


def huge_integer_reward(root: Path, name: str = "t4-huge-integer") -> Path:
    """T4: ``reward.json`` holds a 400-digit integer; an error reading, the pass goes on."""
    return _task(
        root, name, test_sh=_writes("/logs/verifier/reward.json", '{"reward": ' + "9" * 400 + "}")
    )


def out_of_range_reward(root: Path, name: str = "t5-out-of-range", value: str = "1e308") -> Path:
    """T5: ``reward.txt`` holds a number outside Harbor's 0..1; an error reading."""
    return _task(root, name, test_sh=_writes("/logs/verifier/reward.txt", value))


def nan_reward(root: Path, name: str = "t7-nan") -> Path:
    """T7: ``reward.json`` holds ``{"reward": NaN, "tests_total": 5}``; an error reading, never 5."""
    return _task(
        root,
        name,
        test_sh=_writes("/logs/verifier/reward.json", '{"reward": NaN, "tests_total": 5}'),
    )


def unbounded_task(root: Path, name: str = "t8-unbounded") -> Path:
    """T8: absurd resources and timeouts and a verifier that never ends; clamped, killed at the bound."""
    toml = (
        'version = "1.0"\n'
        "[verifier]\ntimeout_sec = 1e308\n"
        "[agent]\ntimeout_sec = 1e308\n"
        '[environment]\ncpus = 1e18\nmemory = "99999999999999999999G"\n'
        "build_timeout_sec = 1e308\n"
    )
    return _task(root, name, test_sh="sleep infinity\n", toml=toml)


def in_tree_link(root: Path, name: str = "in-tree-link") -> Path:
    """A legitimate task with ``tests/dd/x -> ..`` (a link that stays inside ``tests/``)."""
    folder = plain_task(root, name)
    (folder / "tests" / "dd").mkdir()
    os.symlink("..", folder / "tests" / "dd" / "x")
    return folder


def member_bomb(root: Path, name: str = "t6-member-bomb", members: int = 800_000) -> Path:
    """T6: a rows file whose ``tests_tar`` gzips ``members`` empty members; refused at the cap."""
    raw = io.BytesIO()
    header = tarfile.TarInfo("e").tobuf(tarfile.GNU_FORMAT)
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        # The same 512-byte header over and over: the stream is huge, the gzip tiny.
        for _ in range(members):
            gz.write(header)
        gz.write(b"\0" * 1024)  # the end-of-archive marker
    row = {
        "task_name": name,
        "category": "hostile",
        "instruction": "Nothing.",
        "docker_image": HOSTILE_BASE_IMAGE,
        "tests_tar": base64.b64encode(raw.getvalue()).decode("ascii"),
        "test_sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path

"""Task folders written for a test."""

from __future__ import annotations

from pathlib import Path

DOCKERFILE = "FROM hermes-async-base:bookworm\nWORKDIR /app\n"
TEST_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"


def make_task(
    root: Path,
    name: str,
    toml: str = 'schema_version = "1.1"\n',
    *,
    dockerfile: str | None = DOCKERFILE,
    test_sh: str | None = TEST_SH,
    instruction: str | None = "Do the thing.\n",
    solve_sh: str | None = "#!/bin/bash\ntrue\n",
) -> Path:
    """Write a task folder ``root/name`` and return it."""
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text(toml)
    if instruction is not None:
        (folder / "instruction.md").write_text(instruction)
    if dockerfile is not None:
        (folder / "environment" / "Dockerfile").write_text(dockerfile)
    if test_sh is not None:
        (folder / "tests" / "test.sh").write_text(test_sh)
    if solve_sh is not None:
        (folder / "solution").mkdir()
        (folder / "solution" / "solve.sh").write_text(solve_sh)
    return folder

"""The architecture document's invariants name tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`")


def test_every_test_named_in_the_architecture_document_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    current: Path | None = None
    named = 0
    missing: list[str] = []
    for match in REFERENCE.finditer(text):
        path, name = match.group(1), match.group(2)
        if path:
            current = ROOT / path
            if not current.is_file():
                missing.append(path)
                continue
        if name:
            assert current is not None, f"::{name} names no file before it"
            named += 1
            if not re.search(rf"^(async )?def {name}\b", current.read_text("utf-8"), re.M):
                missing.append(f"{current.relative_to(ROOT)}::{name}")
    assert named >= 20
    assert missing == []


def test_the_readme_links_the_architecture_document() -> None:
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text(encoding="utf-8")

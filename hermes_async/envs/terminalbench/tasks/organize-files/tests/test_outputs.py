"""Checks for organize-files."""

from pathlib import Path

SORTED = Path("/app/sorted")
EXPECTED = {
    "txt/notes.txt": "buy milk\ncall Ada\n",
    "csv/Report.CSV": "region,total\nnorth,12\nsouth,7\n",
    "json/data.json": '{"ok": true}\n',
    "other/README": "Read me first.\n",
    "log/server.log": "2024-01-01 started\n2024-01-01 stopped\n",
    "gz/backup.tar.gz": "not really a tarball\n",
}


def test_inbox_is_empty():
    assert Path("/app/inbox").is_dir()
    assert list(Path("/app/inbox").iterdir()) == []


def test_files_sorted_with_contents():
    for rel, content in EXPECTED.items():
        assert (SORTED / rel).read_text() == content, rel


def test_nothing_else_and_no_empty_file():
    found = sorted(p.relative_to(SORTED).as_posix() for p in SORTED.rglob("*") if p.is_file())
    assert found == sorted(EXPECTED)

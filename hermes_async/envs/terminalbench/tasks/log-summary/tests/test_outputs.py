"""Checks for log-summary: the expected report is computed from the log itself."""

from collections import Counter
from pathlib import Path


def expected() -> str:
    counts = Counter(line.split()[8] for line in Path("/app/access.log").read_text().splitlines())
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], int(kv[0])))
    return "".join(f"{code} {n}\n" for code, n in rows)


def test_log_untouched():
    assert len(Path("/app/access.log").read_text().splitlines()) == 240


def test_report():
    report = Path("/app/report.txt").read_text()
    assert report.rstrip("\n") + "\n" == expected()

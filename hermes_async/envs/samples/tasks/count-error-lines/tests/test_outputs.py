"""Checks for count-error-lines: the count is recomputed from the log."""

from pathlib import Path


def test_count():
    log = Path("/app/service.log").read_text().splitlines()
    expected = sum(1 for line in log if line.split()[1] == "ERROR")
    assert Path("/app/errors.txt").read_text().strip() == str(expected)

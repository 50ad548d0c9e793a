"""Checks for sum-csv-column."""

from pathlib import Path


def test_total():
    assert Path("/app/total.txt").read_text().strip() == "525.00"

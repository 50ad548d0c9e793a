"""Checks for fix-backup-script: the script runs, and its archive holds the data."""

import subprocess
import tarfile
from pathlib import Path


def test_archive_holds_the_data():
    with tarfile.open("/app/backups/data.tar.gz") as archive:
        names = sorted(m.name for m in archive.getmembers() if m.isfile())
    assert names == ["data/a.txt", "data/b.txt"]


def test_script_runs_again():
    Path("/app/backups/data.tar.gz").unlink()
    subprocess.run(["/app/backup.sh"], check=True)
    assert Path("/app/backups/data.tar.gz").is_file()

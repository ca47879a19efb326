"""The library zip that executors import (offloader/bulk/shipping.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from offloader.bulk.shipping import library_zip

IMPORT_FROM_ZIP = """
import sys
sys.path.insert(0, sys.argv[1])
import offloader.bulk.export, offloader.objectstore.s3, offloader.scrub.spread
print(offloader.bulk.export.__file__)
print(offloader.scrub.spread.__file__)
"""


def test_executors_import_the_library_from_the_zip(tmp_path: Path) -> None:
    archive = library_zip(tmp_path)
    names = zipfile.ZipFile(archive).namelist()
    assert "offloader/bulk/export.py" in names and "offloader/read/tiered.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    done = subprocess.run(
        [sys.executable, "-I", "-c", IMPORT_FROM_ZIP, str(archive)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        f"{archive}/offloader/bulk/export.py",
        f"{archive}/offloader/scrub/spread.py",  # what scrub's executors run
    ]

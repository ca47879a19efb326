"""The library as a zip for ``spark-submit --py-files``: executors on a standalone cluster
import the same offloader code the submitting task runs, whatever their own install holds."""

from __future__ import annotations

import zipfile
from pathlib import Path

import offloader


def library_zip(directory: Path) -> Path:
    """``directory/offloader.zip`` holding the imported ``offloader`` package (sources and
    package data, no byte code)."""
    package = Path(offloader.__file__).resolve().parent
    archive = directory / "offloader.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                zf.write(path, Path("offloader") / path.relative_to(package))
    return archive

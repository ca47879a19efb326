"""The library zip that executors import (offloader/bulk/shipping.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import offloader
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


def test_the_zip_holds_the_package_sources_as_they_are(tmp_path: Path) -> None:
    """Every file of the imported package under ``offloader/``, byte for byte and
    compressed; no byte code."""
    package = Path(offloader.__file__).resolve().parent
    sources = {
        "offloader/" + p.relative_to(package).as_posix(): p.read_bytes()
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert "offloader/bulk/shipping.py" in sources
    archive = library_zip(tmp_path)
    assert archive == tmp_path / "offloader.zip"
    with zipfile.ZipFile(archive) as zf:
        assert sorted(zf.namelist()) == sorted(sources)
        assert {name: zf.read(name) for name in sources} == sources
        infos = zf.infolist()
    assert sum(i.compress_size for i in infos) < sum(i.file_size for i in infos)


def test_the_zip_leaves_out_byte_code_wherever_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``.pyc`` (also one beside its source, as ``compileall -b`` leaves it) and nothing
    of a ``__pycache__`` folder (also a file that is not ``.pyc``); package data is kept."""
    package = tmp_path / "installed" / "offloader"
    files = {
        "__init__.py": b"",
        "bulk/__init__.py": b"",
        "bulk/export.py": b"x = 1\n",
        "metadata/migrations/0001.sql": b"create table t (x int);\n",
    }
    byte_code = {
        "bulk/export.pyc": b"\x00",
        "__pycache__/__init__.cpython-312.pyc": b"\x00",
        "bulk/__pycache__/export.cpython-312.pyc.1234": b"\x00",
    }
    for name, data in {**files, **byte_code}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_bytes(data)
    monkeypatch.setattr(offloader, "__file__", str(package / "__init__.py"))
    out = tmp_path / "out"
    out.mkdir()
    with zipfile.ZipFile(library_zip(out)) as zf:
        assert {n: zf.read(n) for n in zf.namelist()} == {
            f"offloader/{name}": data for name, data in files.items()
        }

"""The one place that turns any exception into the line an operator reads."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from offloader.diagnostics import describe_error
from offloader.exceptions import NotFoundError, OffloaderError
from offloader.settings import Settings

PASSWORD = "hunter2-secret"


def settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", **values)


def test_library_errors_and_bad_arguments_pass_through(tmp_path: Path) -> None:
    s = settings(tmp_path)
    assert describe_error(NotFoundError("topic 'x' does not exist"), s) == (
        "topic 'x' does not exist"
    )
    assert describe_error(OffloaderError("schema not at head: run offloader db upgrade"), s) == (
        "schema not at head: run offloader db upgrade"
    )
    assert describe_error(ValueError("--count -1: must be\nbetween"), s) == (
        "--count -1: must be between"
    )


def test_settings_errors_name_the_environment_variable() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(upload_concurrency=0, s3_region=3)
    line = describe_error(caught.value)
    assert line.startswith("invalid setting ")
    assert "OFFLOADER_UPLOAD_CONCURRENCY: Input should be greater than or equal to 1" in line
    assert "OFFLOADER_S3_REGION: Input should be a valid string" in line


def test_driver_errors_name_the_metadata_url_and_never_the_password(tmp_path: Path) -> None:
    url = f"postgresql+psycopg2://app:{PASSWORD}@db.example:5432/meta"
    s = settings(tmp_path, metadata_url=url)
    driver_error = Exception(f'could not connect with password "{PASSWORD}":\n timeout')
    exc = sa.exc.OperationalError("SELECT 1", {}, driver_error)
    line = describe_error(exc, s)
    assert line == (
        "metadata database OFFLOADER_METADATA_URL (postgresql+psycopg2://app:***@db.example:5432"
        '/meta) failed: could not connect with password "***": timeout'
    )


def test_unparseable_and_unknown_urls(tmp_path: Path) -> None:
    with pytest.raises(sa.exc.ArgumentError) as bad:
        sa.engine.make_url("garbage")
    assert "does not parse as a SQLAlchemy URL" in describe_error(bad.value, settings(tmp_path))
    s = settings(tmp_path, metadata_url=f"nosuch://u:{PASSWORD}@h/x")
    with pytest.raises(sa.exc.NoSuchModuleError) as unknown:
        sa.create_engine(s.resolved_metadata_url)
    line = describe_error(unknown.value, s)
    assert "OFFLOADER_METADATA_URL (nosuch://u:***@h/x) names an unknown database" in line
    assert PASSWORD not in line


def test_a_missing_module_outside_sqlalchemy_is_not_blamed_on_the_url(tmp_path: Path) -> None:
    try:
        import offloader_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    except ModuleNotFoundError as exc:
        line = describe_error(exc, settings(tmp_path))
    assert "OFFLOADER_METADATA_URL" not in line
    assert line.startswith("unexpected ModuleNotFoundError") and "--debug" in line


@pytest.mark.parametrize(
    ("code", "where", "expected"),
    [
        (
            errno.ENOSPC,
            "ledgers/orders/1.log",
            "ledger directory {d}/ledgers (in OFFLOADER_DATA_DIR={d}): "
            "{d}/ledgers/orders/1.log has no space left on its device",
        ),
        (errno.EEXIST, "", "OFFLOADER_DATA_DIR={d} is not a directory (a file is in the way)"),
        (
            errno.EACCES,
            "objects",
            "object store directory {d}/objects (in OFFLOADER_DATA_DIR={d}) is not "
            "accessible: permission denied",
        ),
    ],
)
def test_os_errors_name_the_configured_directory(
    tmp_path: Path, code: int, where: str, expected: str
) -> None:
    s = settings(tmp_path)
    path = s.data_dir / where if where else s.data_dir
    line = describe_error(OSError(code, "os text", str(path)), s)
    assert line == expected.format(d=s.data_dir)


def test_an_explicit_object_store_dir_is_named_by_its_variable(tmp_path: Path) -> None:
    s = settings(tmp_path, object_store_url=(tmp_path / "objs").as_uri())
    line = describe_error(OSError(errno.EROFS, "x", str(tmp_path / "objs")), s)
    expected = f"object store directory {tmp_path / 'objs'} (from OFFLOADER_OBJECT_STORE_URL)"
    assert line == expected + " is on a read-only file system"


def test_an_explicit_ledger_dir_is_blamed_by_its_own_variable(tmp_path: Path) -> None:
    s = settings(tmp_path, ledger_dir=tmp_path / "hot")
    line = describe_error(OSError(errno.ENOSPC, "x", str(tmp_path / "hot" / "t" / "1.log")), s)
    assert line == (
        f"OFFLOADER_LEDGER_DIR={tmp_path / 'hot'}: {tmp_path / 'hot' / 't' / '1.log'} "
        "has no space left on its device"
    )


def test_anything_else_is_one_line_that_points_at_debug(tmp_path: Path) -> None:
    line = describe_error(RuntimeError("boom\nsecond line"), settings(tmp_path))
    assert line == "unexpected RuntimeError: boom second line (run with --debug for the traceback)"

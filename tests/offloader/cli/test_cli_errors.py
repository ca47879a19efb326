"""Every CLI failure is one clear line with exit status 2: no traceback, no password."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.cli import assert_one_line_error, run_cli, run_cli_json, upgraded_data_dir
from fixtures.databases import require_postgres

PASSWORD = "s3cr3t-Pa55word"


def test_unreachable_postgres_names_the_setting_and_hides_the_password(tmp_path: Path) -> None:
    url = f"postgresql+psycopg2://offloader:{PASSWORD}@127.0.0.1:1/metadata"
    done = run_cli(tmp_path / "d", "status", env={"OFFLOADER_METADATA_URL": url}, ok=False)
    line = assert_one_line_error(done, "OFFLOADER_METADATA_URL", "127.0.0.1:1", "refused")
    assert PASSWORD not in done.stderr + done.stdout and "***" in line


def test_missing_database_is_named(tmp_path: Path) -> None:
    require_postgres()
    url = "postgresql+psycopg2://postgres@127.0.0.1:5432/offloader_no_such_database"
    done = run_cli(tmp_path / "d", "status", env={"OFFLOADER_METADATA_URL": url}, ok=False)
    assert_one_line_error(
        done, "OFFLOADER_METADATA_URL", 'database "offloader_no_such_database" does not exist'
    )


@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        (f"mysql://u:{PASSWORD}@db/x", ("OFFLOADER_METADATA_URL", "'MySQLdb' is not installed")),
        (f"nosuchdb://u:{PASSWORD}@db/x", ("OFFLOADER_METADATA_URL", "unknown database dialect")),
        ("garbage", ("OFFLOADER_METADATA_URL does not parse as a SQLAlchemy URL",)),
    ],
)
def test_bad_metadata_urls_are_named(tmp_path: Path, url: str, fragments: tuple[str]) -> None:
    done = run_cli(tmp_path / "d", "status", env={"OFFLOADER_METADATA_URL": url}, ok=False)
    assert_one_line_error(done, *fragments)
    assert PASSWORD not in done.stderr


def test_data_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    done = run_cli(a_file, "status", ok=False)
    assert_one_line_error(done, f"OFFLOADER_DATA_DIR={a_file} is not a directory")
    assert a_file.read_text() == "x"
    nested = run_cli(a_file / "below", "status", ok=False)
    assert_one_line_error(nested, f"OFFLOADER_DATA_DIR={a_file / 'below'} cannot be created")


def test_impossible_data_dir_is_named() -> None:
    done = run_cli(Path("/proc/offloader-impossible"), "status", ok=False)
    assert_one_line_error(done, "OFFLOADER_DATA_DIR=/proc/offloader-impossible cannot be created")


def test_ledger_dir_that_is_a_file_is_named(tmp_path: Path) -> None:
    a_file = tmp_path / "ledgers-file"
    a_file.write_text("x")
    env = {"OFFLOADER_LEDGER_DIR": str(a_file)}
    done = run_cli(upgraded_data_dir(tmp_path / "d"), "status", env=env, ok=False)
    assert_one_line_error(done, f"OFFLOADER_LEDGER_DIR={a_file} is not a directory")


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"OFFLOADER_UPLOAD_CONCURRENCY": "0"}, "OFFLOADER_UPLOAD_CONCURRENCY: Input should be"),
        ({"OFFLOADER_READ_PREFETCH": "many"}, "OFFLOADER_READ_PREFETCH: Input should be"),
        (
            {"OFFLOADER_DELETE_RETRY_MAX_SECONDS": "1"},
            "OFFLOADER_DELETE_RETRY_MAX_SECONDS must be >= OFFLOADER_DELETE_RETRY_BASE_SECONDS",
        ),
    ],
)
def test_invalid_settings_name_the_environment_variable(
    tmp_path: Path, env: dict[str, str], fragment: str
) -> None:
    assert_one_line_error(run_cli(tmp_path / "d", "status", env=env, ok=False), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--count", "1", "--size", "3000000000"), "--size 3000000000: at most 67108724 bytes"),
        (("--count", "1", "--size", "-1"), "--size -1: must be >= 0"),
        (("--count", "100000000", "--size", "1"), "--count 100000000: must be between 0 and"),
        (("--count", "-1", "--size", "1"), "--count -1: must be between 0 and"),
    ],
)
def test_produce_bounds_are_named_and_change_nothing(
    tmp_path: Path, args: tuple[str, ...], fragment: str
) -> None:
    d = upgraded_data_dir(tmp_path / "d")
    run_cli(d, "topic", "create", "orders")
    assert_one_line_error(run_cli(d, "produce", "orders", *args, ok=False), fragment)
    assert run_cli_json(d, "ledgers", "orders") == []


def test_produce_size_fits_a_block_of_the_topic(tmp_path: Path) -> None:
    d = upgraded_data_dir(tmp_path / "d")
    run_cli(
        d,
        "topic",
        "create",
        "small",
        "--set",
        "max_block_size=65536",
        "--set",
        "read_buffer_size=16384",
        "--set",
        "deletion_lag_seconds=0",
    )
    too_big = run_cli(d, "produce", "small", "--count", "1", "--size", "65397", ok=False)
    assert_one_line_error(too_big, "at most 65396 bytes", "max_block_size of 65536")
    produced = run_cli_json(d, "produce", "small", "--count", "1", "--size", "65396")
    assert produced["entries"] == 1
    assert [
        r["outcome"] for r in run_cli_json(d, "offload", "small", "--up-to", "1")["results"]
    ] == ["offloaded"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("read", "no-such-topic", "--ledger", "1"), "ledger 1 of topic 'no-such-topic' does not"),
        (("read", "t", "--ledger", "99999999999999999999"), "--ledger: invalid 64-bit id value"),
        (("offload", "t", "--up-to", "x"), "--up-to: invalid ledger id (0 or more) value"),
        (("read", "t"), "the following arguments are required: --ledger"),
        (("no-such-command",), "invalid choice: 'no-such-command'"),
    ],
)
def test_bad_commands_on_an_empty_data_dir(
    tmp_path: Path, args: tuple[str, ...], fragment: str
) -> None:
    assert_one_line_error(run_cli(upgraded_data_dir(tmp_path / "d"), *args, ok=False), fragment)


def test_debug_shows_the_traceback_and_still_the_line(tmp_path: Path) -> None:
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    for args in (("--debug", "status"), ("status", "--debug")):
        done = run_cli(a_file, *args, ok=False)
        assert done.returncode == 2
        assert "Traceback (most recent call last)" in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("error: OFFLOADER_DATA_DIR=")

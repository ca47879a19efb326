"""Retention from the console script: policy fields, PIP-17 refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.cli import assert_one_line_error, run_cli, run_cli_json, upgraded_data_dir


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = upgraded_data_dir(tmp_path / "data")
    run_cli(d, "topic", "create", "orders", "--set", "offload_threshold_bytes=1000")
    return d


def test_topic_policy_sets_and_clears_retention(data_dir: Path) -> None:
    policy = run_cli_json(
        data_dir,
        "topic",
        "policy",
        "orders",
        "--set",
        "retention_size_bytes=5000",
        "--set",
        "retention_time_seconds=3600",
    )
    assert policy["retention_size_bytes"] == 5000
    assert policy["retention_time_seconds"] == 3600
    cleared = run_cli_json(
        data_dir, "topic", "policy", "orders", "--set", "retention_size_bytes=none"
    )
    assert cleared["retention_size_bytes"] is None
    assert cleared["retention_time_seconds"] == 3600


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ("topic", "policy", "orders", "--set", "retention_size_bytes=1000"),
            ("offload_threshold_bytes (1000) must be below retention_size_bytes (1000)", "PIP-17"),
        ),
        (
            ("topic", "policy", "orders", "--set", "retention_size_bytes=-1"),
            ("retention_size_bytes", "greater than or equal to 0"),
        ),
        (
            (
                "topic",
                "policy",
                "orders",
                "--set",
                "offload_age_seconds=60",
                "--set",
                "retention_time_seconds=60",
            ),
            ("offload_age_seconds (60.0) must be below retention_time_seconds (60.0)",),
        ),
        (
            ("topic", "create", "t2", "--set", "retention_time_seconds=soon"),
            ("retention_time_seconds", "valid number"),
        ),
    ],
)
def test_policies_breaking_pip17_are_refused_and_change_nothing(
    data_dir: Path, args: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    before = run_cli_json(data_dir, "topic", "policy", "orders")
    assert_one_line_error(run_cli(data_dir, *args, ok=False), *fragments)
    assert run_cli_json(data_dir, "topic", "policy", "orders") == before
    assert [t["name"] for t in run_cli_json(data_dir, "topic", "list")] == ["orders"]

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


def test_retention_command_dry_run_then_apply(data_dir: Path) -> None:
    for _ in range(3):
        run_cli(data_dir, "cut", "create", "orders")
        run_cli(data_dir, "produce", "orders", "--count", "4", "--size", "1000")
    run_cli(data_dir, "topic", "policy", "orders", "--set", "retention_size_bytes=4001")
    cuts = run_cli_json(data_dir, "cut", "list", "orders")
    ledgers = run_cli_json(data_dir, "ledgers", "orders")

    dry = run_cli_json(data_dir, "retention", "orders", "--dry-run")
    # 4001 bytes: the newest ledger (4000) is too little, so the two newest stay
    assert dry["chosen"] == cuts[1] and dry["retained_bytes"] == 8000
    assert dry["end"]["cut_id"] == 0 and dry["trim"]["ledgers_deleting"] == [1]
    assert run_cli_json(data_dir, "ledgers", "orders") == ledgers
    assert run_cli_json(data_dir, "cut", "list", "orders") == cuts

    text = run_cli(data_dir, "retention", "orders").stdout
    assert text.startswith("orders: trimmed at cut 2 (2:0), keeping 8000 bytes"), text
    after = run_cli_json(data_dir, "ledgers", "orders")
    assert [x["deletion_state"] for x in after] == ["deleting", "none", "none"]
    assert len(run_cli_json(data_dir, "cut", "list", "orders")) == 4  # it took one cut
    again = run_cli_json(data_dir, "retention", "orders")
    assert again["trim"]["changed"] is False


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("retention", "nope"), "topic 'nope' does not exist"),
        (("retention",), "the following arguments are required: topic"),
    ],
)
def test_retention_command_errors_are_one_line(data_dir: Path, args, fragment) -> None:
    assert_one_line_error(run_cli(data_dir, *args, ok=False), fragment)
    assert run_cli_json(data_dir, "cut", "list", "orders") == []

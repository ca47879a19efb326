"""`offloader check-service-levels` in a real process on the embedded default: exit 0 when
every level is met, 1 with one line per breach, 2 on an error; the levels are set and
refused through `offloader topic policy`."""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.cli import assert_one_line_error, run_cli, run_cli_json, upgraded_data_dir
from fixtures.clock import wait_past
from offloader.metadata import MetadataStore
from offloader.settings import Settings

CHECK = "check-service-levels"


def produce_and_age(d: Path, topic: str, seconds: float) -> None:
    """Two sealed ledgers of ``topic``, then a wait on the database's clock until the
    newer was sealed more than ``seconds`` ago."""
    run_cli(d, "produce", topic, "--count", "20", "--size", "100")
    metadata = MetadataStore.open(Settings(data_dir=d).resolved_metadata_url)
    try:
        newest = max(x.sealed_ms or 0 for x in metadata.list_ledgers(topic))
        wait_past(metadata, newest + int(seconds * 1000))
    finally:
        metadata.close()


def test_exit_0_when_met_1_with_one_line_per_breach(tmp_path: Path) -> None:
    d = upgraded_data_dir(tmp_path / "data")
    small = ("--set", "ledger_max_entries=10")
    run_cli(d, "topic", "create", "orders", *small, "--set", "max_offload_lag_seconds=1")
    run_cli(d, "topic", "create", "events", *small, "--set", "max_offload_lag_bytes=0")
    run_cli(d, "topic", "create", "quiet", *small)
    assert run_cli(d, CHECK).stdout == "ok: 2 service level(s) met on 3 topic(s)\n"

    for topic in ("orders", "events", "quiet"):
        produce_and_age(d, topic, 1)
    done = run_cli(d, CHECK, ok=False)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["topic events", "topic orders"]
    assert "offload lag 2000 bytes exceeds max_offload_lag_bytes 0 (2 ledgers, " in lines[0]
    assert " exceeds max_offload_lag_seconds 1 (2 ledgers, 2000 bytes not offloaded)" in (lines[1])
    assert done.stderr == ""

    one = run_cli(d, CHECK, "--topic", "orders", "--json", ok=False)
    assert one.returncode == 1
    report = json.loads(one.stdout)
    assert report["topics"] == ["orders"] and not report["ok"]
    [breach] = report["breaches"]
    assert (breach["topic"], breach["level"], breach["limit"]) == (
        "orders",
        "max_offload_lag_seconds",
        1.0,
    )
    assert breach["observed"] > 1.0

    run_cli(d, "offload", "orders", "--up-to", "2")  # the lag is gone
    assert run_cli_json(d, CHECK, "--topic", "orders")["ok"] is True
    assert run_cli(d, CHECK, "--topic", "quiet").stdout.startswith("ok: 0 service level(s)")


def test_errors_exit_2_naming_what_is_wrong(tmp_path: Path) -> None:
    d = upgraded_data_dir(tmp_path / "data")
    assert_one_line_error(run_cli(d, CHECK, "--topic", "missing", ok=False), "'missing'")
    run_cli(d, "topic", "create", "gone")
    run_cli(d, "topic", "delete", "gone")
    assert_one_line_error(run_cli(d, CHECK, "--topic", "gone", ok=False), "was deleted")
    assert_one_line_error(
        run_cli(d, CHECK, env={"OFFLOADER_METADATA_URL": "nope://x"}, ok=False),
        "OFFLOADER_METADATA_URL",
    )


def test_policy_sets_and_refuses_levels_and_a_refusal_changes_nothing(tmp_path: Path) -> None:
    d = upgraded_data_dir(tmp_path / "data")
    run_cli(d, "topic", "create", "orders", "--set", "offload_age_seconds=600")
    policy = run_cli_json(
        d,
        "topic",
        "policy",
        "orders",
        "--set",
        "max_offload_lag_seconds=3600",
        "--set",
        "max_deletion_failing_keys=0",
    )
    assert (policy["max_offload_lag_seconds"], policy["max_deletion_failing_keys"]) == (3600, 0)
    for bad, message in [
        ("max_offload_lag_seconds=0", "max_offload_lag_seconds: Input should be greater than 0"),
        ("max_deletion_failing_keys=-1", "max_deletion_failing_keys: Input should be greater"),
        (
            "max_offload_lag_seconds=300",
            "max_offload_lag_seconds (300.0) must be above offload_age_seconds (600.0)",
        ),
    ]:
        done = run_cli(d, "topic", "policy", "orders", "--set", bad, ok=False)
        assert_one_line_error(done, message)
    assert run_cli_json(d, "topic", "policy", "orders") == policy
    cleared = run_cli_json(d, "topic", "policy", "orders", "--set", "max_offload_lag_seconds=none")
    assert cleared["max_offload_lag_seconds"] is None

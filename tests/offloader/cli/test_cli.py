"""The console script, end to end in a real process on the embedded default."""

from pathlib import Path

import pytest

from fixtures.cli import run_cli, run_cli_json


def test_the_whole_cycle_through_the_cli(tmp_path: Path) -> None:
    d = tmp_path / "data"
    run_cli(d, "db", "upgrade")
    run_cli(
        d,
        "topic",
        "create",
        "orders",
        "--set",
        "deletion_lag_seconds=0",
        "--set",
        "ledger_max_entries=100",
        "--set",
        "max_block_size=65536",
        "--set",
        "read_buffer_size=16384",
    )
    assert [t["name"] for t in run_cli_json(d, "topic", "list")] == ["orders"]
    produced = run_cli_json(
        d, "produce", "orders", "--count", "250", "--size", "1000", "--seed", "3"
    )
    assert produced["sealed_ledgers"] == [1, 2, 3]
    ledgers = run_cli_json(d, "ledgers", "orders")
    assert [x["entry_count"] for x in ledgers] == [100, 100, 50]
    before = run_cli_json(d, "checksum", "orders")
    assert before["entries"] == 250 and before["bytes"] == 250_000

    offload = run_cli_json(d, "offload", "orders", "--up-to", "2")
    assert [r["outcome"] for r in offload["results"]] == ["offloaded", "offloaded"]
    assert [h["ledger_id"] for h in offload["hot_deleted"]] == [1, 2]
    assert run_cli_json(d, "checksum", "orders") == before
    assert run_cli_json(d, "checksum", "orders", "--source", "auto") == before

    entries = run_cli_json(
        d, "read", "orders", "--ledger", "2", "--first", "5", "--last", "7", "--payload"
    )
    assert [e["entry_id"] for e in entries] == [5, 6, 7]
    assert all(e["size"] == 1000 for e in entries)
    status = run_cli_json(d, "status")
    assert status["ledgers_by_state"] == {"sealed/offloaded/deleted": 2, "sealed/none/present": 1}
    [tiers] = status["tiers"]
    assert (tiers["topic"], tiers["hot_ledgers"], tiers["offloaded_ledgers"]) == ("orders", 1, 2)
    assert tiers["hot_bytes"] > 0 and tiers["offloaded_bytes"] > tiers["hot_bytes"]
    assert "topic orders: hot 1 ledger(s) " in run_cli(d, "status").stdout
    assert run_cli_json(d, "offload", "orders", "--up-to", "2")["results"] == []
    assert run_cli_json(d, "gc")["remaining"] == 0
    policy = run_cli_json(d, "topic", "policy", "orders", "--set", "read_priority=hot-first")
    assert policy["read_priority"] == "hot-first"
    assert "read_priority = hot-first" in run_cli(d, "topic", "policy", "orders").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("topic", "create", "t", "--set", "max_block_size=12"), "max_block_size: Input should"),
        (("topic", "create", "t", "--set", "colour=red"), "unknown policy field"),
        (("topic", "create", "t", "--set", "nonsense"), "--set takes FIELD=VALUE"),
        (("produce", "missing", "--count", "1", "--size", "1"), "topic 'missing' does not"),
        (("read", "missing", "--ledger", "1"), "does not exist"),
    ],
)
def test_bad_input_is_named_and_changes_nothing(tmp_path: Path, args, message) -> None:
    d = tmp_path / "data"
    run_cli(d, "db", "upgrade")
    done = run_cli(d, *args, ok=False)
    assert done.returncode == 2
    assert message in done.stderr
    assert run_cli_json(d, "topic", "list") == []


def test_bad_settings_are_named(tmp_path: Path) -> None:
    env = {"OFFLOADER_OBJECT_STORE_URL": "ftp://nowhere"}
    done = run_cli(tmp_path / "data", "status", env=env, ok=False)
    assert done.returncode == 2
    assert "OFFLOADER_OBJECT_STORE_URL" in done.stderr and "file:///" in done.stderr

"""`offloader rewrite` in a real process on the embedded default: what it prints (text and
--json), the one-line errors that change nothing, and `offloader gc` recovering a dead
rewrite. The crash cases are test_rewrite_crash.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fixtures.cli import assert_one_line_error, run_cli, run_cli_json, upgraded_data_dir

GROUP = "orders: 3 ledger object(s) of ledgers"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """Ten offloaded ledgers of 50 entries of 300 bytes (about 16 KB each), hot copies
    deleted."""
    d = upgraded_data_dir(tmp_path / "data")
    run_cli(
        d,
        "topic",
        "create",
        "orders",
        *("--set", "deletion_lag_seconds=0", "--set", "ledger_max_entries=50"),
        *("--set", "max_block_size=65536", "--set", "read_buffer_size=16384"),
    )
    run_cli(d, "produce", "orders", "--count", "500", "--size", "300")
    run_cli(d, "offload", "orders", "--up-to", "10")
    return d


def rewrite(d: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    return run_cli(d, "rewrite", "--target-bytes", "60000", "--small-bytes", "20000", *args, ok=ok)


def test_compaction_through_the_cli_prints_each_group_and_the_totals(data_dir: Path) -> None:
    d = data_dir
    before = run_cli_json(d, "checksum", "orders")
    dry = rewrite(d, "--dry-run").stdout.splitlines()
    assert dry[:3] == [
        f"{GROUP} {a}..{a + 2} (6 objects, 47184 bytes): would be rewritten" for a in (1, 4, 7)
    ]
    assert dry[3] == "compact: would rewrite 3 group(s): objects 18 -> 6, bytes 141552"
    assert run_cli_json(d, "status")["segments_by_state"] == {}

    done = run_cli_json(d, "rewrite", "orders", "--target-bytes", "60000", "--small-bytes", "20000")
    assert [(g["ledgers"], g["outcome"]) for g in done["groups"]] == [
        ([1, 2, 3], "rewritten"),
        ([4, 5, 6], "rewritten"),
        ([7, 8, 9], "rewritten"),
    ]
    assert done["totals"]["objects_before"] == 18 and done["totals"]["objects_after"] == 6
    assert run_cli_json(d, "checksum", "orders") == before
    status = run_cli_json(d, "status")
    assert status["segments_by_origin"] == {"rewrite/offloaded": 3}
    again = rewrite(d).stdout.splitlines()
    assert again == [
        "(nothing to rewrite)",
        "compact: rewrote 0 group(s): objects 0 -> 0, bytes 0 -> 0",
    ]
    # a range and a mode: the last ledger alone is migrated to v2
    migrated = rewrite(d, "--mode", "to-v2", "--ledgers", "10:10", ok=False)
    assert migrated.returncode == 2  # --small-bytes is compaction's only
    migrated = run_cli_json(d, "rewrite", "--mode", "to-v2", "--ledgers", "10:10")
    assert [(g["ledgers"], g["outcome"]) for g in migrated["groups"]] == [([10], "rewritten")]
    assert run_cli_json(d, "checksum", "orders") == before
    # and the first three back to v1 objects of their own
    back = run_cli_json(d, "rewrite", "--mode", "to-v1", "--ledgers", "1:3")
    assert [(g["ledgers"], g["outcome"]) for g in back["groups"]] == [
        ([i], "rewritten") for i in (1, 2, 3)
    ]
    modes = {x["ledger_id"]: x["offload_mode"] for x in run_cli_json(d, "ledgers", "orders")}
    assert [modes[i] for i in range(1, 11)] == ["ledger"] * 3 + ["stream"] * 7
    assert run_cli_json(d, "checksum", "orders") == before


BAD = [
    (["--target-bytes", "0"], ["target_bytes: 0 is less than the minimum of 1"]),
    (["--ledgers", "9"], ["ledgers '9': expected FIRST:LAST"]),
    (["--ledgers", "9:3"], ["first_ledger 9 is above last_ledger 3"]),
    (["--mode", "to-v1", "--small-bytes", "5"], ["small_bytes applies to mode compact only"]),
    (["nope"], ["topic 'nope' does not exist"]),
    (["--max-groups", "0"], ["max_groups: 0 is less than the minimum of 1"]),
]


def test_bad_arguments_are_one_line_and_change_nothing(data_dir: Path) -> None:
    before = run_cli_json(data_dir, "ledgers", "orders")
    for args, fragments in BAD:
        assert_one_line_error(run_cli(data_dir, "rewrite", *args, ok=False), *fragments)
    assert run_cli_json(data_dir, "ledgers", "orders") == before
    status = run_cli_json(data_dir, "status")
    assert status["segments_by_state"] == {} and status["deletions_by_state"] == {}
    usage = run_cli(data_dir, "rewrite", "--mode", "defrag", ok=False)
    assert usage.returncode == 2 and "invalid choice: 'defrag'" in usage.stderr

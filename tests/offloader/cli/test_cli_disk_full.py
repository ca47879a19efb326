"""The hot tier's disk fills up during produce: one clear line, nothing acknowledged lost.

The ledger directory is a 2 MiB tmpfs mounted for the test (needs root: mount(2) cannot be
faked for a real ENOSPC). Metadata and objects stay on the ordinary disk.
"""

from __future__ import annotations

import base64
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.cli import assert_one_line_error, run_cli, run_cli_json, upgraded_data_dir

ENTRY_SIZE = 10_000
ENTRIES = 400  # 4 MB: twice what the file system holds
SEED = 5


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards."""
    mount_point = tmp_path / "hot"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        reason = f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}"
        if os.environ.get("CI"):  # CI runs as root: a skip there would hide the case
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def read_topic(data_dir: Path, env: dict[str, str], topic: str) -> list[bytes]:
    """Every entry of every ledger, oldest first."""
    payloads = []
    for ledger in run_cli_json(data_dir, "ledgers", topic, env=env):
        entries = run_cli_json(
            data_dir, "read", topic, "--ledger", str(ledger["ledger_id"]), "--payload", env=env
        )
        payloads += [base64.b64decode(e["payload_b64"]) for e in entries]
    return payloads


def test_full_hot_tier_fails_cleanly_and_keeps_what_it_acknowledged(
    tmp_path: Path, small_filesystem: Path
) -> None:
    d = tmp_path / "data"
    env = {"OFFLOADER_LEDGER_DIR": str(small_filesystem)}
    policy = [
        "ledger_max_entries=20",
        "deletion_lag_seconds=0",
        "max_block_size=262144",
        "read_buffer_size=65536",
    ]
    upgraded_data_dir(d, env=env)
    run_cli(d, "topic", "create", "orders", *[a for p in policy for a in ("--set", p)], env=env)

    args = ("--count", str(ENTRIES), "--size", str(ENTRY_SIZE), "--seed", str(SEED))
    done = run_cli(d, "produce", "orders", *args, env=env, ok=False)
    assert_one_line_error(done, str(small_filesystem), "no space left")

    # Acknowledged: every entry of a ledger that was sealed (fsynced and recorded).
    ledgers = run_cli_json(d, "ledgers", "orders", env=env)
    acknowledged = sum(x["entry_count"] for x in ledgers if x["state"] == "sealed")
    assert 0 < acknowledged < ENTRIES
    assert [x["state"] for x in ledgers].count("open") == 1

    # The operator frees space (offload, then the hot copies go) and writes again: the
    # writer's recovery seals the open ledger, cutting the partial record.
    sealed = [x["ledger_id"] for x in ledgers if x["state"] == "sealed"]
    offload = run_cli_json(d, "offload", "orders", "--up-to", str(max(sealed)), env=env)
    assert [h["ledger_id"] for h in offload["hot_deleted"]] == sealed
    run_cli(d, "produce", "orders", "--count", "0", "--size", "0", env=env)
    assert {x["state"] for x in run_cli_json(d, "ledgers", "orders", env=env)} == {"sealed"}

    rng = random.Random(SEED)
    expected = [rng.randbytes(ENTRY_SIZE) for _ in range(ENTRIES)]
    readable = read_topic(d, env, "orders")
    assert len(readable) >= acknowledged
    assert readable == expected[: len(readable)]

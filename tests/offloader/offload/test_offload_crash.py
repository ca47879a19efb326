"""Crash safety: a real offloader process killed with SIGKILL across the offload sequence.

After every crash, running again converges: every ledger offloaded once, every entry
readable with the same checksum, and no object in the store that the metadata neither
references nor queues for deletion (and after GC, none queued either).
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from fixtures.backends import make_topic, produce_ledgers, settings_env, unaccounted_objects
from offloader.failpoints import POINTS
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import AttemptState, HotState
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime


def run_cli(rt: Runtime, *args: str, failpoints: str = "") -> subprocess.Popen[bytes]:
    env = {**os.environ, **settings_env(rt.settings), "OFFLOADER_FAILPOINTS": failpoints}
    return subprocess.Popen(
        [sys.executable, "-m", "offloader.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def setup_topic(rt: Runtime) -> tuple[list[int], str]:
    # 3 blocks of 5 MiB on S3 (multipart), then a single-block ledger
    make_topic(rt, deletion_lag_seconds=0)
    ids = produce_ledgers(rt, "orders", [(24, 1024 * 1024), (50, 2000)])
    return ids, TopicReader(rt).checksum("orders", Source.HOT).digest


def converge(rt: Runtime, ids: list[int], checksum: str) -> None:
    time.sleep(rt.settings.attempt_lease_seconds + 0.2)  # a dead attempt's lease runs out
    done = run_cli(rt, "offload", "orders", "--up-to", str(ids[-1]))
    _, err = done.communicate(timeout=120)
    assert done.returncode == 0, err.decode()
    for ledger_id in ids:
        ledger = rt.metadata.get_ledger("orders", ledger_id)
        assert ledger.is_offloaded and ledger.hot_state is HotState.DELETED
    assert TopicReader(rt).checksum("orders").digest == checksum
    assert TopicReader(rt).checksum("orders", Source.TIERED).digest == checksum
    assert unaccounted_objects(rt) == set()
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert gc.remaining == 0
    committed = {rt.metadata.get_ledger("orders", i).data_key for i in ids} | {
        rt.metadata.get_ledger("orders", i).index_key for i in ids
    }
    assert {info.key for info in rt.objects.list()} == committed
    assert list(rt.objects.list_multipart_uploads()) == []


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_point_then_rerun_converges(runtime: Runtime, point: str) -> None:
    ids, checksum = setup_topic(runtime)
    crashed = run_cli(runtime, "offload", "orders", "--up-to", str(ids[-1]), failpoints=point)
    crashed.communicate(timeout=120)
    assert crashed.returncode == -signal.SIGKILL, f"{point} was never reached"
    converge(runtime, ids, checksum)


def test_sigkill_at_a_random_moment(runtime: Runtime) -> None:
    ids, checksum = setup_topic(runtime)
    victim = run_cli(runtime, "offload", "orders", "--up-to", str(ids[-1]))
    # wait until the first attempt is recorded, then kill somewhere in the upload
    deadline = time.monotonic() + 60
    while not runtime.metadata.list_attempts("orders") and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    converge(runtime, ids, checksum)


def test_zombie_woken_after_takeover_cannot_commit(runtime: Runtime) -> None:
    """A frozen offloader (SIGSTOP mid-upload) loses its lease; a second one takes over and
    commits; the zombie, woken with SIGCONT, loses the commit and queues its own objects."""
    rt = runtime
    ids, checksum = setup_topic(rt)
    zombie = run_cli(
        rt, "offload", "orders", "--up-to", str(ids[0]), failpoints="after-first-part:stop"
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        attempts = rt.metadata.list_attempts("orders")
        if attempts and _is_stopped(zombie.pid):
            break
        time.sleep(0.02)
    else:
        pytest.fail("the zombie never reached its stop point")
    (zombie_attempt,) = attempts
    time.sleep(rt.settings.attempt_lease_seconds + 0.2)
    winner = run_cli(rt, "offload", "orders", "--up-to", str(ids[0]))
    winner.communicate(timeout=120)
    assert winner.returncode == 0
    ledger = rt.metadata.get_ledger("orders", ids[0])
    assert ledger.is_offloaded and ledger.offload_uuid != zombie_attempt.attempt_id
    process_deletions(rt.metadata, rt.stores, rt.settings)  # runs before the zombie wakes

    zombie.send_signal(signal.SIGCONT)
    out, err = zombie.communicate(timeout=120)
    assert zombie.returncode == 0, err.decode()
    assert b"lost" in out
    assert rt.metadata.get_ledger("orders", ids[0]).offload_uuid == ledger.offload_uuid
    assert rt.metadata.get_attempt(zombie_attempt.attempt_id).state is AttemptState.SUPERSEDED
    assert unaccounted_objects(rt) == set()
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert not any(
        k.startswith(zombie_attempt.attempt_id) for k in (i.key for i in rt.objects.list())
    )
    assert list(rt.objects.list_multipart_uploads()) == []
    converge(rt, ids, checksum)


def _is_stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"

"""The batched path: many small ledgers of one topic in flight in one task, the metadata work
of a window in one transaction per step, the invariants still held per ledger."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from fixtures.backends import (
    make_topic,
    produce_ledgers,
    run_in_threads,
    settings_env,
    unaccounted_objects,
)
from fixtures.counting import CountingStore, counting_transactions
from offloader.exceptions import NotFoundError
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import AttemptState, OffloadState
from offloader.metadata.store import AttemptIntent
from offloader.offload.keys import ledger_object_keys
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.offload.runs import offload_batch
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime

SMALL = [(8, 2000)] * 7  # seven one-block ledgers
WINDOW = 3  # windows [1, 2, 3], [4, 5, 6], [7]


def small_topic(rt: Runtime) -> tuple[list[int], str]:
    make_topic(rt)
    ids = produce_ledgers(rt, "orders", SMALL)
    return ids, TopicReader(rt).checksum("orders", Source.HOT).digest


def committed_attempts(rt: Runtime, ledger_id: int) -> list[str]:
    return [
        a.attempt_id
        for a in rt.metadata.list_attempts("orders", AttemptState.COMMITTED)
        if a.ledger_id == ledger_id
    ]


def assert_converged(rt: Runtime, ids: list[int], checksum: str) -> None:
    """Every ledger offloaded by exactly one committed attempt, nothing leaked."""
    for ledger_id in ids:
        ledger = rt.metadata.get_ledger("orders", ledger_id)
        assert ledger.is_offloaded
        assert committed_attempts(rt, ledger_id) == [ledger.offload_uuid]
    assert TopicReader(rt).checksum("orders", Source.TIERED).digest == checksum
    assert unaccounted_objects(rt) == set()
    assert process_deletions(rt.metadata, rt.stores, rt.settings).remaining == 0
    committed = set()
    for ledger_id in ids:
        ledger = rt.metadata.get_ledger("orders", ledger_id)
        committed |= {ledger.data_key, ledger.index_key}
    assert {info.key for info in rt.objects.list()} == committed


BATCH_SCRIPT = """
import sys
from offloader.offload.runs import offload_batch
from offloader.runtime import Runtime
with Runtime.open() as rt:
    ids = [int(x) for x in sys.argv[1].split(",")]
    for r in offload_batch(rt, "orders", ids, window=int(sys.argv[2])):
        print(r.ledger_id, r.outcome)
"""


def start_batch(
    rt: Runtime, ids: list[int], failpoints: str = "", **env_overrides: str
) -> subprocess.Popen[bytes]:
    """``offload_batch`` in a child process, as an Airflow task would run it."""
    env = {
        **os.environ,
        **settings_env(rt.settings),
        "OFFLOADER_FAILPOINTS": failpoints,
        **env_overrides,
    }
    return subprocess.Popen(
        [sys.executable, "-c", BATCH_SCRIPT, ",".join(map(str, ids)), str(WINDOW)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def run_batch(rt: Runtime, ids: list[int], failpoints: str = "") -> subprocess.CompletedProcess:
    child = start_batch(rt, ids, failpoints)
    out, err = child.communicate(timeout=120)
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


# point -> (attempts STARTED, attempts COMMITTED) right after the SIGKILL
CRASH_STATE = {
    "mid-batch-begin": (0, 0),  # the begin transaction rolled back whole
    "after-begin-attempt": (WINDOW, 0),
    "after-first-ledger-upload": (WINDOW, 0),
    "mid-batch-commit": (WINDOW, 0),  # the commit transaction rolled back whole
    "after-commit": (0, WINDOW),  # the first window committed, nothing else begun
}


@pytest.mark.parametrize("point", list(CRASH_STATE))
def test_sigkill_mid_batch_then_rerun_converges(runtime: Runtime, point: str) -> None:
    rt = runtime
    ids, checksum = small_topic(rt)
    crashed = run_batch(rt, ids, failpoints=point)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()
    started, committed = CRASH_STATE[point]
    assert len(rt.metadata.list_attempts("orders", AttemptState.STARTED)) == started
    assert len(rt.metadata.list_attempts("orders", AttemptState.COMMITTED)) == committed
    offloading = [
        x.ledger_id
        for x in rt.metadata.list_ledgers("orders")
        if x.offload_state is OffloadState.OFFLOADING
    ]
    assert offloading == ids[:started]
    assert unaccounted_objects(rt) == set()

    time.sleep(rt.settings.attempt_lease_seconds + 0.2)  # the dead attempts' leases run out
    rerun = run_batch(rt, ids)
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert_converged(rt, ids, checksum)


def test_a_frozen_batch_loses_only_the_ledger_taken_over(runtime: Runtime) -> None:
    """A batch frozen mid-upload (SIGSTOP) outlives its leases; another worker takes over
    one ledger of its window and commits. Woken, the batch commits the others and reports
    that one ledger LOST, its objects queued."""
    rt = runtime
    ids, checksum = small_topic(rt)
    # one upload at a time: frozen after ledger 1, ledger 2 has no objects yet
    zombie = start_batch(
        rt,
        ids,
        failpoints="after-first-ledger-upload:stop",
        OFFLOADER_UPLOAD_CONCURRENCY="1",
    )
    deadline = time.monotonic() + 60
    while not _is_stopped(zombie.pid):
        assert time.monotonic() < deadline, "the batch never reached its stop point"
        time.sleep(0.02)
    taken = rt.metadata.get_ledger("orders", ids[1]).attempt_id
    assert taken is not None
    time.sleep(rt.settings.attempt_lease_seconds + 0.2)
    winner = LedgerOffloader(rt).offload_ledger("orders", ids[1])
    assert winner.outcome is Outcome.OFFLOADED

    zombie.send_signal(signal.SIGCONT)
    out, err = zombie.communicate(timeout=120)  # a frozen child is never left behind
    assert zombie.returncode == 0, err.decode()
    outcomes = dict(line.split() for line in out.decode().splitlines())
    assert outcomes == {
        str(i): str(Outcome.LOST if i == ids[1] else Outcome.OFFLOADED) for i in ids
    }
    assert rt.metadata.get_ledger("orders", ids[1]).offload_uuid == winner.attempt_id
    lost = rt.metadata.get_attempt(taken)
    assert lost.state is AttemptState.SUPERSEDED
    assert {lost.data_key, lost.index_key} <= {
        d.object_key for d in rt.metadata.pending_deletions()
    }
    assert_converged(rt, ids, checksum)


def _is_stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_two_batches_over_the_same_ledgers_commit_each_once(runtime: Runtime) -> None:
    """Two workers run the same batch at once, one in the reverse order: each ledger is
    committed by exactly one attempt, the other worker reports why it did not."""
    rt = runtime
    ids, checksum = small_topic(rt)
    barrier = threading.Barrier(2)
    results = []
    orders = iter([ids, ids[::-1]])
    lock = threading.Lock()

    def batch() -> None:
        with lock:
            mine_ids = next(orders)
        with Runtime.open(rt.settings) as mine:
            barrier.wait()
            results.extend(offload_batch(mine, "orders", mine_ids, window=WINDOW))

    assert run_in_threads(batch, 2) == []
    for ledger_id in ids:
        outcomes = [r.outcome for r in results if r.ledger_id == ledger_id]
        assert len(outcomes) == 2
        assert outcomes.count(Outcome.OFFLOADED) == 1, outcomes
        assert set(outcomes) <= {
            Outcome.OFFLOADED,
            Outcome.IN_PROGRESS,
            Outcome.ALREADY_OFFLOADED,
            Outcome.LOST,
        }
    assert_converged(rt, ids, checksum)


def test_a_window_shares_its_transactions_and_uploads_side_by_side(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt)
    ids = produce_ledgers(rt, "orders", [(8, 2000)] * 12)
    counting = CountingStore(rt.objects)
    rt.objects = counting  # type: ignore[assignment]
    with counting_transactions(rt.metadata.engine) as transactions:
        results = offload_batch(rt, "orders", ids, window=6)
    assert [r.outcome for r in results] == [Outcome.OFFLOADED] * 12
    # one data PUT and one index PUT per small ledger, nothing else
    assert counting.requests == {"put": 24}
    # several ledgers in flight, never more than the upload pool
    assert 1 < counting.max_in_flight <= rt.settings.upload_concurrency
    # per window: read, begin, commit (+ the policy, + a lease renewal if a window is slow);
    # one ledger at a time took three transactions a ledger (36)
    assert transactions.count <= 12, transactions.count


def test_settled_ledgers_are_skipped_with_their_outcome(runtime: Runtime) -> None:
    rt = runtime
    ids, _ = small_topic(rt)
    first = offload_batch(rt, "orders", ids[:1])
    ledger = rt.metadata.get_ledger("orders", ids[1])
    _, live = rt.metadata.begin_attempt(
        ledger, "live-attempt", "live-d", "live-i", "other", 60_000, store_id=rt.stores.default_id()
    )
    results = offload_batch(rt, "orders", ids[:3], window=WINDOW)
    assert [(r.outcome, r.attempt_id) for r in results[:2]] == [
        (Outcome.ALREADY_OFFLOADED, first[0].attempt_id),
        (Outcome.IN_PROGRESS, live.attempt_id),
    ]
    assert results[2].outcome is Outcome.OFFLOADED
    assert rt.metadata.get_ledger("orders", ids[1]).attempt_id == live.attempt_id


@pytest.mark.parametrize(
    ("ledger_ids", "error", "message"),
    [
        ([1, 2, 99], NotFoundError, r"ledgers \[99\] of topic 'orders' do not exist"),
        ([1, 2, 1], ValueError, "ledger ids must be unique"),
        ([1, "2"], TypeError, "ledger ids must be integers"),
    ],
)
def test_a_bad_batch_is_refused_before_anything_changes(
    runtime: Runtime, ledger_ids: list, error: type, message: str
) -> None:
    small_topic(runtime)
    with pytest.raises(error, match=message):
        offload_batch(runtime, "orders", ledger_ids)
    for window in (0, 1001, True):
        with pytest.raises(ValueError, match="window must be an integer from 1 to 1000"):
            offload_batch(runtime, "orders", [1, 2], window=window)
    assert runtime.metadata.list_attempts("orders") == []
    assert list(runtime.objects.list()) == []


def test_a_lost_commit_makes_only_that_ledger_lost(runtime: Runtime) -> None:
    """commit_offloads: one attempt was superseded meanwhile; it alone is retired and its
    objects queued, in the same transaction as the others' commits."""
    rt = runtime
    ids, _ = small_topic(rt)
    ledgers = rt.metadata.get_ledgers("orders", ids[:3])
    intents = []
    for n, ledger_id in enumerate(ids[:3]):
        keys = ledger_object_keys(f"attempt-{n}", ledger_id)
        intents.append(AttemptIntent(ledgers[ledger_id], f"attempt-{n}", *keys))
    attempts = rt.metadata.begin_attempts(
        intents, "me", lease_ms=-1, store_id=rt.stores.default_id()
    )  # leases already over
    assert sorted(attempts) == ids[:3]
    zombie = attempts[ids[1]]
    _, winner = rt.metadata.begin_attempt(
        rt.metadata.get_ledger("orders", ids[1]),
        "winner",
        "w-d",
        "w-i",
        "other",
        60_000,
        store_id=rt.stores.default_id(),
    )
    # one renewal for the batch: only the superseded attempt is reported lost
    assert rt.metadata.renew_leases(attempts.values(), 60_000) == {zombie.attempt_id}
    committed = rt.metadata.commit_offloads([(a, 10) for a in attempts.values()])
    assert committed == {attempts[ids[0]].attempt_id, attempts[ids[2]].attempt_id}
    assert rt.metadata.get_ledger("orders", ids[0]).offload_uuid == "attempt-0"
    assert rt.metadata.get_ledger("orders", ids[2]).offload_uuid == "attempt-2"
    assert rt.metadata.get_ledger("orders", ids[1]).attempt_id == winner.attempt_id
    assert rt.metadata.get_attempt(zombie.attempt_id).state is AttemptState.SUPERSEDED
    queued = [d.object_key for d in rt.metadata.pending_deletions()]
    # queued when superseded, and again by the lost commit (objects written late)
    assert queued.count(zombie.data_key) == 2 and queued.count(zombie.index_key) == 2

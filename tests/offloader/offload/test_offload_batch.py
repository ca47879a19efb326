"""The batched path: many small ledgers of one topic in flight in one task, the metadata work
of a window in one transaction per step, the invariants still held per ledger."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from fixtures.backends import (
    make_topic,
    produce_ledgers,
    run_in_threads,
    unaccounted_objects,
)
from fixtures.cli import child_env, is_stopped
from fixtures.counting import CountingStore, counting_transactions
from fixtures.faults import with_objects
from fixtures.metadata import ledger_record, list_attempts, pending_deletions
from fixtures.takeover import OnPut, take_over
from offloader import failpoints
from offloader.exceptions import NotFoundError, ObjectStoreError
from offloader.format import ENTRY_FRAME, HEADER_LEN, encode_blocks
from offloader.gc.deletion_queue import process_deletions
from offloader.hottier.writer import recover_open_ledgers
from offloader.keys import ledger_object_keys
from offloader.metadata import Attempt, AttemptState, OffloadState, Position
from offloader.metadata.attempts import AttemptIntent
from offloader.offload.batch import BatchOffloader
from offloader.offload.ledger_offloader import LedgerOffloader, OffloadResult, Outcome
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
        for a in list_attempts(rt.metadata, "orders", AttemptState.COMMITTED)
        if a.ledger_id == ledger_id
    ]


def assert_converged(rt: Runtime, ids: list[int], checksum: str) -> None:
    """Every ledger offloaded by exactly one committed attempt, nothing leaked."""
    for ledger_id in ids:
        ledger = rt.metadata.get_ledger("orders", ledger_id)
        assert ledger.is_offloaded
        assert committed_attempts(rt, ledger_id) == [ledger.offload_attempt_id]
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
    env = child_env(rt.settings, env=env_overrides, failpoints=failpoints)
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
    assert len(list_attempts(rt.metadata, "orders", AttemptState.STARTED)) == started
    assert len(list_attempts(rt.metadata, "orders", AttemptState.COMMITTED)) == committed
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
    while not is_stopped(zombie):
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
    assert rt.metadata.get_ledger("orders", ids[1]).offload_attempt_id == winner.attempt_id
    lost = rt.metadata.attempts.get(taken)
    assert lost.state is AttemptState.SUPERSEDED
    assert {lost.data_key, lost.index_key} <= {d.object_key for d in pending_deletions(rt.metadata)}
    assert_converged(rt, ids, checksum)


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
    _, live = rt.metadata.attempts.begin(
        ledger, "live-attempt", "live-d", "live-i", "other", 60_000, store_id=rt.stores.default_id()
    )
    results = offload_batch(rt, "orders", ids[:3], window=WINDOW)
    assert results[:2] == [
        OffloadResult("orders", ids[0], Outcome.ALREADY_OFFLOADED, first[0].attempt_id),
        OffloadResult("orders", ids[1], Outcome.IN_PROGRESS, live.attempt_id),
    ]
    assert results[2].outcome is Outcome.OFFLOADED
    assert rt.metadata.get_ledger("orders", ids[1]).attempt_id == live.attempt_id


def test_trimmed_empty_and_tiny_ledgers_in_a_batch(runtime: Runtime) -> None:
    """Below the topic's start: trimmed, never uploaded (the start ledger itself moves); an
    empty ledger takes the single-ledger path's rule (retired, nothing uploaded); a ledger
    of one entry is uploaded like any other."""
    rt = runtime
    make_topic(rt)
    ids = produce_ledgers(rt, "orders", [(3, 100), (3, 100)])
    # a writer that died between allocating a ledger and creating its file leaves it empty
    rt.metadata.allocate_ledger("orders", rt.metadata.claim_writer("orders").writer_epoch)
    (empty,) = recover_open_ledgers(rt.metadata, rt.hot, "orders")
    ids += [empty.ledger_id, *produce_ledgers(rt, "orders", [(1, 100)])]
    rt.metadata.retention.move_start(
        rt.metadata.get_topic("orders"), Position(ledger_id=ids[1], entry_id=0)
    )
    results = offload_batch(rt, "orders", ids, window=WINDOW)
    assert [(r.topic, r.ledger_id, r.outcome) for r in results] == [
        ("orders", ids[0], Outcome.TRIMMED),
        ("orders", ids[1], Outcome.OFFLOADED),
        ("orders", ids[2], Outcome.RETIRED_EMPTY),
        ("orders", ids[3], Outcome.OFFLOADED),
    ]
    ledgers = {x.ledger_id: x for x in rt.metadata.list_ledgers("orders")}
    assert [ledgers[i].is_offloaded for i in ids] == [False, True, False, True]
    assert offload_batch(rt, "orders", []) == []


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
    for window in (1, 1000):  # the bounds themselves are windows
        assert BatchOffloader(LedgerOffloader(runtime), window).window == window
    epoch = runtime.metadata.claim_writer("orders").writer_epoch
    opened = runtime.metadata.allocate_ledger("orders", epoch).ledger_id
    with pytest.raises(ValueError) as still_open:
        offload_batch(runtime, "orders", [1, opened])
    assert str(still_open.value) == (
        f"ledgers [{opened}] of orders are open; only sealed ledgers move"
    )
    assert list_attempts(runtime.metadata, "orders") == []
    assert list(runtime.objects.list()) == []


def test_a_lost_commit_makes_only_that_ledger_lost(runtime: Runtime) -> None:
    """commit_batch: one attempt was superseded meanwhile; it alone is retired and its
    objects queued, in the same transaction as the others' commits."""
    rt = runtime
    ids, _ = small_topic(rt)
    ledgers = rt.metadata.get_ledgers("orders", ids[:3])
    intents = []
    for n, ledger_id in enumerate(ids[:3]):
        keys = ledger_object_keys(f"attempt-{n}", ledger_id)
        intents.append(AttemptIntent(ledgers[ledger_id], f"attempt-{n}", *keys))
    attempts = rt.metadata.attempts.begin_batch(
        intents, "me", lease_ms=-1, store_id=rt.stores.default_id()
    )  # leases already over
    assert sorted(attempts) == ids[:3]
    zombie = attempts[ids[1]]
    _, winner = rt.metadata.attempts.begin(
        rt.metadata.get_ledger("orders", ids[1]),
        "winner",
        "w-d",
        "w-i",
        "other",
        60_000,
        store_id=rt.stores.default_id(),
    )
    # one renewal for the batch: only the superseded attempt is reported lost
    assert rt.metadata.attempts.renew_batch(attempts.values(), 60_000) == {zombie.attempt_id}
    committed = rt.metadata.attempts.commit_batch([(a, 10) for a in attempts.values()])
    assert committed == {attempts[ids[0]].attempt_id, attempts[ids[2]].attempt_id}
    assert rt.metadata.get_ledger("orders", ids[0]).offload_attempt_id == "attempt-0"
    assert rt.metadata.get_ledger("orders", ids[2]).offload_attempt_id == "attempt-2"
    assert rt.metadata.get_ledger("orders", ids[1]).attempt_id == winner.attempt_id
    assert rt.metadata.attempts.get(zombie.attempt_id).state is AttemptState.SUPERSEDED
    queued = [d.object_key for d in pending_deletions(rt.metadata)]
    # queued when superseded, and again by the lost commit (objects written late)
    assert queued.count(zombie.data_key) == 2 and queued.count(zombie.index_key) == 2


# --- in-process takeovers and failures (the fast tests see the batch's every branch) ---


def on_put_of(ledger_id: int, role: str, action: Callable[[], None]) -> Callable[[str], None]:
    """A put hook that runs ``action`` once, at the put of ledger ``ledger_id``'s data or
    index object."""
    suffix = f"-ledger-{ledger_id}" + ("-index" if role == "index" else "")
    done: list[bool] = []

    def hook(key: str) -> None:
        if key.endswith(suffix) and not done:
            done.append(True)
            action()

    return hook


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def assert_lost_to_winner(rt: Runtime, result: OffloadResult, lost: int) -> None:
    """``result`` reports ledger ``lost`` LOST by its own (superseded) attempt; the winner
    still holds the ledger; the zombie's keys were queued at the takeover and again when
    it gave up (it may have written objects after the first deletion)."""
    assert result == OffloadResult(
        "orders", lost, Outcome.LOST, result.attempt_id, 0, result.seconds
    )
    assert rt.metadata.get_ledger("orders", lost).attempt_id == "winner"
    zombie = rt.metadata.attempts.get(result.attempt_id or "")
    assert (zombie.ledger_id, zombie.state) == (lost, AttemptState.SUPERSEDED)
    assert zombie.detail == "lease expired; superseded by winner"
    queued = [d.object_key for d in pending_deletions(rt.metadata)]
    assert sorted(queued) == sorted([zombie.data_key, zombie.index_key] * 2)


def assert_committed(rt: Runtime, result: OffloadResult) -> None:
    ledger = rt.metadata.get_ledger("orders", result.ledger_id)
    assert result.outcome is Outcome.OFFLOADED
    assert (ledger.offload_attempt_id, ledger.data_len) == (result.attempt_id, result.bytes)
    # FORMAT.md: the objects are named after the attempt's own uuid
    assert (ledger.data_key, ledger.index_key) == ledger_object_keys(
        result.attempt_id or "", result.ledger_id
    )
    assert result.bytes == rt.objects.stat(ledger.data_key).size > 0


def test_a_ledger_lost_at_the_commit_is_the_only_one_lost(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Another worker takes ledger 2 over once its objects are written: the window's
    commit commits ledgers 1 and 3 and reports 2 LOST, nothing raised."""
    rt = runtime
    ids, _ = small_topic(rt)
    hook = on_put_of(ids[1], "index", lambda: take_over(rt, "orders", ids[1]))
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="offloader.offload.batch"):
        results = offload_batch(with_objects(rt, OnPut(rt.objects, after=hook)), "orders", ids[:3])
    elapsed = time.monotonic() - started
    assert [(r.ledger_id, r.outcome) for r in results] == [
        (ids[0], Outcome.OFFLOADED),
        (ids[1], Outcome.LOST),
        (ids[2], Outcome.OFFLOADED),
    ]
    assert_committed(rt, results[0])
    assert_committed(rt, results[2])
    assert_lost_to_winner(rt, results[1], ids[1])
    # the window's ledgers moved together: each reports the window's time
    assert results[0].seconds == results[1].seconds == results[2].seconds
    assert 0 < results[0].seconds < elapsed
    assert warnings_of(caplog) == [f"offload of orders/{ids[1]} lost the commit"]
    (summary,) = [r.getMessage() for r in caplog.records if "ledgers in" in r.getMessage()]
    assert re.fullmatch(r"offloaded 2 of 3 ledgers in \d+\.\d{3}s", summary)
    assert unaccounted_objects(rt) == set()


def test_a_ledger_lost_mid_upload_stops_there_and_only_it_is_lost(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease keeper finds ledger 2 taken over while its data object uploads: its
    index is never written, the attempt gives up LOST; ledgers 1 and 3 commit."""
    rt = runtime
    ids, _ = small_topic(rt)

    def taken_over_and_noticed() -> None:
        first = rt.metadata.get_ledger("orders", ids[0]).attempt_lease_ms or 0
        take_over(rt, "orders", ids[1])
        # the keeper's next renewal (it renews the whole window) finds ledger 2 gone
        deadline = time.monotonic() + 30
        while (rt.metadata.get_ledger("orders", ids[0]).attempt_lease_ms or 0) <= first:
            assert time.monotonic() < deadline, "the lease keeper never renewed"
            time.sleep(0.02)
        time.sleep(0.1)  # the renewal's result reaches the keeper's lost set

    hook = on_put_of(ids[1], "data", taken_over_and_noticed)
    with caplog.at_level(logging.WARNING, logger="offloader.offload.batch"):
        results = offload_batch(with_objects(rt, OnPut(rt.objects, before=hook)), "orders", ids[:3])
    assert [r.outcome for r in results] == [Outcome.OFFLOADED, Outcome.LOST, Outcome.OFFLOADED]
    assert_lost_to_winner(rt, results[1], ids[1])
    assert results[1].seconds == 0.0  # gave up before the commit: no time to report
    zombie = rt.metadata.attempts.get(results[1].attempt_id or "")
    assert not rt.objects.exists(zombie.index_key)
    assert warnings_of(caplog) == [
        f"offload of orders/{ids[1]} lost: attempt {zombie.attempt_id} lost ledger "
        f"orders/{ids[1]} to another attempt"
    ]
    assert unaccounted_objects(rt) == set()


class InjectedPutError(ObjectStoreError):
    pass


def failing_put(ledger_id: int) -> Callable[[], None]:
    def fail() -> None:
        raise InjectedPutError(f"injected: PUT of ledger {ledger_id} refused")

    return fail


def test_upload_errors_fail_their_ledgers_after_the_others_commit(runtime: Runtime) -> None:
    """Ledgers 1 and 4 fail to upload, ledger 2 is lost to a takeover as it fails, ledger
    3 uploads: 3 commits, 2 is LOST to the winner, 1 and 4 are each failed with their own
    error and freed (their keys queued), and the first ledger's error is raised."""
    rt = runtime
    ids, _ = small_topic(rt)
    failing = (ids[0], ids[3])

    def taken_over_then_refused() -> None:
        take_over(rt, "orders", ids[1])
        failing_put(ids[1])()

    hooks = [on_put_of(i, "data", failing_put(i)) for i in failing]
    hooks.append(on_put_of(ids[1], "data", taken_over_then_refused))

    def before(key: str) -> None:
        for hook in hooks:
            hook(key)

    with pytest.raises(InjectedPutError) as raised:
        offload_batch(with_objects(rt, OnPut(rt.objects, before=before)), "orders", ids[:4])
    assert str(raised.value) == f"injected: PUT of ledger {ids[0]} refused"
    assert rt.metadata.get_ledger("orders", ids[2]).is_offloaded
    assert rt.metadata.get_ledger("orders", ids[1]).attempt_id == "winner"
    failed = list_attempts(rt.metadata, "orders", AttemptState.FAILED)
    assert sorted((a.ledger_id, a.detail) for a in failed) == [
        (i, f"InjectedPutError: injected: PUT of ledger {i} refused") for i in failing
    ]
    for ledger_id in failing:
        ledger = rt.metadata.get_ledger("orders", ledger_id)
        assert (ledger.offload_state, ledger.attempt_id, ledger.attempt_lease_ms) == (
            OffloadState.NONE,
            None,
            None,
        )
    (zombie,) = list_attempts(rt.metadata, "orders", AttemptState.SUPERSEDED)
    queued = [d.object_key for d in pending_deletions(rt.metadata)]
    assert sorted(queued) == sorted(
        [k for a in failed for k in (a.data_key, a.index_key)]
        + [zombie.data_key, zombie.index_key] * 2
    )
    rerun = offload_batch(rt, "orders", ids[:4])
    assert [r.outcome for r in rerun] == [
        Outcome.OFFLOADED,
        Outcome.IN_PROGRESS,  # the winner's lease
        Outcome.ALREADY_OFFLOADED,
        Outcome.OFFLOADED,
    ]


def test_an_upload_error_after_a_takeover_is_lost_not_raised(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever broke the upload is moot once another attempt owns the ledger: LOST."""
    rt = runtime
    ids, _ = small_topic(rt)

    def taken_over_then_refused() -> None:
        take_over(rt, "orders", ids[1])
        failing_put(ids[1])()

    hook = on_put_of(ids[1], "data", taken_over_then_refused)
    with caplog.at_level(logging.WARNING, logger="offloader.offload.batch"):
        results = offload_batch(with_objects(rt, OnPut(rt.objects, before=hook)), "orders", ids[:3])
    assert [r.outcome for r in results] == [Outcome.OFFLOADED, Outcome.LOST, Outcome.OFFLOADED]
    assert_lost_to_winner(rt, results[1], ids[1])
    assert warnings_of(caplog) == [
        f"offload of orders/{ids[1]} lost: injected: PUT of ledger {ids[1]} refused"
    ]


def test_a_ledger_taken_between_the_read_and_the_begin_is_reported_as_found(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the batch's read and its begin transaction another worker offloads ledger
    1 and starts on ledger 2: the begin skips both, and they are reported as they are
    now (already offloaded; in progress under the other attempt)."""
    rt = runtime
    ids, _ = small_topic(rt)
    begin_attempts = rt.metadata.attempts.begin_batch
    other: list[OffloadResult] = []

    def another_worker_first(*args: Any, **kwargs: Any) -> dict[int, Attempt]:
        if not other:
            other.append(LedgerOffloader(rt).offload_ledger("orders", ids[0]))
            take_over(rt, "orders", ids[1])
        return begin_attempts(*args, **kwargs)

    monkeypatch.setattr(rt.metadata.attempts, "begin_batch", another_worker_first)
    results = offload_batch(rt, "orders", ids[:3])
    assert results[:2] == [
        OffloadResult("orders", ids[0], Outcome.ALREADY_OFFLOADED, other[0].attempt_id),
        OffloadResult("orders", ids[1], Outcome.IN_PROGRESS, "winner"),
    ]
    assert_committed(rt, results[2])


def test_a_lease_ending_this_millisecond_is_over(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch reads a lease ending exactly at the database's now as over (the rule
    of ``attempt_lease_ms <= now`` in SQL), so the stale attempt is superseded."""
    rt = runtime
    ids, _ = small_topic(rt)
    ledger = rt.metadata.get_ledger("orders", ids[0])
    rt.metadata.attempts.begin(
        ledger, "stale", "stale-d", "stale-i", "dead worker", -1, store_id=rt.stores.default_id()
    )
    lease_end = rt.metadata.get_ledger("orders", ids[0]).attempt_lease_ms
    monkeypatch.setattr(rt.metadata, "db_now_ms", lambda: lease_end)
    (result,) = offload_batch(rt, "orders", ids[:1])
    assert result.outcome is Outcome.OFFLOADED
    assert rt.metadata.attempts.get("stale").state is AttemptState.SUPERSEDED


def test_a_failed_commit_fails_the_whole_window(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit transaction fails (the database went away): no ledger of the window
    committed, so each attempt is failed with that error and its ledger freed."""
    rt = runtime
    ids, _ = small_topic(rt)

    def unreachable(*args: object, **kwargs: object) -> set[str]:
        raise ConnectionError("database unreachable")

    monkeypatch.setattr(rt.metadata.attempts, "commit_batch", unreachable)
    with pytest.raises(ConnectionError):
        offload_batch(rt, "orders", ids[:3])
    failed = list_attempts(rt.metadata, "orders", AttemptState.FAILED)
    assert sorted((a.ledger_id, a.detail) for a in failed) == [
        (i, "ConnectionError: database unreachable") for i in ids[:3]
    ]
    for ledger in rt.metadata.list_ledgers("orders")[:3]:
        assert (ledger.offload_state, ledger.attempt_id) == (OffloadState.NONE, None)
    queued = [d.object_key for d in pending_deletions(rt.metadata)]
    assert sorted(queued) == sorted(k for a in failed for k in (a.data_key, a.index_key))


def test_a_window_reaches_each_crash_point_once(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batched crash points (what the SIGKILL tests arm) are each reached once a
    window, in the order of the sequence; small ledgers upload from the ledger pool,
    their leases begun at the configured length."""
    rt = runtime
    ids, _ = small_topic(rt)
    reached: list[str] = []
    monkeypatch.setattr(failpoints, "reach", reached.append)
    threads: list[str] = []
    leases_left: list[int] = []

    def before(key: str) -> None:  # while uploading, every lease is about its length ahead
        threads.append(threading.current_thread().name)
        now = rt.metadata.db_now_ms()
        window = rt.metadata.list_ledgers("orders")[:3]
        leases_left.extend((x.attempt_lease_ms or 0) - now for x in window)

    offload_batch(with_objects(rt, OnPut(rt.objects, before=before)), "orders", ids[:3])
    assert len(leases_left) == 6 * 3
    assert all(1000 < left <= rt.settings.attempt_lease_seconds * 1000 for left in leases_left)
    batch_points = [p for p in reached if p not in ("after-data-upload", "after-index-upload")]
    assert batch_points == [
        "mid-batch-begin",
        "after-begin-attempt",
        "after-first-ledger-upload",
        "mid-batch-commit",
        "after-commit",
    ]
    assert len(reached) == len(batch_points) + 2 * 3  # data and index of each ledger
    assert len(threads) == 6 and all(t.startswith("upload-ledger") for t in threads)


def test_a_ledger_uploads_in_the_ledger_pool_exactly_when_it_encodes_to_one_block(
    runtime: Runtime,
) -> None:
    """The batch's small/large split estimates a ledger's encoded size from its record; at
    the boundary it must agree with the encoder: exactly max_block_size is one block (the
    ledger pool), one byte more is two (alone, its parts in flight)."""
    block = 64 * 1024
    make_topic(runtime, max_block_size=block)
    batch = BatchOffloader(LedgerOffloader(runtime), 4)
    for count in (2, 10):
        exact = block - HEADER_LEN - count * ENTRY_FRAME
        for size, single in ((exact - 1, True), (exact, True), (exact + 1, False)):
            record = ledger_record(1, size=size, entry_count=count)
            assert batch._single_block(record) is single, (count, size)
            payloads = [b"x" * (size // count)] * (count - 1)
            payloads.append(b"x" * (size - sum(map(len, payloads))))
            blocks = list(encode_blocks(enumerate(payloads), max_block_size=block))
            assert (len(blocks) == 1) is single, (count, size)

"""The lease keeper: an attempt's lease never lapses while it is kept, and a lost lease stops
the upload (invariant 6).

Real metadata stores on both backends; the only stand-in is a store whose renewal fails
once, a database hiccup the real server cannot produce on demand.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.takeover import take_over
from offloader.exceptions import CommitFailedError
from offloader.keys import ledger_object_keys
from offloader.metadata import Attempt, now_ms
from offloader.metadata.attempts import AttemptIntent, AttemptStore
from offloader.offload import lease
from offloader.offload.lease import LeaseKeeper
from offloader.runtime import Runtime

LEASE_SECONDS = 1.0  # renewed every third: 0.33 s of slack before it could lapse


def begin(rt: Runtime, lease_ms: int) -> Attempt:
    """A fresh attempt on the topic's first ledger (a new ledger on the first call)."""
    if not rt.metadata.list_topics():
        make_topic(rt)
        produce_ledgers(rt, "orders", [(3, 100)])
    ledger = rt.metadata.list_ledgers("orders")[0]
    attempt_id = str(uuid.uuid4())
    data_key, index_key = ledger_object_keys(attempt_id, ledger.ledger_id)
    _, attempt = rt.metadata.attempts.begin(
        ledger, attempt_id, data_key, index_key, "test", lease_ms, store_id=rt.stores.default_id()
    )
    return attempt


def lease_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "offload-lease"]


def assert_still_owned(rt: Runtime, attempt: Attempt) -> None:
    ledger = rt.metadata.get_ledger(attempt.topic, attempt.ledger_id)
    assert ledger.attempt_id == attempt.attempt_id
    assert ledger.attempt_lease_ms is not None and ledger.attempt_lease_ms > now_ms()
    with pytest.raises(CommitFailedError, match="in flight until its lease ends"):
        begin(rt, 1000)  # a competitor cannot take the ledger over


def test_a_kept_lease_outlives_its_length_then_renewal_stops(runtime: Runtime) -> None:
    rt = runtime
    attempt = begin(rt, int(LEASE_SECONDS * 1000))
    with LeaseKeeper(rt.metadata.attempts, attempt, LEASE_SECONDS) as keeper:
        (thread,) = lease_threads()
        assert thread.daemon  # a worker dying mid-upload must not hang on this thread
        time.sleep(2.5 * LEASE_SECONDS)
        keeper.check()
        assert_still_owned(rt, attempt)
    assert lease_threads() == []
    last = rt.metadata.get_ledger(attempt.topic, attempt.ledger_id).attempt_lease_ms
    time.sleep(0.5 * LEASE_SECONDS)
    assert rt.metadata.get_ledger(attempt.topic, attempt.ledger_id).attempt_lease_ms == last


def test_a_lease_taken_over_makes_check_raise_and_stops_renewing(runtime: Runtime) -> None:
    rt = runtime
    stale = begin(rt, 100)
    time.sleep(0.3)  # the lease ran out: the next attempt supersedes this one
    winner = begin(rt, 60_000)
    with LeaseKeeper(rt.metadata.attempts, stale, 0.3) as keeper:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and lease_threads():
            time.sleep(0.02)
        assert lease_threads() == []  # the keeper gave up after the failed renewal
        with pytest.raises(CommitFailedError) as lost:
            keeper.check()
    assert str(lost.value) == (
        f"attempt {stale.attempt_id} lost ledger {stale.topic}/{stale.ledger_id} to another attempt"
    )
    ledger = rt.metadata.get_ledger(stale.topic, stale.ledger_id)
    assert ledger.attempt_id == winner.attempt_id


class RecordedRenewals:
    """The real attempt store, recording each lease renewal asked of it (when, how long);
    with ``fail_first`` the first one raises instead, a database hiccup."""

    def __init__(self, attempts: AttemptStore, *, fail_first: bool = False) -> None:
        self._attempts = attempts
        self._fail_first = fail_first
        self.calls: list[tuple[float, int]] = []  # (time.monotonic(), lease_ms)

    def renew(self, attempt: Attempt, lease_ms: int) -> bool:
        self.calls.append((time.monotonic(), lease_ms))
        if self._fail_first and len(self.calls) == 1:
            raise ConnectionError("database connection lost")
        return self._attempts.renew(attempt, lease_ms)


def test_a_failed_renewal_is_retried_at_the_next_interval(runtime: Runtime) -> None:
    rt = runtime
    attempt = begin(rt, int(LEASE_SECONDS * 1000))
    flaky = RecordedRenewals(rt.metadata.attempts, fail_first=True)
    with LeaseKeeper(flaky, attempt, LEASE_SECONDS) as keeper:  # type: ignore[arg-type]
        time.sleep(2.5 * LEASE_SECONDS)
        keeper.check()
        assert len(flaky.calls) >= 3
        assert_still_owned(rt, attempt)


def test_each_renewal_asks_for_the_whole_lease_a_third_of_it_after_the_last(
    runtime: Runtime,
) -> None:
    rt = runtime
    attempt = begin(rt, int(LEASE_SECONDS * 1000))
    renewals = RecordedRenewals(rt.metadata.attempts)
    started = time.monotonic()
    with LeaseKeeper(renewals, attempt, LEASE_SECONDS):  # type: ignore[arg-type]
        deadline = time.monotonic() + 10
        while len(renewals.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert [lease_ms for _, lease_ms in renewals.calls[:2]] == [1000, 1000]  # LEASE_SECONDS
    # the keeper waits a full third between renewals (a loaded machine only makes it later)
    first, second = (at for at, _ in renewals.calls[:2])
    assert first - started >= LEASE_SECONDS / 3 - 0.001
    assert second - first >= LEASE_SECONDS / 3 - 0.001


class RenewalHangs:
    """A renewal that never returns until released: a database that stopped answering
    (a hang the real server cannot be made to produce on demand)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def renew(self, attempt: Attempt, lease_ms: int) -> bool:
        self.entered.set()
        self.release.wait(60)
        return False


def test_leaving_does_not_wait_for_a_renewal_stuck_on_the_database(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    monkeypatch.setattr(lease, "STOP_GRACE_SECONDS", 0.2)
    attempt = begin(rt, 300)
    stuck = RenewalHangs()
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger=lease.__name__),
        LeaseKeeper(stuck, attempt, 0.3),  # type: ignore[arg-type]
    ):
        assert stuck.entered.wait(10)
    assert time.monotonic() - started < 5  # the interval (0.1 s) plus the grace, not 60 s
    (thread,) = lease_threads()  # left behind, a daemon, still in the renewal
    assert [r.getMessage() for r in caplog.records] == [
        "lease renewal of 1 attempt(s) did not stop within 0 s; left to end on its own"
    ]
    stuck.release.set()
    thread.join(10)
    assert lease_threads() == []


def begin_window(rt: Runtime, count: int, lease_ms: int) -> list[Attempt]:
    """Fresh attempts on ``count`` new ledgers of one topic, begun together as a batch."""
    make_topic(rt)
    ids = produce_ledgers(rt, "orders", [(3, 100)] * count)
    ledgers = rt.metadata.get_ledgers("orders", ids)
    intents = []
    for ledger_id in ids:
        attempt_id = str(uuid.uuid4())
        intents.append(
            AttemptIntent(
                ledgers[ledger_id], attempt_id, *ledger_object_keys(attempt_id, ledger_id)
            )
        )
    attempts = rt.metadata.attempts.begin_batch(
        intents, "test", lease_ms, store_id=rt.stores.default_id()
    )
    return [attempts[i] for i in ids]


def test_a_batch_keeper_holds_every_lease_and_checks_each_attempt(runtime: Runtime) -> None:
    rt = runtime
    attempts = begin_window(rt, 3, int(LEASE_SECONDS * 1000))
    with LeaseKeeper(rt.metadata.attempts, attempts, LEASE_SECONDS) as keeper:
        time.sleep(2.5 * LEASE_SECONDS)
        for attempt in attempts:
            keeper.check(attempt.attempt_id)
            ledger = rt.metadata.get_ledger("orders", attempt.ledger_id)
            assert ledger.attempt_id == attempt.attempt_id
            assert (ledger.attempt_lease_ms or 0) > rt.metadata.db_now_ms()
        with pytest.raises(TypeError) as no_id:
            keeper.check()
    assert str(no_id.value) == "a batch's lease keeper checks one attempt: pass its attempt_id"
    assert lease_threads() == []


def test_a_batch_keeper_gives_up_only_the_ledger_taken_over(runtime: Runtime) -> None:
    """One ledger of the window is taken over: only its attempt's check raises, and the
    keeper goes on renewing the others (and stops once every one is lost)."""
    rt = runtime
    attempts = begin_window(rt, 2, int(LEASE_SECONDS * 1000))
    lost, kept = attempts
    with LeaseKeeper(rt.metadata.attempts, attempts, LEASE_SECONDS) as keeper:
        take_over(rt, "orders", lost.ledger_id)
        time.sleep(2.5 * LEASE_SECONDS)
        with pytest.raises(CommitFailedError) as raised:
            keeper.check(lost.attempt_id)
        assert str(raised.value) == (
            f"attempt {lost.attempt_id} lost ledger orders/{lost.ledger_id} to another attempt"
        )
        keeper.check(kept.attempt_id)
        ledger = rt.metadata.get_ledger("orders", kept.ledger_id)
        assert (ledger.attempt_lease_ms or 0) > rt.metadata.db_now_ms()
        assert lease_threads() != []  # one attempt still to keep
        take_over(rt, "orders", kept.ledger_id, "second winner")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and lease_threads():
            time.sleep(0.02)
        assert lease_threads() == []  # every attempt lost: nothing left to renew
        with pytest.raises(CommitFailedError):
            keeper.check(kept.attempt_id)

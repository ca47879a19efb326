"""What the single-ledger path answers for each state a ledger can be in, in-process (fast,
on both pairings): the whole OffloadResult, not only its outcome, since runs report and
record every field of it (topic, ledger, attempt, bytes, time)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import pytest

from fixtures.backends import make_topic, produce_ledgers, unaccounted_objects
from fixtures.faults import with_objects
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.takeover import OnPut, take_over
from offloader.exceptions import CommitFailedError, ObjectExistsError
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.keys import ledger_object_keys
from offloader.metadata import AttemptState, DeletionState, Position
from offloader.offload.ledger_offloader import LedgerOffloader, OffloadResult, Outcome
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime

LOGGER = "offloader.offload.ledger_offloader"


def sealed(rt: Runtime, count: int = 1) -> list[int]:
    make_topic(rt)
    return produce_ledgers(rt, "orders", [(20, 2000)] * count)


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_an_offload_reports_its_attempt_bytes_and_time(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """The result and the operator's log line carry the committed attempt, the data
    object's size and the time the offload took (measured around the call)."""
    rt = runtime
    (ledger_id,) = sealed(rt)
    before = time.monotonic()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        result = LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    took = time.monotonic() - before
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    assert ledger.data_key is not None and ledger.data_len is not None
    assert ledger.data_len == rt.objects.stat(ledger.data_key).size
    assert result == OffloadResult(
        "orders", ledger_id, Outcome.OFFLOADED, ledger.offload_attempt_id, ledger.data_len,
        result.seconds,
    )  # fmt: skip
    assert 0 < result.seconds <= took
    assert messages(caplog, logging.INFO) == [
        f"offloaded orders/{ledger_id}: {ledger.data_len} bytes in {result.seconds:.3f}s "
        f"(attempt {ledger.offload_attempt_id})"
    ]


def test_an_offloaded_ledger_is_reported_with_its_offload(runtime: Runtime) -> None:
    rt = runtime
    (ledger_id,) = sealed(rt)
    first = LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    again = LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    assert again == OffloadResult("orders", ledger_id, Outcome.ALREADY_OFFLOADED, first.attempt_id)


def test_ledgers_below_the_start_are_trimmed_and_the_start_ledger_moves(
    runtime: Runtime,
) -> None:
    """A trim killed right after moving the start leaves the ledgers below it live (not yet
    marked): they are reported trimmed and never uploaded; the start's own ledger moves."""
    rt = runtime
    ids = sealed(rt, 3)
    rt.metadata.retention.move_start(
        rt.metadata.get_topic("orders"), Position(ledger_id=ids[1], entry_id=0)
    )
    assert rt.metadata.get_ledger("orders", ids[0]).is_live
    offloader = LedgerOffloader(rt)
    assert offloader.offload_ledger("orders", ids[0]) == OffloadResult(
        "orders", ids[0], Outcome.TRIMMED
    )
    assert list_attempts(rt.metadata, "orders") == [] and set(rt.objects.list()) == set()
    assert offloader.offload_ledger("orders", ids[1]).outcome is Outcome.OFFLOADED


def test_an_open_ledger_is_refused_naming_it(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt)
    owned = rt.metadata.claim_writer("orders")
    ledger = rt.metadata.allocate_ledger("orders", owned.writer_epoch)
    with pytest.raises(ValueError) as refused:
        LedgerOffloader(rt).offload_ledger("orders", ledger.ledger_id)
    assert str(refused.value) == (
        f"ledger orders/{ledger.ledger_id} is open; only sealed ledgers move"
    )
    assert rt.metadata.get_ledger("orders", ledger.ledger_id) == ledger


def test_an_empty_sealed_ledger_is_retired_not_uploaded(runtime: Runtime) -> None:
    """A writer killed right after opening a ledger leaves it empty; the next writer's
    recovery seals it with no entries, and the offloader removes its hot file."""
    rt = runtime
    (full,) = sealed(rt)
    owned = rt.metadata.claim_writer("orders")
    empty = rt.metadata.allocate_ledger("orders", owned.writer_epoch)
    rt.hot.create("orders", empty.ledger_id).close()
    ManagedLedgerWriter(rt.metadata, rt.hot, "orders").close()  # recovery seals it empty
    assert rt.metadata.get_ledger("orders", empty.ledger_id).entry_count == 0
    result = LedgerOffloader(rt).offload_ledger("orders", empty.ledger_id)
    assert result == OffloadResult("orders", empty.ledger_id, Outcome.RETIRED_EMPTY)
    assert not rt.hot.exists("orders", empty.ledger_id)
    assert list_attempts(rt.metadata, "orders") == [] and set(rt.objects.list()) == set()
    assert rt.hot.exists("orders", full)


def test_a_live_attempt_is_left_alone_even_with_its_objects_complete(runtime: Runtime) -> None:
    """Another worker uploaded both objects and is about to commit: its lease is live, so
    the ledger is in progress under it; only a lease that ran out lets a run finish it."""
    rt = runtime
    (ledger_id,) = sealed(rt)
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    ledger, live = rt.metadata.attempts.begin(
        ledger, "live", *ledger_object_keys("live", ledger_id), "other worker", 60_000,
        store_id=rt.stores.default_id(),
    )  # fmt: skip
    LedgerOffloader(rt)._upload(ledger, live, lambda: None)
    result = LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    assert result == OffloadResult("orders", ledger_id, Outcome.IN_PROGRESS, "live")
    assert rt.metadata.get_ledger("orders", ledger_id) == ledger
    assert rt.metadata.attempts.get("live").state is AttemptState.STARTED


@pytest.mark.parametrize("other", ["begins", "commits"])
def test_a_ledger_taken_between_the_read_and_the_begin(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    """Another worker begins (or finishes) the ledger after this run read it free and
    before its begin: the begin's compare-and-set fails, and the ledger is reported as it
    is now, under the other worker's attempt; this run records and uploads nothing."""
    rt = runtime
    (ledger_id,) = sealed(rt)
    begin_attempt = rt.metadata.attempts.begin
    theirs: list[OffloadResult] = []

    def another_worker_first(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(rt.metadata.attempts, "begin", begin_attempt)  # the race, once
        if other == "begins":
            take_over(rt, "orders", ledger_id)
        else:
            theirs.append(LedgerOffloader(rt).offload_ledger("orders", ledger_id))
        return begin_attempt(*args, **kwargs)

    monkeypatch.setattr(rt.metadata.attempts, "begin", another_worker_first)
    result = LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    if other == "begins":
        assert result == OffloadResult("orders", ledger_id, Outcome.IN_PROGRESS, "winner")
        assert [a.attempt_id for a in list_attempts(rt.metadata, "orders")] == ["winner"]
    else:
        assert theirs[0].outcome is Outcome.OFFLOADED
        # the ledger row no longer names an attempt once committed
        assert result == OffloadResult("orders", ledger_id, Outcome.ALREADY_OFFLOADED)
        assert [a.attempt_id for a in list_attempts(rt.metadata, "orders")] == [
            theirs[0].attempt_id
        ]
    assert pending_deletions(rt.metadata) == [] and unaccounted_objects(rt) == set()


def test_an_offload_whose_ledger_is_trimmed_meanwhile_is_lost(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A trim takes the ledger while its objects upload (superseding the attempt): the
    commit finds it no longer the attempt's, so the offload is lost, not raised, and the
    keys are queued (again: the index was written after the trim queued them)."""
    rt = runtime
    ids = sealed(rt, 2)

    def trim_before_the_index(key: str) -> None:
        if key.endswith("-index"):
            trim_topic(rt, "orders", Position(ledger_id=ids[1], entry_id=0))

    objects = OnPut(rt.objects, before=trim_before_the_index)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = LedgerOffloader(with_objects(rt, objects)).offload_ledger("orders", ids[0])
    assert result.attempt_id is not None
    assert result == OffloadResult("orders", ids[0], Outcome.LOST, result.attempt_id)
    attempt = rt.metadata.attempts.get(result.attempt_id)
    # the commit's CAS finds the ledger gone, or the lease keeper's renewal found it first
    # (it renews every third of the fixtures' 2 s lease): either way the offload is lost
    why = {
        f"attempt {attempt.attempt_id} (epoch 1) no longer owns ledger orders/{ids[0]}",
        f"attempt {attempt.attempt_id} lost ledger orders/{ids[0]} to another attempt",
    }
    assert (attempt.state, attempt.detail) == (AttemptState.SUPERSEDED, "its ledger was trimmed")
    (warning,) = messages(caplog, logging.WARNING)
    assert warning in {f"offload of orders/{ids[0]} lost: {w}" for w in why}
    assert rt.metadata.get_ledger("orders", ids[0]).deletion_state is DeletionState.DELETING
    assert {attempt.data_key, attempt.index_key} <= {
        d.object_key for d in pending_deletions(rt.metadata)
    }


def test_an_upload_longer_than_the_lease_keeps_its_ledger(runtime: Runtime) -> None:
    """The lease keeper renews while the objects upload: an upload taking twice the lease
    still holds the ledger (another run finds it in progress) and commits."""
    settings = runtime.settings.model_copy(update={"attempt_lease_seconds": 1.5})
    rt = dataclasses.replace(runtime, settings=settings)
    (ledger_id,) = sealed(rt)
    seen: list[OffloadResult] = []

    def slow_index(key: str) -> None:
        if key.endswith("-index"):
            time.sleep(3.0)
            seen.append(LedgerOffloader(rt).offload_ledger("orders", ledger_id))

    objects = OnPut(rt.objects, before=slow_index)
    result = LedgerOffloader(with_objects(rt, objects)).offload_ledger("orders", ledger_id)
    assert result.outcome is Outcome.OFFLOADED
    assert seen == [OffloadResult("orders", ledger_id, Outcome.IN_PROGRESS, result.attempt_id)]


def test_an_index_key_already_taken_is_not_overwritten(runtime: Runtime) -> None:
    """The index is written only if its key is free: an object already there (written
    while the data uploaded) stays as it is, and the attempt fails with its keys queued."""
    rt = runtime
    (ledger_id,) = sealed(rt)

    def squat(key: str) -> None:
        if key.endswith("-index"):
            rt.objects.put(key, b"not ours")

    objects = OnPut(rt.objects, before=squat)
    with pytest.raises(ObjectExistsError):
        LedgerOffloader(with_objects(rt, objects)).offload_ledger("orders", ledger_id)
    (failed,) = list_attempts(rt.metadata, "orders")
    assert failed.state is AttemptState.FAILED
    assert rt.objects.get(failed.index_key) == b"not ours"
    assert rt.metadata.get_ledger("orders", ledger_id).offload_attempt_id is None


def test_an_interrupted_upload_fails_its_attempt_and_is_raised(runtime: Runtime) -> None:
    """Ctrl-C (or a SystemExit from a signal handler) during the upload: the interrupt goes
    on up, but first the attempt is failed and its keys queued, so the ledger is free at
    once instead of after its lease."""
    rt = runtime
    (ledger_id,) = sealed(rt)

    def interrupted(key: str) -> None:
        raise KeyboardInterrupt(f"interrupted before PUT {key}")

    objects = OnPut(rt.objects, before=interrupted)
    with pytest.raises(KeyboardInterrupt):
        LedgerOffloader(with_objects(rt, objects)).offload_ledger("orders", ledger_id)
    (failed,) = list_attempts(rt.metadata, "orders")
    assert (failed.state, failed.detail) == (
        AttemptState.FAILED,
        f"KeyboardInterrupt: interrupted before PUT {failed.data_key}",
    )
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    assert (ledger.attempt_id, ledger.attempt_lease_ms) == (None, None)
    assert {d.object_key for d in pending_deletions(rt.metadata)} == {
        failed.data_key,
        failed.index_key,
    }


def test_an_upload_that_knows_it_lost_its_ledger_writes_nothing(runtime: Runtime) -> None:
    """Once the lease keeper has seen another attempt take the ledger, its check raises;
    the upload checks before its first PUT, so a zombie writes neither object."""
    rt = runtime
    (ledger_id,) = sealed(rt)
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    ledger, zombie = rt.metadata.attempts.begin(
        ledger, "zombie", *ledger_object_keys("zombie", ledger_id), "frozen worker", 60_000,
        store_id=rt.stores.default_id(),
    )  # fmt: skip
    take_over(rt, "orders", ledger_id)

    def lost() -> None:
        raise CommitFailedError(f"attempt zombie lost ledger orders/{ledger_id}")

    with pytest.raises(CommitFailedError):
        LedgerOffloader(rt)._upload(ledger, zombie, lost)
    assert not rt.objects.exists(zombie.data_key) and not rt.objects.exists(zombie.index_key)

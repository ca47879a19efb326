"""What the next run makes of a dead worker's attempt, in-process (fast, on both pairings).

test_offload_crash.py kills real offloaders with SIGKILL; here the leftovers of such a
kill (an attempt recorded, its lease over, its objects written or not) are set up
directly, so every way a stale attempt can look is checked: complete objects are
committed (RECOVERED), anything short of them is superseded and its keys queued.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import pytest

from fixtures.backends import make_topic, produce_ledgers, unaccounted_objects
from fixtures.faults import with_objects
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.takeover import OnPut, take_over
from offloader.exceptions import ObjectStoreError
from offloader.format import decode_index, encode_index
from offloader.format.index import encode_metadata
from offloader.format.layout import _INDEX_HEAD as INDEX_HEAD
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.keys import ledger_object_keys
from offloader.metadata import Attempt, AttemptState, Ledger, OffloadState
from offloader.offload import ledger_offloader
from offloader.offload.ledger_offloader import LedgerOffloader, OffloadResult, Outcome
from offloader.offload.runs import offload_batch
from offloader.runtime import Runtime

LOGGER = "offloader.offload.ledger_offloader"


def dead_attempt(
    rt: Runtime,
    *,
    upload: bool = True,
    store_id: int | None = -1,
    attempt_id: str = "dead",
    lease_ms: int = -1,
) -> Attempt:
    """The topic's one ledger with an attempt ``dead`` whose lease is over, its objects
    written (``upload``) as a worker killed right after its index upload leaves them.
    ``store_id`` None: an attempt recorded before stores were (revision 0002); a positive
    ``lease_ms``: a live worker's attempt, about to commit."""
    make_topic(rt)
    (ledger_id,) = produce_ledgers(rt, "orders", [(20, 2000)])
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    _, attempt = rt.metadata.attempts.begin(
        ledger,
        attempt_id,
        *ledger_object_keys(attempt_id, ledger_id),
        f"{attempt_id} worker",
        lease_ms,
        store_id=rt.stores.default_id() if store_id == -1 else store_id,  # type: ignore[arg-type]
    )
    if upload:
        LedgerOffloader(rt)._upload(ledger, attempt, lambda: None)
    return attempt


def offload(rt: Runtime, path: str, ledger_id: int) -> OffloadResult:
    """The ledger through the single-ledger path or the batched one."""
    if path == "single":
        return LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    (result,) = offload_batch(rt, "orders", [ledger_id])
    return result


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.mark.parametrize("path", ["single", "batch"])
def test_a_live_attempt_with_complete_objects_is_left_to_its_worker(
    runtime: Runtime, path: str
) -> None:
    """Objects complete but the lease still running: the worker is about to commit them
    itself, so the run reports it in progress and neither commits nor queues anything."""
    rt = runtime
    live = dead_attempt(rt, attempt_id="live", lease_ms=600_000)
    result = offload(rt, path, live.ledger_id)
    assert result == OffloadResult("orders", live.ledger_id, Outcome.IN_PROGRESS, "live")
    ledger = rt.metadata.get_ledger("orders", live.ledger_id)
    assert (ledger.attempt_id, ledger.offload_attempt_id) == ("live", None)
    assert rt.metadata.attempts.get("live").state is AttemptState.STARTED
    assert pending_deletions(rt.metadata) == []


@pytest.mark.parametrize("path", ["single", "batch"])
def test_a_dead_attempt_with_complete_objects_is_recovered(
    runtime: Runtime, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    dead = dead_attempt(rt)
    size = rt.objects.stat(dead.data_key).size
    with caplog.at_level(logging.INFO, logger=LOGGER):
        result = offload(rt, path, dead.ledger_id)
    assert result == OffloadResult("orders", dead.ledger_id, Outcome.RECOVERED, "dead", size)
    ledger = rt.metadata.get_ledger("orders", dead.ledger_id)
    assert (ledger.offload_attempt_id, ledger.data_len, ledger.store_id) == (
        "dead",
        size,
        dead.store_id,
    )
    assert rt.metadata.attempts.get("dead").state is AttemptState.COMMITTED
    assert pending_deletions(rt.metadata) == []
    assert messages(caplog, logging.INFO) == [f"recovered attempt dead of orders/{dead.ledger_id}"]


def rewrite_index(rt: Runtime, attempt: Attempt, **changes: int) -> None:
    """Replace the attempt's index by one whose ledger metadata says ``changes``."""
    index = decode_index(rt.objects.get(attempt.index_key))
    assert index.metadata is not None
    meta = dataclasses.replace(index.metadata, **changes)
    rt.objects.put(attempt.index_key, encode_index(meta, index.blocks, index.chunks))


def grow_data(rt: Runtime, attempt: Attempt) -> None:
    rt.objects.put(attempt.data_key, rt.objects.get(attempt.data_key) + b"\0")


def drop_index(rt: Runtime, attempt: Attempt) -> None:
    rt.objects.delete_many([attempt.index_key])


def drop_data(rt: Runtime, attempt: Attempt) -> None:
    """The index written, its data object gone (deleted behind the attempt's back)."""
    rt.objects.delete_many([attempt.data_key])


def damage_index(rt: Runtime, attempt: Attempt) -> None:
    rt.objects.put(attempt.index_key, b"not an index")


def entry_count_off(rt: Runtime, attempt: Attempt) -> None:
    rewrite_index(rt, attempt, entry_count=21, last_entry_id=20)


def length_off(rt: Runtime, attempt: Attempt) -> None:
    ledger = rt.metadata.get_ledger("orders", attempt.ledger_id)
    rewrite_index(rt, attempt, length=ledger.size_bytes + 1)


def other_entry_count(rt: Runtime, attempt: Attempt) -> None:
    """Whole, readable objects of another ledger with the same length in one entry: only
    the entry count tells them apart (entry_count_off's index no longer decodes)."""
    ledger = rt.metadata.get_ledger("orders", attempt.ledger_id)
    assert ledger.entry_count > 1
    with ManagedLedgerWriter(rt.metadata, rt.hot, "orders") as writer:
        writer.append(b"x" * ledger.size_bytes)
        other = writer.roll_over()
    rt.objects.delete_many([attempt.data_key, attempt.index_key])
    LedgerOffloader(rt)._upload(other, attempt, lambda: None)
    meta = decode_index(rt.objects.get(attempt.index_key)).metadata
    assert meta is not None
    assert (meta.entry_count, meta.length) == (1, ledger.size_bytes)


def foreign_index_metadata(rt: Runtime, attempt: Attempt) -> None:
    """A whole Pulsar v1 index (no extension) under the attempt's key whose metadata
    record is not ours (another writer's bytes), put without our object metadata: the
    index decodes, but nothing in it says which ledger it is. (The recovery judges the
    index's record, not the object's user metadata: our index bytes under other user
    metadata are committed.)"""
    index = decode_index(rt.objects.get(attempt.index_key))
    assert index.metadata is not None
    ours = encode_metadata(index.metadata)
    v1 = encode_index(index.metadata, index.blocks, None)  # no extension: metadata not strict
    foreign = b"\x08\x96\x01pulsar-protobuf-metadata"
    head = INDEX_HEAD.unpack_from(v1, 0)
    body = v1[INDEX_HEAD.size + len(ours) :]
    length = INDEX_HEAD.size + len(foreign) + len(body)
    data = INDEX_HEAD.pack(head[0], length, *head[2:5], len(foreign)) + foreign + body
    rt.objects.put(attempt.index_key, data)  # no user metadata: not written by the offloader
    assert decode_index(rt.objects.get(attempt.index_key)).metadata is None


@pytest.mark.parametrize(
    "spoil",
    [
        foreign_index_metadata,
        drop_index,
        drop_data,
        damage_index,
        grow_data,
        entry_count_off,
        length_off,
        other_entry_count,
    ],
    ids=lambda f: f.__name__,
)
@pytest.mark.parametrize("path", ["single", "batch"])
def test_a_dead_attempt_short_of_complete_objects_is_superseded(
    runtime: Runtime, path: str, spoil: Callable[[Runtime, Attempt], None]
) -> None:
    """Objects missing, unreadable, or not this ledger's (a data object of another
    length than its index says, an index naming another entry count or length): the
    attempt is superseded, its keys queued, and a new attempt offloads the ledger."""
    rt = runtime
    dead = dead_attempt(rt)
    spoil(rt, dead)
    result = offload(rt, path, dead.ledger_id)
    assert result.outcome is Outcome.OFFLOADED and result.attempt_id != "dead"
    assert rt.metadata.get_ledger("orders", dead.ledger_id).offload_attempt_id == result.attempt_id
    superseded = rt.metadata.attempts.get("dead")
    assert superseded.state is AttemptState.SUPERSEDED
    assert superseded.detail == f"lease expired; superseded by {result.attempt_id}"
    queued = sorted(d.object_key for d in pending_deletions(rt.metadata))
    assert queued == sorted([dead.data_key, dead.index_key])
    assert unaccounted_objects(rt) == set()


def test_a_dead_attempt_that_names_no_store_is_superseded_with_a_warning(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """An attempt recorded before revision 0002 (no store id): its objects cannot be
    looked at, so the run says why and supersedes it."""
    rt = runtime
    dead = dead_attempt(rt, upload=False, store_id=None)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = LedgerOffloader(rt).offload_ledger("orders", dead.ledger_id)
    assert result.outcome is Outcome.OFFLOADED
    assert rt.metadata.attempts.get("dead").state is AttemptState.SUPERSEDED
    assert messages(caplog, logging.WARNING) == [
        "cannot finish stale attempt dead: attempt dead names no object store (written "
        "before revision 0002 and not upgraded): run `offloader db upgrade`"
    ]


def test_a_lease_ending_this_millisecond_is_over(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease ending exactly at the database's now is over (``attempt_lease_ms <= now``,
    the rule the SQL applies): the single-ledger path takes the ledger over."""
    rt = runtime
    dead = dead_attempt(rt, upload=False)
    lease_end = rt.metadata.get_ledger("orders", dead.ledger_id).attempt_lease_ms
    monkeypatch.setattr(rt.metadata, "db_now_ms", lambda: lease_end)
    result = LedgerOffloader(rt).offload_ledger("orders", dead.ledger_id)
    assert result.outcome is Outcome.OFFLOADED
    assert rt.metadata.attempts.get("dead").state is AttemptState.SUPERSEDED


# --- the single-ledger path losing its ledger, or failing ----------------------------


def first_ledger(rt: Runtime) -> Ledger:
    make_topic(rt)
    (ledger_id,) = produce_ledgers(rt, "orders", [(20, 2000)])
    return rt.metadata.get_ledger("orders", ledger_id)


class Refused(ObjectStoreError):
    pass


def refuse(key: str) -> None:
    raise Refused(f"injected: PUT {key} refused")


def test_an_upload_error_after_a_takeover_is_lost_not_raised(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    ledger = first_ledger(rt)

    def taken_over_then_refused(key: str) -> None:
        take_over(rt, "orders", ledger.ledger_id)
        refuse(key)

    objects = OnPut(rt.objects, before=taken_over_then_refused)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = LedgerOffloader(with_objects(rt, objects)).offload_ledger(
            "orders", ledger.ledger_id
        )
    assert result.outcome is Outcome.LOST
    zombie = rt.metadata.attempts.get(result.attempt_id or "")
    assert zombie.state is AttemptState.SUPERSEDED
    assert rt.metadata.get_ledger("orders", ledger.ledger_id).attempt_id == "winner"
    assert messages(caplog, logging.WARNING) == [
        f"offload of orders/{ledger.ledger_id} lost: injected: PUT {zombie.data_key} refused"
    ]


def database_unreachable_at(monkeypatch: pytest.MonkeyPatch, rt: Runtime, method: str) -> None:
    """``rt.metadata.attempts.<method>`` fails as a dropped connection would, at that call only."""

    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("database unreachable")

    monkeypatch.setattr(rt.metadata.attempts, method, unreachable)


def offload_refused(rt: Runtime, ledger: Ledger) -> None:
    """Offload ``ledger`` with its PUTs refused: the refusal is what is raised."""
    objects = OnPut(rt.objects, before=refuse)
    with pytest.raises(Refused):
        LedgerOffloader(with_objects(rt, objects)).offload_ledger("orders", ledger.ledger_id)


def test_an_upload_error_is_raised_when_ownership_cannot_be_checked(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database does not answer whether the attempt still owns its ledger: the
    offloader assumes it does, so the upload's error is raised (not a silent LOST) and
    the attempt is failed, its ledger freed."""
    rt = runtime
    ledger = first_ledger(rt)
    database_unreachable_at(monkeypatch, rt, "renew")
    offload_refused(rt, ledger)
    (failed,) = list_attempts(rt.metadata, "orders", AttemptState.FAILED)
    assert failed.detail == f"Refused: injected: PUT {failed.data_key} refused"
    ledger = rt.metadata.get_ledger("orders", ledger.ledger_id)
    assert (ledger.offload_state, ledger.attempt_id) == (OffloadState.NONE, None)


def test_a_failure_that_cannot_be_recorded_is_logged_and_the_error_raised(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The upload fails and recording the failure fails too: the upload's error is
    raised, the attempt stays STARTED (its lease will run out) and the log says so."""
    # an hour's lease: a lease off by a per-mille (seconds * 1001) shows as 3.6 s
    settings = runtime.settings.model_copy(update={"attempt_lease_seconds": 3600.0})
    rt = dataclasses.replace(runtime, settings=settings)
    ledger = first_ledger(rt)
    database_unreachable_at(monkeypatch, rt, "fail")
    before = rt.metadata.db_now_ms()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        offload_refused(rt, ledger)
    after = rt.metadata.db_now_ms()
    (started,) = list_attempts(rt.metadata, "orders", AttemptState.STARTED)
    ledger = rt.metadata.get_ledger("orders", ledger.ledger_id)
    assert ledger.attempt_id == started.attempt_id
    # the ownership check renewed the lease by the whole lease from its moment: the next
    # run leaves the attempt alone until then (the failure could not be recorded)
    assert ledger.attempt_lease_ms is not None
    assert before + 3_600_000 <= ledger.attempt_lease_ms <= after + 3_600_000
    (record,) = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert record.getMessage() == f"could not record the failure of attempt {started.attempt_id}"
    assert record.exc_info is not None and isinstance(record.exc_info[1], ConnectionError)


@pytest.mark.parametrize("path", ["single", "batch"])
def test_an_attempt_holds_the_configured_lease_from_its_begin(runtime: Runtime, path: str) -> None:
    """While its objects upload, an attempt's lease ends attempt_lease_seconds after its
    begin on the database's clock (an hour's lease: an error of a per-mille shows as
    3.6 s; the lease keeper renews only after a third of it)."""
    settings = runtime.settings.model_copy(update={"attempt_lease_seconds": 3600.0})
    rt = dataclasses.replace(runtime, settings=settings)
    ledger = first_ledger(rt)
    leases: list[tuple[int | None, int]] = []

    def look(key: str) -> None:
        if not leases:  # the first PUT: the attempt has begun, nothing renewed it
            current = rt.metadata.get_ledger("orders", ledger.ledger_id)
            leases.append((current.attempt_lease_ms, rt.metadata.db_now_ms()))

    before = rt.metadata.db_now_ms()
    result = offload(with_objects(rt, OnPut(rt.objects, before=look)), path, ledger.ledger_id)
    assert result.outcome is Outcome.OFFLOADED
    ((lease, seen_at),) = leases
    assert lease is not None
    assert before + 3_600_000 <= lease <= seen_at + 3_600_000


def test_a_dead_attempt_taken_over_while_it_is_recovered_is_left_to_the_winner(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its objects complete, but another worker takes the ledger over while this run
    reads them: the recovery's commit loses the compare-and-set, nothing of the dead
    attempt is committed, and the run reports the winner in progress."""
    rt = runtime
    dead = dead_attempt(rt)
    real = ledger_offloader.decode_index
    taken: list[Attempt] = []

    def decode_while_taken_over(data: bytes) -> object:
        if not taken:
            taken.append(take_over(rt, "orders", dead.ledger_id))
        return real(data)

    monkeypatch.setattr(ledger_offloader, "decode_index", decode_while_taken_over)
    result = LedgerOffloader(rt).offload_ledger("orders", dead.ledger_id)
    assert result == OffloadResult("orders", dead.ledger_id, Outcome.IN_PROGRESS, "winner")
    ledger = rt.metadata.get_ledger("orders", dead.ledger_id)
    assert (ledger.attempt_id, ledger.offload_attempt_id) == ("winner", None)
    assert rt.metadata.attempts.get("dead").state is not AttemptState.COMMITTED


def test_an_interrupt_during_the_upload_fails_the_attempt_and_propagates(
    runtime: Runtime,
) -> None:
    """A BaseException (Ctrl-C, a task's SystemExit) in the middle of the upload: the
    attempt is failed on the way out, its keys queued and its ledger freed, the
    interrupt propagates unchanged, and the next run offloads the ledger."""
    rt = runtime
    ledger = first_ledger(rt)

    def interrupt(key: str) -> None:
        raise KeyboardInterrupt(f"injected at PUT {key}")

    objects = OnPut(rt.objects, before=interrupt)
    with pytest.raises(KeyboardInterrupt, match="injected at PUT"):
        LedgerOffloader(with_objects(rt, objects)).offload_ledger("orders", ledger.ledger_id)
    (failed,) = list_attempts(rt.metadata, "orders")
    assert failed.state is AttemptState.FAILED
    assert failed.detail == f"KeyboardInterrupt: injected at PUT {failed.data_key}"
    current = rt.metadata.get_ledger("orders", ledger.ledger_id)
    assert (current.offload_state, current.attempt_id) == (OffloadState.NONE, None)
    queued = sorted(d.object_key for d in pending_deletions(rt.metadata))
    assert queued == sorted([failed.data_key, failed.index_key])
    result = LedgerOffloader(rt).offload_ledger("orders", ledger.ledger_id)
    assert result.outcome is Outcome.OFFLOADED and result.attempt_id != failed.attempt_id
    assert unaccounted_objects(rt) == set()

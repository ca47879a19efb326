"""``LedgerOffloader.replace_ledger`` (scrub's repair) in this process, on both backends:
what it refuses to touch, and a replacement that fails or loses leaves the ledger on its
old objects with every key of the new attempt queued."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable

import pytest

from fixtures.backends import unaccounted_objects
from fixtures.clock import stopped_sqlite_clock
from fixtures.faults import ServerErrors, _Delegating, with_objects
from fixtures.metadata import begin, list_attempts, pending_deletions
from fixtures.scrub import offloaded_topic
from fixtures.takeover import OnPut, take_over
from offloader.exceptions import HotLedgerMissingError, ObjectStoreError
from offloader.gc.deletion_queue import process_deletions
from offloader.hottier import HotLedgerStore
from offloader.metadata import AttemptState, Ledger, Position
from offloader.offload.ledger_offloader import LedgerOffloader, OffloadResult, Outcome
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime
from offloader.scrub import Action, run_scrub
from offloader.settings import Settings

SMALL = [(40, 2000), (30, 2000)]
LOGGER = "offloader.offload.ledger_offloader"


def unchanged(rt: Runtime, ledger: Ledger) -> bool:
    return rt.metadata.get_ledger(ledger.topic, ledger.ledger_id) == ledger


def test_what_a_replacement_refuses_to_touch(runtime: Runtime) -> None:
    rt = runtime
    first, second = offloaded_topic(rt, shapes=SMALL)
    off = LedgerOffloader(rt)
    assert first.offload_attempt_id is not None
    # objects the ledger no longer names: someone replaced it already
    result = off.replace_ledger("orders", first.ledger_id, "not-its-uuid", "r")
    assert result == OffloadResult(
        "orders", first.ledger_id, Outcome.ALREADY_OFFLOADED, first.offload_attempt_id
    )
    assert unchanged(rt, first)
    # a hot copy the metadata says is present but is gone from disk
    rt.hot.delete("orders", second.ledger_id)
    with pytest.raises(HotLedgerMissingError) as raised:
        off.replace_ledger("orders", second.ledger_id, second.offload_attempt_id or "", "r")
    assert str(raised.value) == (
        f"ledger orders/{second.ledger_id} has no hot copy (hot state present): "
        "its damaged objects cannot be offloaded again"
    )
    assert (
        unchanged(rt, second) and list_attempts(rt.metadata, "orders", AttemptState.STARTED) == []
    )
    # a live replacement holds the ledger
    during, _ = begin(rt.metadata, first, "live", replace=True)
    result = off.replace_ledger("orders", first.ledger_id, first.offload_attempt_id, "r")
    assert result == OffloadResult("orders", first.ledger_id, Outcome.IN_PROGRESS, "live")
    assert unchanged(rt, during)
    # below the start: a trim that has moved the start but not yet marked the ledger (still
    # live) is as final as a finished one
    start = Position(ledger_id=second.ledger_id, entry_id=0)
    rt.metadata.retention.move_start(rt.metadata.get_topic("orders"), start)
    assert rt.metadata.get_ledger("orders", first.ledger_id).is_live
    trimmed = OffloadResult("orders", first.ledger_id, Outcome.TRIMMED)
    assert off.replace_ledger("orders", first.ledger_id, first.offload_attempt_id, "r") == trimmed
    trim_topic(rt, "orders", start)
    assert off.replace_ledger("orders", first.ledger_id, first.offload_attempt_id, "r") == trimmed
    assert (
        list_attempts(rt.metadata, "orders", AttemptState.COMMITTED)[0].attempt_id
        == first.offload_attempt_id
    )


def test_a_stale_replacement_is_superseded_and_the_ledger_replaced(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    check_stale_replacement_is_superseded(runtime, caplog, lease_ms=-1)


# SQLite's clock is the one that can be stopped
@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_a_replacement_whose_lease_ends_exactly_now_is_stale_too(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease ending exactly at the database's now is over (``attempt_lease_ms <= now``,
    as in every lease check)."""
    with stopped_sqlite_clock(runtime.metadata.engine, runtime.metadata.db_now_ms()):
        check_stale_replacement_is_superseded(runtime, caplog, lease_ms=0)


def check_stale_replacement_is_superseded(
    rt: Runtime, caplog: pytest.LogCaptureFixture, *, lease_ms: int
) -> None:
    first, _ = offloaded_topic(rt, shapes=SMALL)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        begin(rt.metadata, first, "dead", lease_ms=lease_ms, replace=True)
        result = LedgerOffloader(rt).replace_ledger(
            "orders", first.ledger_id, first.offload_attempt_id or "", "r"
        )
    assert result.outcome is Outcome.REPLACED and result.bytes > 0
    assert rt.metadata.attempts.get("dead").state is AttemptState.SUPERSEDED
    after = rt.metadata.get_ledger("orders", first.ledger_id)
    assert after.offload_attempt_id == result.attempt_id and after.attempt_id is None
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    assert queued == {"dead-d", "dead-i", first.data_key, first.index_key}
    # not verified: the dead attempt (fixtures.metadata.begin) names a file store at
    # /objects that does not exist, which `offloader verify` reports as store_unavailable
    assert unaccounted_objects(rt, verify=False) == set()
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert re.fullmatch(
        rf"offloaded again \(replaced\) orders/{first.ledger_id}: {result.bytes} bytes in "
        rf"\d+\.\d{{3}}s \(attempt {result.attempt_id}\)",
        line,
    )


class RivalBeforeIntent(_Delegating):
    """The hot tier; ``rival`` runs at the first ``exists``, which ``replace_ledger`` asks
    after reading the ledger and before recording its intent."""

    def __init__(self, hot: HotLedgerStore, rival: Callable[[], object]) -> None:
        super().__init__(hot)
        self._rival: Callable[[], object] | None = rival

    def exists(self, topic: str, ledger_id: int) -> bool:
        if self._rival is not None:
            rival, self._rival = self._rival, None
            rival()
        return bool(self._inner.exists(topic, ledger_id))


@pytest.mark.parametrize(
    ("rival", "expected"),
    [
        ("began-replacing", (Outcome.IN_PROGRESS, "winner")),
        ("replaced", (Outcome.ALREADY_OFFLOADED, None)),
    ],
    ids=["began-replacing", "replaced"],
)
def test_a_replacement_whose_intent_is_refused_says_what_holds_the_ledger(
    runtime: Runtime, rival: str, expected: tuple[Outcome, str | None]
) -> None:
    """Another worker moves the ledger between ``replace_ledger``'s read and its intent: the
    intent's CAS refuses ours (nothing of it is recorded). A replacement in flight makes it
    IN_PROGRESS under that attempt, even though the ledger is offloaded; a finished one
    ALREADY_OFFLOADED (nothing in flight to name)."""
    rt = runtime
    first, _ = offloaded_topic(rt, shapes=SMALL)

    def other_worker() -> object:
        if rival == "began-replacing":
            return take_over(rt, "orders", first.ledger_id, "winner", replace=True)
        done = LedgerOffloader(rt).replace_ledger(
            "orders", first.ledger_id, first.offload_attempt_id, "rival"
        )
        assert done.outcome is Outcome.REPLACED
        return done

    racing = dataclasses.replace(rt, hot=RivalBeforeIntent(rt.hot, other_worker))
    result = LedgerOffloader(racing).replace_ledger(
        "orders", first.ledger_id, first.offload_attempt_id, "r"
    )
    assert result == OffloadResult("orders", first.ledger_id, *expected)
    after = rt.metadata.get_ledger("orders", first.ledger_id)
    recorded = {a.attempt_id for a in list_attempts(rt.metadata) if a.ledger_id == first.ledger_id}
    assert recorded == {
        first.offload_attempt_id,
        after.attempt_id or after.offload_attempt_id,
    }  # none ours


def test_a_replacement_whose_upload_fails_keeps_the_old_objects(runtime: Runtime) -> None:
    rt = runtime
    first, _ = offloaded_topic(rt, shapes=SMALL)
    faulty = with_objects(rt, ServerErrors(rt.objects, ["put", "upload_part"]))
    with pytest.raises(ObjectStoreError, match="InternalError"):
        LedgerOffloader(faulty).replace_ledger(
            "orders", first.ledger_id, first.offload_attempt_id or "", "r"
        )
    after = rt.metadata.get_ledger("orders", first.ledger_id)
    assert after.is_offloaded and after.offload_attempt_id == first.offload_attempt_id
    assert (after.data_key, after.attempt_id) == (first.data_key, None)
    (failed,) = list_attempts(rt.metadata, "orders", AttemptState.FAILED)
    assert {d.object_key for d in pending_deletions(rt.metadata)} == {
        failed.data_key,
        failed.index_key,
    }
    # through scrub: the ledger is reported, the run fails
    from fixtures.scrub import DAMAGES

    DAMAGES["missing-index-object"](rt, first)
    report = run_scrub(faulty)
    (verdict,) = report.damaged
    assert verdict.action is Action.REPAIR_FAILED and report.failed
    assert "offloading again failed" in verdict.detail and "InternalError" in verdict.detail


def test_a_replacement_taken_over_before_its_commit_is_lost(runtime: Runtime) -> None:
    rt = runtime
    first, _ = offloaded_topic(rt, shapes=SMALL)

    def other_repair(key: str) -> None:
        if key.endswith("-index"):  # our objects are complete; another worker takes over
            take_over(rt, "orders", first.ledger_id, "winner", replace=True)

    racing = with_objects(rt, OnPut(rt.objects, after=other_repair))
    result = LedgerOffloader(racing).replace_ledger(
        "orders", first.ledger_id, first.offload_attempt_id or "", "r"
    )
    assert result.outcome is Outcome.LOST
    ours = rt.metadata.attempts.get(result.attempt_id or "")
    assert ours.state is AttemptState.SUPERSEDED
    after = rt.metadata.get_ledger("orders", first.ledger_id)
    assert after.offload_attempt_id == first.offload_attempt_id and after.attempt_id == "winner"
    assert {ours.data_key, ours.index_key} <= {d.object_key for d in pending_deletions(rt.metadata)}


def test_a_scrub_whose_repair_is_taken_over_reports_it_in_progress(runtime: Runtime) -> None:
    from fixtures.scrub import DAMAGES

    rt = runtime
    first, _ = offloaded_topic(rt, shapes=SMALL)
    DAMAGES["missing-data-object"](rt, first)

    def other_repair(key: str) -> None:
        if key.endswith("-index") and not key.startswith("winner"):
            take_over(rt, "orders", first.ledger_id, "winner", replace=True)

    report = run_scrub(with_objects(rt, OnPut(rt.objects, after=other_repair)))
    (verdict,) = report.damaged
    assert verdict.action is Action.IN_PROGRESS and report.failed
    assert verdict.detail == "attempt winner is replacing it"
    assert (
        rt.metadata.get_ledger("orders", first.ledger_id).offload_attempt_id
        == first.offload_attempt_id
    )


def test_the_replaced_objects_wait_out_the_grace(backend_settings: Settings) -> None:
    """Through the offloader: the setting reaches the commit, so the GC leaves the old
    objects (a reader may still be in them) until the grace has passed."""
    settings = backend_settings.model_copy(update={"replaced_object_grace_seconds": 3600.0})
    with Runtime.open(settings) as rt:
        old, _ = offloaded_topic(rt, shapes=SMALL)
        replaced = LedgerOffloader(rt).replace_ledger(
            "orders", old.ledger_id, old.offload_attempt_id or "", "crc mismatch"
        )
        assert replaced.outcome is Outcome.REPLACED
        delays = {
            d.object_key: d.next_try_ms - d.enqueued_ms for d in pending_deletions(rt.metadata)
        }
        assert delays == {old.data_key: 3_600_000, old.index_key: 3_600_000}
        gc = process_deletions(rt.metadata, rt.stores, rt.settings)
        assert (gc.deleted, gc.remaining) == (0, 2)
        store = rt.stores.get(old.store_id or 0, "test")
        assert store.exists(old.data_key or "") and store.exists(old.index_key or "")


def test_a_hot_deletion_finishing_inside_a_replacements_commit_waits_for_it(
    runtime: Runtime,
) -> None:
    """The commit reads the ledger and swaps it in one transaction with the row locked: a
    hot deletion recording its end right between the read and the swap waits, then loses
    its CAS and is finished by the next pass. Before the lock, on PostgreSQL, the swap lost
    instead (a whole re-upload wasted, the repair reported lost)."""
    from fixtures.races import rival_inside_commit
    from offloader.metadata import HotState, MetadataStore
    from offloader.offload.hot_deletion import delete_hot_copies
    from offloader.offload.ledger_offloader import EntrySource

    rt = runtime
    first, _ = offloaded_topic(rt, shapes=SMALL)
    rt.metadata.mark_hot_deleting(first)  # its hot copy is going: repaired from the tier

    def finish_hot_deletion(other: MetadataStore) -> Ledger:
        return other.mark_hot_deleted(other.get_ledger("orders", first.ledger_id))

    # the swap is the UPDATE that sets offload_uuid (not the intent, not a lease renewal)
    with rival_inside_commit(rt, "ledgers", "offload_uuid", finish_hot_deletion, 1.0) as rival:
        result = LedgerOffloader(rt).replace_ledger(
            "orders",
            first.ledger_id,
            first.offload_attempt_id,
            "crc mismatch",
            source=EntrySource.TIER,
        )
    assert result.outcome is Outcome.REPLACED, result
    assert rival["waited"] is True  # held off by the commit's lock (a row's, or SQLite's)
    # then it either lost its CAS (PostgreSQL: it had read the row before the swap) or
    # read the swapped row (SQLite); either way a pass finishes the hot deletion
    assert "error" in rival or rival["result"].offload_attempt_id == result.attempt_id  # type: ignore[attr-defined]
    assert rt.metadata.attempts.get(result.attempt_id or "").state is AttemptState.COMMITTED
    delete_hot_copies(rt.metadata, rt.hot, "orders")
    swapped = rt.metadata.get_ledger("orders", first.ledger_id)
    assert (swapped.offload_attempt_id, swapped.hot_state) == (result.attempt_id, HotState.DELETED)

"""Offload -> checksum equal -> hot copy deleted after the lag -> checksum still equal.

Runs on the embedded default (files + SQLite), on SeaweedFS + PostgreSQL, and on SeaweedFS +
SQLite (so the S3 path is covered where PostgreSQL is absent).
"""

import random
import time

import pytest

from fixtures.backends import END_TO_END, make_topic, produce_ledgers, unaccounted_objects
from fixtures.faults import FlakyDeletes, HotDeleteFails, OnlyStore, ServerErrors, with_objects
from fixtures.metadata import list_attempts, pending_deletions
from offloader.exceptions import HotLedgerMissingError, ObjectStoreError
from offloader.gc.deletion_queue import backoff_ms, process_deletions
from offloader.metadata import Attempt, AttemptState, HotState, OffloadState, now_ms
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.read.tiered import TieredLedgerReader
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime

pytestmark = END_TO_END
MiB = 1024 * 1024


def test_offload_read_back_and_delete_hot_copy_after_lag(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, deletion_lag_seconds=3600)
    # a multi-block ledger (3 parts on S3), a one-entry ledger, and a many-small-entries one
    ids = produce_ledgers(rt, "orders", [(48, 512 * 1024), (1, 100), (3000, 300)])
    reader = TopicReader(rt)
    before = reader.checksum("orders", Source.HOT)
    assert before.entries == 48 + 1 + 3000

    results = LedgerOffloader(rt).offload_topic("orders", up_to=ids[-1])
    assert [r.outcome for r in results] == [Outcome.OFFLOADED] * 3
    assert all(rt.metadata.get_ledger("orders", i).is_offloaded for i in ids)
    assert reader.checksum("orders", Source.TIERED) == before
    assert reader.checksum("orders") == before

    # the lag has not passed: hot copies stay
    assert delete_hot_copies(rt.metadata, rt.hot, "orders") == []
    assert all(rt.hot.exists("orders", i) for i in ids)
    # a lag of 0 has passed for every ledger (deterministic where sleeping out a short lag
    # raced the offload's own duration on a loaded machine)
    topic = rt.metadata.get_topic("orders")
    rt.metadata.set_policy(topic, topic.policy.updated({"deletion_lag_seconds": 0}))
    dry = delete_hot_copies(rt.metadata, rt.hot, "orders", dry_run=True)
    assert sorted(d.ledger_id for d in dry) == ids
    assert all(rt.hot.exists("orders", i) for i in ids)  # a dry run deletes nothing
    deleted = delete_hot_copies(rt.metadata, rt.hot, "orders")
    assert sorted(d.ledger_id for d in deleted) == ids
    for i in ids:
        assert not rt.hot.exists("orders", i)
        assert rt.metadata.get_ledger("orders", i).hot_state is HotState.DELETED
    assert reader.checksum("orders") == before
    with pytest.raises(HotLedgerMissingError):
        reader.checksum("orders", Source.HOT)

    # idempotent: nothing is due any more, nothing changes
    assert LedgerOffloader(rt).offload_topic("orders", up_to=ids[-1]) == []
    assert LedgerOffloader(rt).offload_ledger("orders", ids[0]).outcome is (
        Outcome.ALREADY_OFFLOADED
    )
    assert unaccounted_objects(rt) == set()
    assert pending_deletions(rt.metadata) == []


def test_random_reads_match_the_hot_copy_and_fetch_one_chunk(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, read_buffer_size=64 * 1024)
    (ledger_id,) = produce_ledgers(rt, "orders", [(2000, 8 * 1024)])
    hot = dict(rt.hot.read("orders", ledger_id))
    LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    tiered = TieredLedgerReader(rt.objects, ledger.data_key, ledger.index_key)
    rng = random.Random(1)
    for entry_id in rng.sample(range(2000), 50):
        before = tiered.stats.bytes_fetched
        assert tiered.read_entry(entry_id) == hot[entry_id]
        # one chunk: at most a read buffer, plus one entry frame and the block header
        assert tiered.stats.bytes_fetched - before <= 64 * 1024 + 8 * 1024 + 12 + 128
    first, last = 500, 1500
    assert list(tiered.read(first, last)) == [(i, hot[i]) for i in range(first, last + 1)]


def test_read_priority_and_fallback(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, read_priority="hot-first", deletion_lag_seconds=0)
    (ledger_id,) = produce_ledgers(rt, "orders", [(20, 1000)])
    LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    reader = TopicReader(rt)
    expected = list(reader.read("orders", ledger_id, source=Source.HOT))
    assert list(reader.read("orders", ledger_id, source=Source.TIERED)) == expected
    # hot-first, but the hot copy vanished behind the metadata's back: fall back to tiered
    rt.hot.delete("orders", ledger_id)
    assert list(reader.read("orders", ledger_id, 3, 7)) == expected[3:8]


def test_bad_read_ranges_are_named(runtime: Runtime) -> None:
    make_topic(runtime)
    (ledger_id,) = produce_ledgers(runtime, "orders", [(5, 10)])
    with pytest.raises(ValueError, match=r"entries 3\.\.9 are outside 0\.\.4"):
        list(TopicReader(runtime).read("orders", ledger_id, 3, 9))


def test_hot_copy_is_marked_deleting_before_it_goes(runtime: Runtime) -> None:
    """Invariant 3: the metadata says ``deleting`` before the file goes, so a failure (or a
    crash) mid-way leaves a ledger the next run finishes, never a silently missing copy."""
    rt = runtime
    make_topic(rt, deletion_lag_seconds=0)
    ids = produce_ledgers(rt, "orders", [(20, 1000), (20, 1000)])
    before = TopicReader(rt).checksum("orders", Source.HOT)
    LedgerOffloader(rt).offload_topic("orders", up_to=ids[-1])
    seen = []
    failing = HotDeleteFails(
        rt.hot, lambda topic, i: seen.append(rt.metadata.get_ledger(topic, i).hot_state)
    )
    with pytest.raises(OSError, match="injected"):
        delete_hot_copies(rt.metadata, failing, "orders")  # type: ignore[arg-type]
    assert seen == [HotState.DELETING]  # marked when the delete was tried
    first, second = (rt.metadata.get_ledger("orders", i) for i in ids)
    assert first.hot_state is HotState.DELETING and rt.hot.exists("orders", ids[0])
    assert second.hot_state is HotState.PRESENT and rt.hot.exists("orders", ids[1])
    assert TopicReader(rt).checksum("orders") == before

    # the rerun finishes the marked ledger and the rest
    deleted = delete_hot_copies(rt.metadata, rt.hot, "orders")
    assert [d.ledger_id for d in deleted] == ids
    for i in ids:
        assert rt.metadata.get_ledger("orders", i).hot_state is HotState.DELETED
        assert not rt.hot.exists("orders", i)
    assert TopicReader(rt).checksum("orders") == before


def offload_against_500s(rt: Runtime, operation: str, after: int) -> tuple[int, Attempt]:
    """Offload a multipart ledger while the store answers ``operation`` with a 500; the
    ledger and its failed attempt."""
    make_topic(rt)
    (ledger_id,) = produce_ledgers(rt, "orders", [(24, 1024 * 1024)])
    faulty = ServerErrors(rt.objects, [operation], after=after)
    with pytest.raises(ObjectStoreError, match="InternalError"):
        LedgerOffloader(with_objects(rt, faulty)).offload_ledger("orders", ledger_id)
    assert faulty.calls >= 1
    (attempt,) = list_attempts(rt.metadata, "orders")
    return ledger_id, attempt


@pytest.mark.parametrize(
    ("operation", "after"),
    [("upload_part", 1), ("complete_multipart", 0), ("put", 0)],
    ids=["second-part", "complete", "index-put"],
)
def test_a_500_from_the_store_fails_the_attempt_cleanly(
    runtime: Runtime, operation: str, after: int
) -> None:
    rt = runtime
    ledger_id, attempt = offload_against_500s(rt, operation, after)
    # the attempt is failed, the ledger free again, the attempt's keys queued
    assert attempt.state is AttemptState.FAILED and "InternalError" in (attempt.detail or "")
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    assert ledger.offload_state is OffloadState.NONE and ledger.attempt_id is None
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    assert queued == {attempt.data_key, attempt.index_key}
    assert list(rt.objects.list_multipart_uploads()) == []  # the upload was aborted
    assert rt.objects.exists(attempt.data_key) is (operation == "put")
    assert unaccounted_objects(rt) == set()

    before = TopicReader(rt).checksum("orders", Source.HOT)
    assert LedgerOffloader(rt).offload_ledger("orders", ledger_id).outcome is Outcome.OFFLOADED
    (committed,) = list_attempts(rt.metadata, "orders", AttemptState.COMMITTED)
    assert committed.attempt_id == rt.metadata.get_ledger("orders", ledger_id).offload_attempt_id
    assert TopicReader(rt).checksum("orders", Source.TIERED) == before
    assert process_deletions(rt.metadata, rt.stores, rt.settings).remaining == 0
    assert {i.key for i in rt.objects.list()} == {committed.data_key, committed.index_key}


def test_failed_deletes_are_kept_and_retried(runtime: Runtime) -> None:
    """A failed attempt's objects stay queued while the store refuses to delete them, with
    the tries, the error and the next try recorded; once the store recovers, they go."""
    rt = runtime
    _, attempt = offload_against_500s(rt, "put", 0)  # its data object exists
    settings = rt.settings.model_copy(update={"delete_retry_base_seconds": 0.3})
    refusing = FlakyDeletes(rt.objects, refuse={attempt.data_key})
    for tries in (1, 2):
        started = now_ms()
        result = process_deletions(rt.metadata, OnlyStore(refusing), settings)
        assert (result.failed, result.remaining) == (1, 1)
        (left,) = pending_deletions(rt.metadata)
        assert (left.object_key, left.tries, left.last_error) == (
            attempt.data_key,
            tries,
            "AccessDenied",
        )
        delay = backoff_ms(tries - 1, settings)
        assert started + delay <= left.next_try_ms <= now_ms() + delay
        assert rt.metadata.deletions.due(10) == []  # backing off
        assert rt.objects.exists(attempt.data_key)
        time.sleep(delay / 1000 + 0.01)
    result = process_deletions(rt.metadata, rt.stores, settings)
    assert (result.deleted, result.failed, result.remaining) == (1, 0, 0)
    assert not rt.objects.exists(attempt.data_key)
    assert list(rt.objects.list()) == []

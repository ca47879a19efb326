"""Offload -> checksum equal -> hot copy deleted after the lag -> checksum still equal.

Runs on the embedded default (files + SQLite) and on SeaweedFS + PostgreSQL.
"""

import random
import time

import pytest

from fixtures.backends import make_topic, produce_ledgers, unaccounted_objects
from offloader.exceptions import HotLedgerMissingError
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import HotState
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.read.tiered import TieredLedgerReader
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime

MiB = 1024 * 1024


def test_offload_read_back_and_delete_hot_copy_after_lag(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, deletion_lag_seconds=1.0)
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
    time.sleep(1.1)
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
    assert rt.metadata.pending_deletions() == []


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


def test_failed_deletes_are_kept_and_retried(runtime: Runtime) -> None:
    rt = runtime
    store_id = rt.stores.default_id()
    rt.metadata.enqueue_deletions(["never-existed", "also-gone"], "test", store_id=store_id)
    result = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (result.deleted, result.remaining) == (2, 0)

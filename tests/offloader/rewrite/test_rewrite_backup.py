"""Metadata backup around rewrites, on both pairings: a snapshot carries rewrite segments
(origin, lease) and restores a database whose GC still recovers a dead rewrite; a rebuild
from the objects while a rewrite's sources wait out their grace keeps one copy of each
ledger, the newest."""

from __future__ import annotations

import time
import uuid

import pytest

from fixtures.backends import Fresh
from fixtures.inspect import checksum
from fixtures.metadata import list_attempts
from fixtures.rewrites import (
    T,
    check_clean_store,
    entry_digests,
    rewrite_rows,
    v1_topic,
    whole_group,
)
from fixtures.streams import crash_at
from offloader.gc.run import recover_stale_rewrites
from offloader.keys import ledger_object_keys
from offloader.metadata import OffloadMode, SegmentOrigin, SegmentState
from offloader.metadata.snapshot import import_snapshot
from offloader.recovery import rebuild_from_objects
from offloader.rewrite.report import REWRITTEN
from offloader.runtime import Runtime, export_metadata


def test_a_snapshot_carries_rewrite_segments_and_their_leases(
    runtime: Runtime, fresh: Fresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    rt.settings = rt.settings.model_copy(update={"replaced_object_grace_seconds": 3600})
    ids = v1_topic(rt, 5)
    first = {"first_ledger": ids[0], "last_ledger": ids[2]}
    assert [g.outcome for g in whole_group(rt, **first).groups] == [REWRITTEN]
    with crash_at(monkeypatch, "rewrite-after-first-part"):  # a rewrite left open
        whole_group(rt, first_ledger=ids[3], lease_seconds=2.0)
    segments = {s.origin: s for s in rt.metadata.segments.of_topic(T)}
    assert segments[SegmentOrigin.REWRITE].lease_until_ms is not None
    rows, before = rewrite_rows(rt), checksum(rt, T)
    export_metadata(rt)

    restored = fresh()
    import_snapshot(restored.metadata.engine, restored.objects, None)
    assert rewrite_rows(restored) == rows
    assert checksum(restored, T) == before
    (dead,) = restored.metadata.rewrites.open_rewrites(T)
    deadline = time.monotonic() + 30
    while restored.metadata.db_now_ms() <= (dead.lease_until_ms or 0):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (recovered,) = recover_stale_rewrites(restored)
    assert recovered.segment_id == dead.segment_id and recovered.state is SegmentState.FAILED


def test_a_rebuild_during_the_grace_keeps_the_newest_copy_of_each_ledger(
    runtime: Runtime, fresh: Fresh
) -> None:
    """Ledgers 1-3 were rewritten into a segment and their v1 objects wait out the grace:
    the segment is newer, so it is their offload. Ledger 2 then got a newer v1 copy (as a
    migration back to v1 would write): that copy is its offload. Ledger 4 was never
    rewritten. What is not taken is left for the sweep; every entry reads back."""
    rt = runtime
    rt.settings = rt.settings.model_copy(update={"replaced_object_grace_seconds": 3600})
    ids = v1_topic(rt, 4)
    digests = entry_digests(rt)
    time.sleep(1.1)  # S3 keeps LastModified to the second: the segment is the newer copy
    (group,) = whole_group(rt, last_ledger=ids[2]).groups
    assert group.outcome == REWRITTEN
    (segment,) = rt.metadata.segments.of_topic(T)
    second = next(x for x in list_attempts(rt.metadata, T) if x.ledger_id == ids[1])
    time.sleep(1.1)
    newer_data, newer_index = ledger_object_keys(str(uuid.uuid4()), ids[1])
    for source, target in ((second.data_key, newer_data), (second.index_key, newer_index)):
        rt.objects.put(target, rt.objects.get(source), metadata=rt.objects.stat(source).metadata)

    rebuilt = fresh()
    result = rebuild_from_objects(
        rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location
    )
    superseded = sorted(s.split(":")[0] for s in result.skipped)
    first_v1 = [x for x in list_attempts(rt.metadata, T) if x.ledger_id in (ids[0], ids[2])]
    # ledger 2's original v1 copy is simply older than its new one (not reported, as before)
    assert superseded == sorted(a.index_key for a in first_v1), result.skipped
    modes = {x.ledger_id: x.offload_mode for x in rebuilt.metadata.list_ledgers(T)}
    assert modes == {
        ids[0]: OffloadMode.STREAM,
        ids[1]: OffloadMode.LEDGER,
        ids[2]: OffloadMode.STREAM,
        ids[3]: OffloadMode.LEDGER,
    }
    assert rebuilt.metadata.get_ledger(T, ids[1]).data_key == newer_data
    (again,) = rebuilt.metadata.segments.of_topic(T)
    assert (again.segment_id, again.state) == (segment.segment_id, SegmentState.OFFLOADED)
    assert entry_digests(rebuilt) == digests
    # what the rebuilt metadata does not take is swept; everything still reads back
    check_clean_store(rebuilt)
    assert entry_digests(rebuilt) == digests

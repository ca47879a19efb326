"""A rewrite run in process, on both pairings: compaction of small v1 ledgers and v1 -> v2
migration of big ones keep every entry (checksum, entry by entry, by range), leave fewer
objects and no orphan, and a rerun changes nothing; a source that moves is "changed", two
runs of the same sources leave exactly one winner."""

from __future__ import annotations

import itertools
import threading

import pytest

from fixtures.backends import run_in_threads
from fixtures.clock import wait_past
from fixtures.faults import ServerErrors, with_objects
from fixtures.inspect import checksum, stored_keys, uploads
from fixtures.metadata import begin as begin_attempt
from fixtures.metadata import pending_deletions
from fixtures.rewrites import (
    T,
    check_clean_store,
    check_one_copy,
    entry_digests,
    gc,
    rewrite,
    rewrite_rows,
    shape,
    v1_topic,
)
from fixtures.streams import converge, crash_at, produce, run_pass, stream_topic
from offloader import failpoints
from offloader.format import decode_segment_index
from offloader.gc.run import recover_stale_rewrites
from offloader.metadata import OffloadMode, Position, SegmentOrigin, SegmentState
from offloader.read.topic_reader import Source, TopicReader
from offloader.rewrite.params import RewriteParams
from offloader.rewrite.plan import plan_rewrite
from offloader.rewrite.report import CHANGED, FAILED, PLANNED, REWRITTEN
from offloader.rewrite.run import Rewriter
from offloader.runtime import Runtime


def test_compaction_of_small_v1_ledgers_keeps_every_entry_in_fewer_objects(
    runtime: Runtime,
) -> None:
    rt = runtime
    ids = v1_topic(rt, 7)  # hot copies deleted: every read below comes from the tier
    before, digests, count = checksum(rt, T), entry_digests(rt), len(stored_keys(rt.objects))
    assert count == 14

    dry = rewrite(rt, dry_run=True)
    assert {g.outcome for g in dry.groups} == {PLANNED} and len(dry.groups) >= 2
    assert rewrite_rows(rt)["segments"] == []
    grouped = [i for g in dry.groups for i in g.ledgers]
    for g in dry.groups:  # runs of adjacent ledgers, two at least, up to the target
        assert g.ledgers == list(range(g.ledgers[0], g.ledgers[-1] + 1)) and len(g.ledgers) >= 2
        assert g.bytes_before <= shape(rt).target
    assert grouped == sorted(set(grouped)) and set(grouped) <= set(ids)
    report = rewrite(rt)
    assert {g.outcome for g in report.groups} == {REWRITTEN}
    assert [g.ledgers for g in report.groups] == [g.ledgers for g in dry.groups]
    totals = report.totals()
    assert (totals["objects_before"], totals["objects_after"]) == (
        2 * len(grouped),
        2 * len(report.groups),
    )
    assert totals["bytes_after"] == sum(
        rt.objects.stat(s.data_key).size for s in rt.metadata.segments.of_topic(T)
    )
    for ledger in rt.metadata.list_ledgers(T):
        mode = OffloadMode.STREAM if ledger.ledger_id in grouped else OffloadMode.LEDGER
        assert ledger.offload_mode is mode
    assert {s.origin for s in rt.metadata.segments.of_topic(T)} == {SegmentOrigin.REWRITE}
    counts = rt.metadata.counts()
    assert counts["segments_by_origin"] == {"rewrite/offloaded": len(report.groups)}
    for segment in rt.metadata.segments.of_topic(T):  # parts of whole blocks, none but the last
        index = decode_segment_index(rt.objects.get(segment.index_key))  # under min_part_bytes
        part_bytes: dict[int, int] = {}
        for block in (b for x in index.ledgers for b in x.blocks):
            part_bytes[block.part_id] = part_bytes.get(block.part_id, 0) + block.length
        assert sorted(part_bytes) == list(range(1, len(part_bytes) + 1))
        assert all(n >= shape(rt).min_part for n in list(part_bytes.values())[:-1])
    check_one_copy(rt)
    assert checksum(rt, T) == before and entry_digests(rt) == digests
    # by range: a slice across blocks of a ledger in the middle of a segment
    middle = rt.metadata.get_ledger(T, grouped[len(grouped) // 2])
    got = list(TopicReader(rt).read(T, middle.ledger_id, 2, middle.entry_count - 2, Source.TIERED))
    assert [e for e, _ in got] == list(range(2, middle.entry_count - 1))

    gc(rt)  # no grace in the fixtures: the old objects go
    assert len(stored_keys(rt.objects)) == count - 2 * len(grouped) + 2 * len(report.groups)
    check_clean_store(rt)
    assert checksum(rt, T) == before

    rows = rewrite_rows(rt)
    assert (
        plan_rewrite(
            rt.metadata,
            RewriteParams(target_bytes=shape(rt).target, small_bytes=shape(rt).target // 2),
        )
        == []
    )
    assert rewrite(rt).groups == []
    assert rewrite_rows(rt) == rows


def test_migration_to_v2_rewrites_big_ledgers_one_each(runtime: Runtime) -> None:
    rt = runtime
    ids = v1_topic(rt, 3)
    before = checksum(rt, T)
    sizes = [rt.metadata.get_ledger(T, i).data_len or 0 for i in ids]
    report = rewrite(rt, mode="to-v2", target_bytes=min(sizes) - 1)  # each alone is too big
    assert [(g.ledgers, g.outcome) for g in report.groups] == [([i], REWRITTEN) for i in ids]
    assert all(x.offload_mode is OffloadMode.STREAM for x in rt.metadata.list_ledgers(T))
    check_one_copy(rt)
    assert checksum(rt, T) == before
    gc(rt)
    check_clean_store(rt)
    assert checksum(rt, T) == before
    assert rewrite(rt, mode="to-v2").groups == []


def test_migration_to_v2_packs_consecutive_ledgers_up_to_the_target(runtime: Runtime) -> None:
    rt = runtime
    ids = v1_topic(rt, 5)
    size = {i: rt.metadata.get_ledger(T, i).data_len or 0 for i in ids}
    target = size[ids[0]] + size[ids[1]]
    groups = [g.ledgers for g in rewrite(rt, mode="to-v2", target_bytes=target).groups]
    assert groups[0] == ids[:2] and [i for g in groups for i in g] == ids
    for group, after in itertools.pairwise(groups):  # greedy: each group as full as it gets
        assert sum(size[i] for i in group) <= target or len(group) == 1
        assert sum(size[i] for i in group) + size[after[0]] > target


def test_a_run_stops_at_max_groups_and_the_next_goes_on(runtime: Runtime) -> None:
    rt = runtime
    v1_topic(rt, 7)
    planned = len(rewrite(rt, dry_run=True).groups)
    assert planned >= 2
    first = rewrite(rt, max_groups=1)
    assert (len(first.groups), first.left) == (1, planned - 1)
    second = rewrite(rt, max_groups=1)
    assert (len(second.groups), second.left) == (1, planned - 2)
    assert first.groups[0].ledgers != second.groups[0].ledgers


# --- the swap's refusals through the run -------------------------------------------------
def test_a_source_that_moved_after_the_plan_is_changed_and_queues_nothing_of_it(
    runtime: Runtime,
) -> None:
    rt = runtime
    ids = v1_topic(rt, 3, hot=True)
    before = checksum(rt, T)
    params = RewriteParams(target_bytes=shape(rt).target, small_bytes=shape(rt).target)
    (group,) = plan_rewrite(rt.metadata, params)
    begin_attempt(rt.metadata, rt.metadata.get_ledger(T, ids[1]), "repair", replace=True)
    result = Rewriter(rt, owner="test", lease_seconds=30).rewrite(group)
    assert result.outcome == CHANGED and f"{T}/{ids[1]} has offload attempt repair" in (
        result.detail or ""
    )
    assert rt.metadata.segments.of_topic(T) == []  # refused at the intent: nothing written
    assert checksum(rt, T) == before


def test_a_trim_between_the_upload_and_the_swap_fails_the_rewrite_and_queues_its_objects(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    ids = v1_topic(rt, 4, hot=True)
    params = RewriteParams(target_bytes=10 * shape(rt).target, small_bytes=shape(rt).target)
    (group,) = plan_rewrite(rt.metadata, params)
    from offloader import failpoints

    real = failpoints.reach

    def trim_at_index(point: str) -> None:
        real(point)
        if point == "rewrite-after-index":
            topic = rt.metadata.get_topic(T)
            rt.metadata.retention.move_start(topic, Position(ledger_id=ids[1], entry_id=0))
            rt.metadata.retention.mark_ledgers_deleting(T, ids[1], 100)

    monkeypatch.setattr(failpoints, "reach", trim_at_index)
    result = Rewriter(rt, owner="test", lease_seconds=30).rewrite(group)
    assert result.outcome == CHANGED and "was trimmed" in (result.detail or "")
    (failed,) = rt.metadata.segments.of_topic(T)
    assert failed.state is SegmentState.FAILED
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    assert {failed.data_key, failed.index_key} <= queued
    assert all(rt.metadata.get_ledger(T, i).offload_mode is OffloadMode.LEDGER for i in ids)
    gc(rt)
    check_clean_store(rt)
    check_one_copy(rt)


def test_two_runs_of_the_same_sources_leave_exactly_one_winner(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    v1_topic(rt, 3)
    before = checksum(rt, T)
    params = RewriteParams(target_bytes=10 * shape(rt).target, small_bytes=shape(rt).target)
    (group,) = plan_rewrite(rt.metadata, params)
    # both intents recorded before either writes: otherwise a thread started late (a loaded
    # machine) finds the sources already swapped and records nothing, a different race
    both_begun = threading.Barrier(2, timeout=30)
    real_reach = failpoints.reach

    def reach(name: str) -> None:
        real_reach(name)
        if name == "rewrite-after-begin":
            both_begun.wait()

    monkeypatch.setattr(failpoints, "reach", reach)
    outcomes = []
    errors = run_in_threads(
        lambda: outcomes.append(Rewriter(rt, owner="t", lease_seconds=30).rewrite(group)), 2
    )
    assert errors == []
    assert sorted(r.outcome for r in outcomes) == [CHANGED, REWRITTEN]
    states = sorted(s.state for s in rt.metadata.segments.of_topic(T))
    assert states == sorted([SegmentState.FAILED, SegmentState.OFFLOADED])
    (loser,) = rt.metadata.segments.of_topic(T, [SegmentState.FAILED])
    assert {loser.data_key, loser.index_key} <= {
        d.object_key for d in pending_deletions(rt.metadata)
    }
    check_one_copy(rt)
    assert checksum(rt, T) == before
    gc(rt)
    check_clean_store(rt)


# --- a run killed in this process, recovered by the GC's step ----------------------------
def test_a_dead_rewrite_is_recovered_once_its_lease_ran_out(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    v1_topic(rt, 3)
    before = checksum(rt, T)
    with crash_at(monkeypatch, "rewrite-after-first-part"):
        rewrite(rt, small_bytes=shape(rt).target, lease_seconds=2.0)
    (dead,) = rt.metadata.rewrites.open_rewrites(T)
    assert dead.upload_id is not None and len({k for k, _ in uploads(rt.objects)}) == 1
    assert recover_stale_rewrites(rt) == []  # its lease still runs
    wait_past(rt.metadata, dead.lease_until_ms or 0)
    (recovered,) = recover_stale_rewrites(rt)
    assert (recovered.segment_id, recovered.state) == (dead.segment_id, SegmentState.FAILED)
    assert uploads(rt.objects) == set()  # aborted
    check_one_copy(rt)
    assert checksum(rt, T) == before
    check_clean_store(rt)
    assert [g.outcome for g in rewrite(rt, small_bytes=shape(rt).target).groups] == [REWRITTEN]
    check_one_copy(rt)
    assert checksum(rt, T) == before


def test_a_run_recovers_dead_rewrites_before_each_group(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    v1_topic(rt, 3)
    with crash_at(monkeypatch, "rewrite-after-begin"):
        rewrite(rt, small_bytes=shape(rt).target, lease_seconds=2.0)
    (dead,) = rt.metadata.rewrites.open_rewrites(T)
    wait_past(rt.metadata, dead.lease_until_ms or 0)
    report = rewrite(rt, small_bytes=shape(rt).target)
    assert report.recovered == [dead.segment_id]
    assert [g.outcome for g in report.groups] == [REWRITTEN]


@pytest.mark.parametrize("mode", ["compact", "to-v1"])
def test_a_run_with_nothing_to_plan_still_recovers_a_dead_rewrite(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """As `offloader gc` does (docs/OPERATIONS.md): the dead rewrite is failed, its upload
    aborted, its keys queued, though no group is planned (compaction: nothing small
    enough; to-v1: nothing streamed)."""
    rt = runtime
    v1_topic(rt, 3)
    before = checksum(rt, T)
    with crash_at(monkeypatch, "rewrite-after-first-part"):
        rewrite(rt, small_bytes=shape(rt).target, lease_seconds=2.0)
    (dead,) = rt.metadata.rewrites.open_rewrites(T)
    wait_past(rt.metadata, dead.lease_until_ms or 0)
    values = {"small_bytes": 1} if mode == "compact" else {"mode": mode}
    report = rewrite(rt, **values)
    assert (report.groups, report.recovered) == ([], [dead.segment_id])
    assert "dead rewrites recovered: " + dead.segment_id in str(report)
    assert rt.metadata.segments.get(dead.segment_id).state is SegmentState.FAILED
    assert uploads(rt.objects) == set()  # aborted
    assert {dead.data_key, dead.index_key} <= {d.object_key for d in pending_deletions(rt.metadata)}
    assert rewrite(rt, small_bytes=1).recovered == []  # once only
    assert checksum(rt, T) == before


def test_an_empty_ledger_between_sources_does_not_break_a_run(runtime: Runtime) -> None:
    rt = runtime
    ids = v1_topic(rt, 2)
    epoch = rt.metadata.claim_writer(T).writer_epoch  # a ledger sealed with no entry
    empty = rt.metadata.allocate_ledger(T, epoch)
    rt.hot.create(T, empty.ledger_id).seal()
    rt.metadata.seal_ledger(empty, 0, 0, epoch)
    ids += v1_topic(rt, 2)
    assert rt.metadata.get_ledger(T, empty.ledger_id).entry_count == 0
    report = rewrite(rt, target_bytes=10 * shape(rt).target, small_bytes=shape(rt).target)
    assert [g.ledgers for g in report.groups] == [ids]


def small_segments(rt: Runtime, topic: str = "s", count: int = 3) -> int:
    """A streaming topic with ``count`` small offloaded segments (a ledger and a closed
    segment a pass); the profile's segment size."""
    p = stream_topic(rt, topic)
    for seed in range(count):
        produce(rt, topic, 1, seed=seed)
        run_pass(rt, topic, close_now=True)
    assert len(rt.metadata.segments.of_topic(topic, [SegmentState.OFFLOADED])) == count
    return p.segment_max


def test_compaction_merges_small_stream_segments_and_the_stream_goes_on(
    runtime: Runtime,
) -> None:
    rt = runtime
    size = small_segments(rt)
    before = checksum(rt, "s")
    small = rt.metadata.segments.of_topic("s", [SegmentState.OFFLOADED])
    report = rewrite(rt, topics=["s"], target_bytes=100 * size, small_bytes=size)
    (group,) = report.groups
    assert (group.kind, group.sources, group.outcome) == ("segment", 3, REWRITTEN)
    merged = rt.metadata.segments.get(group.segment_id or "")
    assert merged.origin is SegmentOrigin.REWRITE and merged.state is SegmentState.OFFLOADED
    for old in small:
        now = rt.metadata.segments.get(old.segment_id)
        assert (now.state, now.detail) == (
            SegmentState.DELETED,
            f"rewritten into segment {merged.segment_id}",
        )
    assert {d.object_key for d in pending_deletions(rt.metadata)} == {
        k for x in small for k in (x.data_key, x.index_key)
    }
    check_one_copy(rt, "s")
    assert checksum(rt, "s") == before == checksum(rt, "s", "hot")
    # the stream continues after its own (merged away) segments: nothing again, nothing lost
    produce(rt, "s", 1, seed=9)
    converge(rt, "s")
    check_one_copy(rt, "s")
    assert checksum(rt, "s", "tiered") == checksum(rt, "s", "hot")
    gc(rt)
    check_clean_store(rt)


@pytest.mark.parametrize("point", ["rewrite-after-first-part", "mid-rewrite-commit"])
def test_a_segment_merge_that_dies_leaves_the_segments_and_is_cleaned(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    rt = runtime
    size = small_segments(rt)
    small = rt.metadata.segments.of_topic("s", [SegmentState.OFFLOADED])
    before = checksum(rt, "s", "tiered")
    values = {"topics": ["s"], "target_bytes": 100 * size, "small_bytes": size}
    with crash_at(monkeypatch, point):
        rewrite(rt, lease_seconds=2.0, **values)
    (dead,) = rt.metadata.rewrites.open_rewrites("s")
    assert rt.metadata.segments.of_topic("s", [SegmentState.OFFLOADED]) == small
    assert checksum(rt, "s", "tiered") == before
    wait_past(rt.metadata, dead.lease_until_ms or 0)
    assert [s.segment_id for s in recover_stale_rewrites(rt)] == [dead.segment_id]
    check_clean_store(rt)
    assert [g.outcome for g in rewrite(rt, **values).groups] == [REWRITTEN]
    check_one_copy(rt, "s")
    assert checksum(rt, "s", "tiered") == before


def test_migration_back_to_v1_after_a_compaction_releases_the_rewrite_segment(
    runtime: Runtime,
) -> None:
    """v1 -> v2 (compaction) -> v1 (mode to-v1, rewrite/to_v1.py): every ledger on its own
    objects again, the rewrite segment no ledger needs released, the entries the same."""
    rt = runtime
    ids = v1_topic(rt, 3)
    before = entry_digests(rt)
    target = 10 * shape(rt).target
    assert [g.outcome for g in rewrite(rt, target_bytes=target, small_bytes=target).groups] == [
        REWRITTEN
    ]
    (segment,) = rt.metadata.segments.of_topic(T)
    dry = rewrite(rt, mode="to-v1", dry_run=True)
    assert [(g.ledgers, g.outcome) for g in dry.groups] == [([i], PLANNED) for i in ids]
    report = rewrite(rt, mode="to-v1", max_groups=2)
    assert [(g.ledgers, g.outcome) for g in report.groups] == [([i], REWRITTEN) for i in ids[:2]]
    assert report.left == 1 and all(g.objects_after == 2 for g in report.groups)
    assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.OFFLOADED
    assert [g.outcome for g in rewrite(rt, mode="to-v1").groups] == [REWRITTEN]
    assert all(x.offload_mode is OffloadMode.LEDGER for x in rt.metadata.list_ledgers(T))
    assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.DELETED
    assert entry_digests(rt) == before
    gc(rt)
    check_clean_store(rt)
    assert entry_digests(rt) == before
    assert rewrite(rt, mode="to-v1").groups == []


def test_a_rewrite_recovered_before_its_upload_was_recorded_is_changed_and_cleaned(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run froze between creating its upload and recording it, past its lease, and
    was recovered meanwhile (its segment failed, no upload recorded to abort): recording
    the upload loses, so the group is ``changed``, its upload aborted, nothing swapped,
    and the next run rewrites the sources."""
    rt = runtime
    v1_topic(rt, 3)
    before = checksum(rt, T)
    real = failpoints.reach
    recovered: list[str] = []

    def frozen_past_the_lease(point: str) -> None:
        real(point)
        if point == "rewrite-after-create-upload":
            (open_,) = rt.metadata.rewrites.open_rewrites(T)
            wait_past(rt.metadata, open_.lease_until_ms or 0)
            recovered.extend(s.segment_id for s in recover_stale_rewrites(rt))

    monkeypatch.setattr(failpoints, "reach", frozen_past_the_lease)
    report = rewrite(rt, small_bytes=shape(rt).target, lease_seconds=1.0)
    monkeypatch.undo()
    (group,) = report.groups
    assert (group.outcome, [group.segment_id]) == (CHANGED, recovered)
    assert rt.metadata.segments.get(recovered[0]).state is SegmentState.FAILED
    assert uploads(rt.objects) == set()  # created, never recorded: aborted by the run
    check_one_copy(rt)
    assert checksum(rt, T) == before
    assert [g.outcome for g in rewrite(rt, small_bytes=shape(rt).target).groups] == [REWRITTEN]
    assert checksum(rt, T) == before


def _unrecordable(*args: object, **kwargs: object) -> None:
    raise ConnectionError("database unreachable")


@pytest.mark.parametrize("step", ["create-upload", "record-upload"])
def test_an_error_after_the_intent_fails_the_rewrite_and_the_next_run_rewrites(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """The intent is recorded, then creating the multipart upload fails (a store error:
    no upload to abort) or recording it does (the database: the upload created is
    aborted): the rewrite is failed with the error, its keys queued, the group reported
    ``failed``, nothing swapped; the next run rewrites the sources."""
    rt = runtime
    v1_topic(rt, 3)
    before = checksum(rt, T)
    faulty = rt
    if step == "create-upload":
        faulty = with_objects(rt, ServerErrors(rt.objects, ["create_multipart"]))
        detail = "ObjectStoreError: S3 create_multipart failed: "
    else:
        monkeypatch.setattr(rt.metadata.rewrites, "record_upload", _unrecordable)
        detail = "ConnectionError: database unreachable"
    report = rewrite(faulty, small_bytes=shape(rt).target)
    monkeypatch.undo()
    (group,) = report.groups
    assert group.outcome == FAILED and (group.detail or "").startswith(detail)
    (segment,) = rt.metadata.segments.of_topic(T)
    assert segment.state is SegmentState.FAILED and segment.detail == group.detail
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    assert {segment.data_key, segment.index_key} <= queued
    assert uploads(rt.objects) == set()  # never created, or aborted
    check_one_copy(rt)
    assert all(x.offload_mode is OffloadMode.LEDGER for x in rt.metadata.list_ledgers(T))
    assert [g.outcome for g in rewrite(rt, small_bytes=shape(rt).target).groups] == [REWRITTEN]
    assert checksum(rt, T) == before
    check_clean_store(rt)

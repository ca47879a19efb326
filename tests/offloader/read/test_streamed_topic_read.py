"""A topic whose ledgers were offloaded both ways (whole, PIP-17, and streamed, PIP-76)
reads back identical to its hot copy, before and after the hot copies are deleted, and
switching the mode back and forth while writing loses and repeats nothing. Both backends."""

from __future__ import annotations

import time

import pytest

from fixtures.backends import make_topic, produce_ledgers, unaccounted_objects
from fixtures.pulsar_v2 import pulsar_v2_read_segment
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import OffloadMode, SegmentState
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime
from offloader.stream.offloader import StreamingOffloader
from offloader.stream.runs import streaming_topics

MiB = 1024 * 1024


def streaming_policy(rt: Runtime) -> dict[str, object]:
    """Parts as small as the store allows: 5 MiB on S3, 4 KiB on files."""
    part = rt.objects.capabilities.min_part_size
    part = max(part, 4096)
    return dict(min_part_bytes=part, segment_max_bytes=3 * part)


def set_policy(rt: Runtime, **changes: object) -> None:
    topic = rt.metadata.get_topic("orders")
    rt.metadata.set_policy(topic, topic.policy.updated(changes))


def test_mixed_topic_reads_back_identical(runtime: Runtime) -> None:
    rt = runtime
    policy = streaming_policy(rt)
    entry = policy["min_part_bytes"] // 8  # type: ignore[operator]
    make_topic(rt, deletion_lag_seconds=3600, **policy)
    whole = produce_ledgers(rt, "orders", [(20, entry), (5, entry)], seed=1)
    for ledger_id in whole:
        LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    set_policy(rt, streaming=True)
    streamed = produce_ledgers(rt, "orders", [(30, entry), (3, entry), (40, entry)], seed=2)
    before = TopicReader(rt).checksum("orders", Source.HOT)

    StreamingOffloader(rt).run_pass("orders", close_now=True)

    ledgers = {x.ledger_id: x for x in rt.metadata.list_ledgers("orders")}
    assert {ledgers[i].offload_mode for i in whole} == {OffloadMode.LEDGER}
    assert {ledgers[i].offload_mode for i in streamed} == {OffloadMode.STREAM}
    assert all(ledgers[i].is_offloaded for i in [*whole, *streamed])
    assert TopicReader(rt).checksum("orders", Source.TIERED) == before
    set_policy(rt, deletion_lag_seconds=0)
    deleted = delete_hot_copies(rt.metadata, rt.hot, "orders")
    assert sorted(h.ledger_id for h in deleted) == sorted([*whole, *streamed])
    assert TopicReader(rt).checksum("orders") == before
    assert unaccounted_objects(rt) == set()


def test_switching_modes_while_writing_loses_nothing(runtime: Runtime) -> None:
    rt = runtime
    policy = streaming_policy(rt)
    entry = policy["min_part_bytes"] // 8  # type: ignore[operator]
    make_topic(rt, deletion_lag_seconds=3600, **policy)
    offloader = StreamingOffloader(rt)
    for round_ in range(3):
        set_policy(rt, streaming=True)
        produce_ledgers(rt, "orders", [(12, entry), (7, entry)], seed=10 + round_)
        offloader.run_pass("orders")  # leaves a segment open (small tail or not full)
        set_policy(rt, streaming=False)
        produce_ledgers(rt, "orders", [(9, entry)], seed=20 + round_)
        offloader.run_pass("orders")  # completes the open segment, opens none
        assert not [s for s in rt.metadata.segments.of_topic("orders") if s.is_open]
        LedgerOffloader(rt).offload_topic("orders", up_to=10**6)
    hot = TopicReader(rt).checksum("orders", Source.HOT)
    ledgers = rt.metadata.list_ledgers("orders")
    assert all(x.is_offloaded for x in ledgers), [
        (x.ledger_id, x.offload_state) for x in ledgers if not x.is_offloaded
    ]
    assert TopicReader(rt).checksum("orders", Source.TIERED) == hot
    # every streamed ledger's entries are in offloaded segments exactly once
    for ledger in ledgers:
        if ledger.offload_mode is not OffloadMode.STREAM:
            continue
        pieces = rt.metadata.segments.pieces("orders", ledger.ledger_id)
        covered = [e for p in pieces for e in range(p.first_entry_id, p.last_entry_id + 1)]
        assert covered == list(range(ledger.entry_count))
    states = {s.state for s in rt.metadata.segments.of_topic("orders")}
    assert states <= {SegmentState.OFFLOADED, SegmentState.FAILED, SegmentState.REPLACED}
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert unaccounted_objects(rt) == set()


def test_a_backlog_beyond_the_budget_is_worked_off_over_passes(runtime: Runtime) -> None:
    """Back-pressure: a pass stops at its time budget after some progress; later passes
    finish the backlog with nothing lost or repeated."""
    rt = runtime
    policy = streaming_policy(rt)
    entry = policy["min_part_bytes"] // 4  # type: ignore[operator]
    make_topic(rt, deletion_lag_seconds=3600, streaming=True, **policy)
    produce_ledgers(rt, "orders", [(40, entry)] * 3, seed=5)
    hot = TopicReader(rt).checksum("orders", Source.HOT)
    offloader = StreamingOffloader(rt, budget_seconds=0.001)
    passes = []
    while len(passes) < 100:
        result = offloader.run_pass("orders", close_now=True)
        passes.append(result)
        if not result.over_budget:
            break
    assert len(passes) > 1 and passes[0].over_budget
    assert all(p.parts_uploaded or p.committed for p in passes[:-1])
    assert all(x.is_offloaded for x in rt.metadata.list_ledgers("orders"))
    assert TopicReader(rt).checksum("orders", Source.TIERED) == hot


def test_pass_objects_read_with_an_independent_decoder(runtime: Runtime) -> None:
    """What the pass uploads is what docs/FORMAT.md describes: the reader written from the
    document alone (fixtures/pulsar_v2.py) gets every entry back, in order, once."""
    rt = runtime
    policy = streaming_policy(rt)
    entry = policy["min_part_bytes"] // 6  # type: ignore[operator]
    make_topic(rt, deletion_lag_seconds=3600, streaming=True, **policy)
    ledgers = produce_ledgers(rt, "orders", [(25, entry), (4, entry), (30, entry)], seed=6)
    StreamingOffloader(rt).run_pass("orders", close_now=True)
    decoded = []
    for segment in rt.metadata.segments.of_topic("orders"):
        assert segment.state is SegmentState.OFFLOADED
        store = rt.stores.get(segment.store_id, "test")
        decoded += pulsar_v2_read_segment(store.get(segment.data_key), store.get(segment.index_key))
    expected = [
        (ledger_id, entry_id, payload)
        for ledger_id in ledgers
        for entry_id, payload in rt.hot.read("orders", ledger_id)
    ]
    assert decoded == expected


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_a_segment_closes_at_the_last_pass_before_its_age(runtime: Runtime) -> None:
    """With passes 1.2 s apart and a rollover age of 2 s, the second pass closes the
    segment (1.2 s old): the third would come after the age, so the bound on an entry's
    wait is the age plus one pass interval."""
    rt = runtime
    make_topic(
        rt,
        streaming=True,
        min_part_bytes=64 * 1024,
        segment_max_bytes=10 * 1024 * 1024,
        segment_max_age_seconds=2,
    )
    produce_ledgers(rt, "orders", [(5, 1000)], seed=8)
    first = StreamingOffloader(rt).run_pass("orders")
    assert first.committed == [] and first.open_segment is not None  # a tail waits
    time.sleep(1.2)
    second = StreamingOffloader(rt).run_pass("orders")
    assert second.committed == [first.open_segment]


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_topics_with_an_open_segment_still_get_their_pass(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, streaming=True, min_part_bytes=64 * 1024, segment_max_bytes=10 * 1024 * 1024)
    produce_ledgers(rt, "orders", [(5, 1000)], seed=9)
    StreamingOffloader(rt).run_pass("orders")
    set_policy(rt, streaming=False)
    assert streaming_topics(rt.metadata) == ["orders"]  # its open segment must complete
    StreamingOffloader(rt).run_pass("orders")
    assert streaming_topics(rt.metadata) == []

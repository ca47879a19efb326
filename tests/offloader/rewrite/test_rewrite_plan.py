"""What a rewrite run plans, from the metadata alone (no object is written here: ledgers are
recorded offloaded with made-up keys), on SQLite and PostgreSQL; and the run's parameters.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fixtures.metadata import begin, sealed_ledger
from fixtures.rewrites import assign_stream_segment, stream_segment, stream_segment_of
from offloader.exceptions import NotFoundError, TopicDeletedError
from offloader.metadata import Ledger, MetadataStore, Position, Segment, SegmentState
from offloader.params import RunParamsError, parse_ledger_range
from offloader.policy import OffloadPolicy
from offloader.rewrite.params import RewriteParams
from offloader.rewrite.plan import LEDGER, SEGMENT, plan_rewrite

T = "t"


@pytest.fixture
def store(metadata_url: str) -> Iterator[MetadataStore]:
    store = MetadataStore.open(metadata_url)
    store.create_topic(T, OffloadPolicy())
    yield store
    store.close()


def v1(store: MetadataStore, size: int, topic: str = T) -> Ledger:
    """A sealed ledger of 10 entries offloaded as v1 objects of ``size`` bytes."""
    ledger = sealed_ledger(store, topic)
    _, attempt = begin(store, ledger, f"a{topic}{ledger.ledger_id}")
    return store.attempts.commit(attempt, size)


def hot(store: MetadataStore) -> Ledger:
    return sealed_ledger(store, T)


def plan(store: MetadataStore, **values: object) -> list[list[int]]:
    """The planned groups as lists of ledger ids."""
    return [g.ledger_ids for g in plan_rewrite(store, RewriteParams(**values))]


def test_compaction_takes_runs_of_small_v1_objects_packed_up_to_the_target(
    store: MetadataStore,
) -> None:
    ids = [v1(store, 10).ledger_id for _ in range(5)]  # 1..5
    big = v1(store, 500)  # 6: not small, breaks the run
    ids += [v1(store, 10).ledger_id for _ in range(2)]  # 7, 8
    hot(store)  # 9: hot only, breaks the run
    lone = v1(store, 10)  # 10: alone, nothing to merge it with
    assert [big.ledger_id, lone.ledger_id] == [6, 10]
    groups = plan_rewrite(store, RewriteParams(target_bytes=30, small_bytes=20))
    assert [g.ledger_ids for g in groups] == [[1, 2, 3], [4, 5], [7, 8]]
    assert {g.kind for g in groups} == {LEDGER}
    assert [g.bytes for g in groups] == [30, 20, 20] and groups[0].objects == 6
    # the default small limit is a quarter of the target: 10 < 120 / 4, 500 is not
    assert plan(store, target_bytes=120) == [[1, 2, 3, 4, 5], [7, 8]]
    # everything smaller than the target is small, so the big one joins
    assert plan(store, target_bytes=2000, small_bytes=1000) == [[1, 2, 3, 4, 5, 6, 7, 8]]


def test_a_ledger_range_attempts_in_flight_and_trims_break_runs(store: MetadataStore) -> None:
    ledgers = [v1(store, 10) for _ in range(8)]  # 1..8
    assert plan(store, target_bytes=1000) == [list(range(1, 9))]
    assert plan(store, target_bytes=1000, first_ledger=3, last_ledger=6) == [[3, 4, 5, 6]]
    assert plan(store, target_bytes=1000, first_ledger=7) == [[7, 8]]
    begin(store, ledgers[3], "repair", replace=True)  # scrub repairs ledger 4
    assert plan(store, target_bytes=1000) == [[1, 2, 3], [5, 6, 7, 8]]
    # a trim inside ledger 2: ledger 1 is deleting (never a source), 2 is copied whole
    store.retention.move_start(store.get_topic(T), Position(ledger_id=2, entry_id=5))
    store.retention.mark_ledgers_deleting(T, 2, 100)
    assert plan(store, target_bytes=1000) == [[2, 3], [5, 6, 7, 8]]


def test_migration_to_v2_takes_every_v1_ledger_one_big_one_alone(store: MetadataStore) -> None:
    for size in (10, 10, 500, 10):
        v1(store, size)
    hot(store)  # 5
    v1(store, 10)  # 6
    assert plan(store, mode="to-v2", target_bytes=100) == [[1, 2], [3], [4], [6]]
    assert plan(store, mode="to-v2", target_bytes=1000) == [[1, 2, 3, 4], [6]]


def settled(store: MetadataStore, name: str, ledger: Ledger, size: int) -> Segment:
    """An offloaded stream segment holding all of ``ledger`` (which is settled)."""
    return stream_segment(store, T, name, ledger.ledger_id, ledger.entry_count - 1, size)


def test_segments_are_sources_of_their_own_kind_only_when_whole_and_live(
    store: MetadataStore,
) -> None:
    first, second = v1(store, 10), v1(store, 10)  # 1, 2
    s3, s4, s5 = (settled(store, f"s{i}", hot(store), 10) for i in range(3, 6))
    big = settled(store, "s6", hot(store), 500)
    s7 = settled(store, "s7", hot(store), 10)
    v1(store, 10)  # 8
    assert big.data_len == 500 and first.ledger_id == 1 and second.ledger_id == 2
    groups = plan_rewrite(store, RewriteParams(target_bytes=100, small_bytes=50))
    assert [(g.kind, g.ledger_ids) for g in groups] == [(LEDGER, [1, 2]), (SEGMENT, [3, 4, 5])]
    assert [s.segment_id for s in groups[1].segments] == [
        s3.segment_id,
        s4.segment_id,
        s5.segment_id,
    ]
    assert s7.state is SegmentState.OFFLOADED  # alone after the big one, like ledger 8
    # migration to v2 leaves segments alone: they break the v1 runs
    assert plan(store, mode="to-v2", target_bytes=1000) == [[1, 2], [8]]
    # a segment holding a trimmed ledger is never a source
    store.retention.move_start(store.get_topic(T), Position(ledger_id=4, entry_id=0))
    store.retention.mark_ledgers_deleting(T, 4, 100)
    assert plan(store, target_bytes=100, small_bytes=50) == [[4, 5]]


def test_an_open_segment_and_a_ledger_streamed_in_part_are_never_sources(
    store: MetadataStore,
) -> None:
    v1(store, 10), v1(store, 10)  # 1, 2
    # ledger 3 is in the stream's open segment: not offloaded, it breaks the run
    claim = store.segments.claim(T, "stream", 60_000)
    streaming = hot(store)
    assign_stream_segment(store, claim, "open", Position(ledger_id=streaming.ledger_id, entry_id=0))
    v1(store, 10), v1(store, 10)  # 4, 5
    assert plan(store, target_bytes=100, small_bytes=50) == [[1, 2], [4, 5]]
    assert plan(store, mode="to-v2", target_bytes=100) == [[1, 2], [4, 5]]


def test_a_v1_ledger_with_entries_in_a_segment_too_is_not_a_source(
    store: MetadataStore,
) -> None:
    """Ledger 2 was streamed in part (entries 0..4 in an offloaded segment), then offloaded
    ledger by ledger: rewriting its v1 objects would record its first entries twice."""
    v1(store, 10)
    partial = hot(store)
    stream_segment(store, T, "part", partial.ledger_id, 4, size=500)
    _, attempt = begin(store, store.get_ledger(T, partial.ledger_id), "v1-of-2")
    store.attempts.commit(attempt, 10)
    v1(store, 10)  # 3
    assert plan(store, mode="to-v2", target_bytes=1000) == [[1], [3]]
    assert plan(store, target_bytes=1000, small_bytes=100) == []


def test_topics_unknown_deleted_and_all(store: MetadataStore) -> None:
    v1(store, 10), v1(store, 10)
    v1(store, 10, topic="u"), v1(store, 10, topic="u")
    assert plan(store, target_bytes=100) == [[1, 2], [1, 2]]
    assert [
        g.topic for g in plan_rewrite(store, RewriteParams(topics=["u"], target_bytes=100))
    ] == ["u"]
    with pytest.raises(NotFoundError, match="'nope'"):
        plan(store, topics=["nope"])
    store.retention.delete_topic(store.get_topic("u"))
    with pytest.raises(TopicDeletedError, match="'u' was deleted"):
        plan(store, topics=["u"])
    assert [g.topic for g in plan_rewrite(store, RewriteParams(target_bytes=100))] == [T]


# --- parameters ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "defrag"}, "mode: 'defrag' is not one of"),
        ({"target_bytes": 0}, "target_bytes: 0 is less than the minimum of 1"),
        ({"max_groups": 0}, "max_groups: 0 is less than the minimum of 1"),
        ({"first_ledger": -1}, "first_ledger: -1 is less than the minimum of 0"),
        ({"first_ledger": 5, "last_ledger": 4}, "first_ledger 5 is above last_ledger 4"),
        ({"small_bytes": 10, "target_bytes": 5}, "small_bytes (10) is above target_bytes (5)"),
        ({"mode": "to-v2", "small_bytes": 5}, "small_bytes applies to mode compact only"),
        ({"topics": [" "]}, "topic names must be 1 to 512 characters"),
        ({"colour": 1}, "unknown run parameter(s) ['colour']"),
    ],
)
def test_bad_parameters_are_one_line_naming_the_field(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(RunParamsError) as caught:
        RewriteParams.parse(values)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_parameters_defaults_and_ranges() -> None:
    params = RewriteParams.parse({})
    assert (params.mode, params.target_bytes, params.small_limit, params.max_groups) == (
        "compact",
        128 * 1024 * 1024,
        32 * 1024 * 1024,
        100,
    )
    assert params.topics is None and not params.dry_run
    assert RewriteParams.parse({"topics": ["a ", "b", "a"]}).topics == ["a", "b"]
    ranged = RewriteParams(first_ledger=3, last_ledger=5)
    assert [i for i in range(8) if ranged.in_range(i)] == [3, 4, 5]
    assert [i for i in range(3) if RewriteParams(last_ledger=1).in_range(i)] == [0, 1]
    assert parse_ledger_range(" 10:200 ") == (10, 200)
    for bad in ("10", "a:b", "-1:3", "3:"):
        with pytest.raises(ValueError, match=r"expected FIRST:LAST"):
            parse_ledger_range(bad)


def test_a_segment_a_ledger_left_for_objects_of_its_own_is_not_a_source(
    store: MetadataStore,
) -> None:
    """Ledger 2 was offloaded again as v1 objects of its own (scrub's repair, or the way
    back to v1): the segment it shares with ledger 3 stays for 3 until its release, but
    is not copied again; the segments around it no longer form a run."""
    one, two, three = (hot(store) for _ in range(3))
    settled(store, "s1", one, 10)
    stream_segment_of(store, T, "s23", [(2, 0, two.entry_count - 1), (3, 0, 4)], 10)
    stream_segment(store, T, "s3", 3, three.entry_count - 1, first=5)
    assert plan(store, target_bytes=100, small_bytes=50) == [[1, 2, 3]]
    _, attempt = begin(store, store.get_ledger(T, 2), "own", replace=True)
    store.attempts.commit_replacement(attempt, 10, "test")
    assert store.segments.get("s23").state is SegmentState.OFFLOADED  # 3 still needs it
    assert plan(store, target_bytes=100, small_bytes=50) == []

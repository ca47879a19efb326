"""The totals the tiered-storage view reads (metadata/totals.py), called directly on both
databases: each topic's tiers now (``topic_tiers``) and every change of bytes per tier
(``tier_changes``), which offloader/status.py turns into the history.

The states come from the store's own calls. Its writers stamp the database's clock, so the
times are rewritten to known values before the changes are compared. A few rows are
rewritten into states the writers do not leave in the ordinary course (each test says
which): the module's rules still say what they count for, and the tests hold them to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from fixtures.metadata import begin, created_at, file_store_id, pending_deletions, sealed_ledger
from fixtures.segment_rows import add_part, assign, offloaded, pos
from offloader.metadata import (
    HotState,
    Ledger,
    MetadataStore,
    OffloadState,
    Position,
    SegmentState,
    schema,
    totals,
)
from offloader.metadata.records import TopicTiers
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime
from offloader.settings import Settings

L, G, D = schema.ledgers, schema.segments, schema.deletion_queue
T, U, V = "t", "u", "v"


@pytest.fixture
def rt(metadata_url: str, tmp_path: Path) -> Iterator[Runtime]:
    """The metadata store on both databases, with a file store for segments to name."""
    with Runtime.open(Settings(metadata_url=metadata_url, data_dir=tmp_path / "data")) as rt:
        yield rt


def topic_tiers(store: MetadataStore) -> list[TopicTiers]:
    with store.engine.connect() as conn:
        return totals.topic_tiers(conn)


def tier_changes(store: MetadataStore) -> list[tuple[int, int, int]]:
    """The changes, sorted (tier_changes gives them in no order)."""
    with store.engine.connect() as conn:
        return sorted(totals.tier_changes(conn))


def rewrite(
    store: MetadataStore, table: sa.Table, key: dict[str, object], **values: object
) -> None:
    """Set ``values`` on the one row of ``table`` whose columns match ``key``."""
    where = [table.c[name] == value for name, value in key.items()]
    with store.transaction() as conn:
        assert conn.execute(table.update().where(*where).values(**values)).rowcount == 1


def rewrite_ledger(store: MetadataStore, ledger: Ledger, **values: object) -> None:
    rewrite(store, L, {"topic": ledger.topic, "ledger_id": ledger.ledger_id}, **values)


def rewrite_segment(store: MetadataStore, segment_id: str, **values: object) -> None:
    rewrite(store, G, {"segment_id": segment_id}, **values)


def offloaded_ledger(
    store: MetadataStore, topic: str, size: int, data_len: int, attempt_id: str
) -> Ledger:
    """A sealed ledger of ``size`` bytes offloaded as its own ``data_len``-byte objects."""
    _, attempt = begin(store, sealed_ledger(store, topic, size), attempt_id)
    return store.attempts.commit(attempt, data_len)


def hot_copy_deleted(store: MetadataStore, ledger: Ledger) -> Ledger:
    return store.mark_hot_deleted(store.mark_hot_deleting(ledger))


def trim(store: MetadataStore, topic: str, below: int) -> list[int]:
    """Retention's whole course below ledger ``below``: ledgers marked, hot copies gone,
    queued keys deleted, ledgers ``deleted`` and the segments no ledger needs released."""
    store.retention.move_start(store.get_topic(topic), Position(ledger_id=below, entry_id=0))
    ids, _ = store.retention.mark_ledgers_deleting(topic, below, 100)
    store.retention.mark_hot_copies_deleted(topic, ids)
    store.deletions.complete(d.id for d in pending_deletions(store) if d.topic == topic)
    store.retention.finish_deleted_ledgers()
    return ids


def tiers(topic: str, hot: tuple[int, int], offloaded: tuple[int, int]) -> TopicTiers:
    """An active topic's tiers, (ledgers, bytes) of each, with no pending deletion."""
    return TopicTiers(
        topic=topic,
        state="active",
        hot_ledgers=hot[0],
        hot_bytes=hot[1],
        offloaded_ledgers=offloaded[0],
        offloaded_bytes=offloaded[1],
        pending_deletions=0,
        oldest_pending_deletion_ms=None,
    )


# --- topic_tiers ----------------------------------------------------------------------------
def test_each_topic_counts_its_own_ledgers_segments_and_deletions(rt: Runtime) -> None:
    """Two topics with ledgers, segments and pending deletions, and one with none: no
    topic's rows count for another, and a topic without rows reads zero everywhere. A
    streamed ledger counts as offloaded; its bytes are its segment's data object."""
    store = rt.metadata
    sealed_ledger(store, T, 100)
    offloaded_ledger(store, T, 200, 20, "t-a")
    t_streamed = sealed_ledger(store, T, 300)
    offloaded(rt, store.segments.claim(T, "p", 60_000), "t-s", [(t_streamed.ledger_id, 0, 9)])
    offloaded_ledger(store, U, 1000, 50, "u-a")
    u_streamed = [sealed_ledger(store, U, 2000).ledger_id for _ in range(2)]
    claim = store.segments.claim(U, "p", 60_000)
    offloaded(rt, claim, "u-s1", [(u_streamed[0], 0, 9)])  # 100 bytes each (one part)
    offloaded(rt, claim, "u-s2", [(u_streamed[1], 0, 9)])
    store.create_topic(V, OffloadPolicy())
    # an offload attempt's leftovers count for the attempt's topic
    store_id = file_store_id(store)
    store.deletions.enqueue(["t-1", "t-2"], "lost", store_id=store_id, attempt_id="t-a")
    store.deletions.enqueue(["u-1"], "lost", store_id=store_id, attempt_id="u-a")
    for deletion, enqueued_ms in zip(pending_deletions(store), [700, 300, 500], strict=True):
        rewrite(store, D, {"id": deletion.id}, enqueued_ms=enqueued_ms)

    t = tiers(T, hot=(3, 600), offloaded=(2, 20 + 100))
    u = tiers(U, hot=(3, 5000), offloaded=(3, 50 + 2 * 100))
    assert topic_tiers(store) == [
        t.model_copy(update=dict(pending_deletions=2, oldest_pending_deletion_ms=300)),
        u.model_copy(update=dict(pending_deletions=1, oldest_pending_deletion_ms=500)),
        tiers(V, hot=(0, 0), offloaded=(0, 0)),
    ]


def test_ledgers_deleted_by_retention_count_in_no_tier(rt: Runtime) -> None:
    """A topic whose ledgers all left the hot tier reads 0 hot bytes, not NULL. A ledger
    retention deleted counts nowhere, whatever its hot_state says: here one whose hot_state
    reads ``deleting`` (finish_deleted_ledgers waits for ``deleted``, but mark_hot_deleting
    does not look at deletion_state, so a late mark can leave one so)."""
    store = rt.metadata
    trimmed = offloaded_ledger(store, T, 100, 10, "a1")
    marked_late = sealed_ledger(store, T, 200)
    kept = hot_copy_deleted(store, offloaded_ledger(store, T, 300, 30, "a2"))
    assert trim(store, T, kept.ledger_id) == [trimmed.ledger_id, marked_late.ledger_id]
    rewrite_ledger(store, marked_late, hot_state=HotState.DELETING)

    assert topic_tiers(store) == [tiers(T, hot=(0, 0), offloaded=(1, 30))]


def test_a_pending_deletion_counts_for_its_ledgers_topic_or_its_attempts(rt: Runtime) -> None:
    """Retention queues a ledger's keys under its topic; an attempt's leftovers count for
    the attempt's topic. A key queued under a topic counts for it without an attempt too
    (a row no writer makes today: retention's name the ledger's committed attempt). Keys
    of neither (the sweep's orphans, a failed segment's) count for no topic; done ones
    count nowhere."""
    store = rt.metadata
    trimmed = offloaded_ledger(store, T, 100, 10, "a1")
    live = sealed_ledger(store, T, 200)
    start = Position(ledger_id=live.ledger_id, entry_id=0)
    store.retention.move_start(store.get_topic(T), start)
    store.retention.mark_ledgers_deleting(T, live.ledger_id, 10)  # a1-d, a1-i
    offloaded_ledger(store, U, 100, 10, "a2")
    store_id = file_store_id(store)
    store.deletions.enqueue(["a2-x"], "lost", store_id=store_id, attempt_id="a2")
    store.deletions.enqueue(["orphan"], "sweep", store_id=store_id)
    claim = store.segments.claim(T, "p", 60_000)
    store.segments.fail(claim, assign(rt, claim, "s", start), "upload lost")  # s-d, s-i
    with store.transaction() as conn:  # a key queued under its ledger's topic, no attempt
        conn.execute(
            D.insert().values(
                object_key="own",
                reason="ledger trimmed",
                state="pending",
                enqueued_ms=100,
                tries=0,
                next_try_ms=100,
                topic=T,
                ledger_id=trimmed.ledger_id,
            )
        )
    queue = {d.object_key: d for d in pending_deletions(store)}
    assert set(queue) == {"a1-d", "a1-i", "a2-x", "orphan", "s-d", "s-i", "own"}
    for key, enqueued_ms in {"a1-d": 400, "a1-i": 200, "a2-x": 300, "orphan": 50}.items():
        rewrite(store, D, {"id": queue[key].id}, enqueued_ms=enqueued_ms)
    store.deletions.complete([queue["a1-i"].id])

    t, u = topic_tiers(store)
    assert (t.topic, t.pending_deletions, t.oldest_pending_deletion_ms) == (T, 2, 100)
    assert (u.topic, u.pending_deletions, u.oldest_pending_deletion_ms) == (U, 1, 300)


# --- tier_changes ---------------------------------------------------------------------------
def test_each_ledger_and_segment_changes_the_tiers_at_its_own_times(rt: Runtime) -> None:
    """A ledger is hot from created_ms until hot_deleted_ms, offloaded (data_len) from
    offloaded_ms until deleted_ms; a streamed ledger adds no bytes of its own: its
    segment's data object counts from the segment's offloaded_ms until retention releases
    it (finished_ms). The changes add up to the topic's tiers now."""
    store = rt.metadata
    trimmed = offloaded_ledger(store, T, 100, 10, "a1")
    streamed_trimmed = sealed_ledger(store, T, 200)
    hot_only = sealed_ledger(store, T, 300)
    hot_gone = hot_copy_deleted(store, offloaded_ledger(store, T, 400, 40, "a2"))
    streamed = sealed_ledger(store, T, 500)
    claim = store.segments.claim(T, "p", 60_000)
    offloaded(rt, claim, "released", [(streamed_trimmed.ledger_id, 0, 9)])  # 100 bytes
    offloaded(rt, claim, "kept", [(streamed.ledger_id, 0, 9)])  # 100 bytes
    assert trim(store, T, hot_only.ledger_id) == [trimmed.ledger_id, streamed_trimmed.ledger_id]
    assert store.segments.get("released").state is SegmentState.DELETED
    assert store.segments.get("kept").state is SegmentState.OFFLOADED
    ledgers = [trimmed, streamed_trimmed, hot_only, hot_gone, streamed]
    created_at(store, T, {x.ledger_id: 1000 + 100 * i for i, x in enumerate(ledgers)})
    rewrite_ledger(store, trimmed, offloaded_ms=2000, hot_deleted_ms=4000, deleted_ms=5000)
    rewrite_ledger(store, streamed_trimmed, offloaded_ms=2100, hot_deleted_ms=4100, deleted_ms=5100)
    rewrite_ledger(store, hot_gone, offloaded_ms=2300, hot_deleted_ms=3300)
    rewrite_ledger(store, streamed, offloaded_ms=2400)
    rewrite_segment(store, "released", offloaded_ms=2100, finished_ms=5100)
    rewrite_segment(store, "kept", offloaded_ms=2400)

    changes = tier_changes(store)
    assert changes == sorted(
        [
            *[(1000, 100, 0), (4000, -100, 0), (2000, 0, 10), (5000, 0, -10)],
            *[(1100, 200, 0), (4100, -200, 0), (2100, 0, 0), (5100, 0, 0)],
            (1200, 300, 0),
            *[(1300, 400, 0), (3300, -400, 0), (2300, 0, 40)],
            *[(1400, 500, 0), (2400, 0, 0)],
            *[(2100, 0, 100), (5100, 0, -100)],  # the released segment
            (2400, 0, 100),  # the kept one
        ]
    )
    (now,) = topic_tiers(store)
    assert (now.hot_bytes, now.offloaded_bytes) == (300 + 500, 40 + 100)
    assert [sum(c[tier] for c in changes) for tier in (1, 2)] == [300 + 500, 40 + 100]


def test_only_offloaded_ledgers_and_committed_segments_add_offloaded_bytes(rt: Runtime) -> None:
    """Segments count once committed (offloaded, later deleted) and ledgers while
    offloaded, whatever else their rows hold: here replaced, failed and closing segments
    given an offloaded_ms (only a segment's commit stamps one), and a ledger no longer
    offloaded that kept its offloaded_ms and data_len (attempts.begin without ``replace``
    on an offloaded ledger, then the attempt's failure, leaves one so). Open segments'
    parts are in flight and failed ones' leftovers queued for deletion: neither is stored
    data."""
    store = rt.metadata
    first, second = sealed_ledger(store, T, 100), sealed_ledger(store, T, 200)
    claim = store.segments.claim(T, "p", 60_000)
    store.segments.fail(claim, assign(rt, claim, "replaced", pos(first.ledger_id, 0)), "lost")
    closing = assign(rt, claim, "closing", pos(first.ledger_id, 0))  # replaces "replaced"
    closing = store.segments.record_upload(claim, closing, "upload")
    closing = add_part(store.segments, claim, closing, pos(first.ledger_id, 9))
    store.segments.begin_close(claim, closing)
    other = sealed_ledger(store, U, 300)
    u_claim = store.segments.claim(U, "p", 60_000)
    store.segments.fail(u_claim, assign(rt, u_claim, "failed", pos(other.ledger_id, 0)), "lost")
    states = {s.segment_id: s.state for topic in (T, U) for s in store.segments.of_topic(topic)}
    assert states == {
        "replaced": SegmentState.REPLACED,
        "closing": SegmentState.CLOSING,
        "failed": SegmentState.FAILED,
    }
    for segment_id in states:
        rewrite_segment(store, segment_id, offloaded_ms=2000)
    created_at(store, T, {first.ledger_id: 1000, second.ledger_id: 1100})
    created_at(store, U, {other.ledger_id: 1200})
    rewrite_ledger(store, second, offload_state=OffloadState.NONE, offloaded_ms=2100, data_len=20)

    assert tier_changes(store) == [(1000, 100, 0), (1100, 200, 0), (1200, 300, 0)]


def test_a_hot_copys_end_falls_back_to_deleted_ms_then_created_ms(rt: Runtime) -> None:
    """A hot copy counts until hot_deleted_ms; one gone without it (no writer leaves it
    NULL: retention and hot deletion stamp it) counts until deleted_ms if retention deleted
    the ledger, else not at all (it ends at created_ms)."""
    store = rt.metadata
    trimmed = sealed_ledger(store, T, 100)
    hot_gone = sealed_ledger(store, T, 200)
    assert trim(store, T, hot_gone.ledger_id) == [trimmed.ledger_id]
    created_at(store, T, {trimmed.ledger_id: 1000, hot_gone.ledger_id: 1100})
    rewrite_ledger(store, trimmed, hot_deleted_ms=None, deleted_ms=5000)
    rewrite_ledger(store, hot_gone, hot_state=HotState.DELETED)

    assert tier_changes(store) == [
        (1000, 100, 0),
        (1100, -200, 0),
        (1100, 200, 0),
        (5000, -100, 0),
    ]


# --- lag_changes ----------------------------------------------------------------------------
def lag_changes(store: MetadataStore) -> list[tuple[int, int, int]]:
    """The lags' changes, sorted (lag_changes gives them in no order)."""
    with store.engine.connect() as conn:
        return sorted(totals.lag_changes(conn))


def all_deletions(store: MetadataStore) -> list[sa.Row]:
    """Every row of the deletion queue, done ones too, in queue order."""
    with store.engine.connect() as conn:
        return list(conn.execute(sa.select(D).order_by(D.c.id)).all())


def test_each_sealed_ledger_and_queued_key_changes_the_lags_at_its_own_times(
    rt: Runtime,
) -> None:
    """A sealed ledger with entries waits from sealed_ms until the earliest of its offload,
    the end of its hot copy and retention's deletion; open and empty ledgers never wait. A
    queued key is in the backlog from enqueued_ms until done_ms. What is still waiting
    adds up to the offload lag and the backlog the metrics observe now."""
    store = rt.metadata
    offloaded_one = offloaded_ledger(store, T, 100, 10, "a1")
    trimmed = sealed_ledger(store, T, 200)
    waiting = sealed_ledger(store, T, 300)
    stale_stamp = sealed_ledger(store, T, 400)  # not offloaded, an offloaded_ms kept
    epoch = store.get_topic(T).writer_epoch
    store.seal_ledger(store.allocate_ledger(T, epoch), 0, 0, epoch)  # empty: never waits
    store.allocate_ledger(T, epoch)  # open: not sealed yet
    assert trim(store, T, waiting.ledger_id) == [offloaded_one.ledger_id, trimmed.ledger_id]
    store.deletions.enqueue(["orphan"], "sweep", store_id=file_store_id(store))
    rewrite_ledger(store, offloaded_one, sealed_ms=1000, offloaded_ms=2000, deleting_ms=6000)
    rewrite_ledger(
        store, trimmed, sealed_ms=1100, hot_deleted_ms=3500, deleting_ms=3000, deleted_ms=4000
    )
    rewrite_ledger(store, waiting, sealed_ms=1200)
    rewrite_ledger(store, stale_stamp, sealed_ms=1300, offloaded_ms=1500)
    queue = {row.object_key: row.id for row in all_deletions(store)}
    assert set(queue) == {"a1-d", "a1-i", "orphan"}  # trim() completed the ledger's two
    rewrite(store, D, {"id": queue["a1-d"]}, enqueued_ms=6000, done_ms=7000)
    rewrite(store, D, {"id": queue["a1-i"]}, enqueued_ms=6000, done_ms=7500)
    rewrite(store, D, {"id": queue["orphan"]}, enqueued_ms=6500)

    changes = lag_changes(store)
    assert changes == sorted(
        [
            *[(1000, 100, 0), (2000, -100, 0)],
            *[(1100, 200, 0), (3000, -200, 0)],
            (1200, 300, 0),
            (1300, 400, 0),
            *[(6000, 0, 1), (6000, 0, 1), (7000, 0, -1), (7500, 0, -1)],
            (6500, 0, 1),
        ]
    )
    facts = store.observations.read(failing_tries=5)
    [topic] = facts.topics
    assert topic.unoffloaded_bytes == 300 + 400 == sum(c[1] for c in changes)
    assert store.deletions.backlog(5).pending == 1 == sum(c[2] for c in changes)


def test_a_done_key_without_done_ms_leaves_the_backlog_when_it_came(rt: Runtime) -> None:
    """No writer leaves a done key without done_ms; one such counts for no time at all."""
    store = rt.metadata
    store.deletions.enqueue(["k"], "sweep", store_id=file_store_id(store))
    [key] = all_deletions(store)
    rewrite(store, D, {"id": key.id}, state="done", enqueued_ms=500, done_ms=None)

    assert lag_changes(store) == [(500, 0, -1), (500, 0, 1)]

"""Trim (PDP-19): the start moves first by CAS, reads below it fail at once, ledgers wholly
below go through the deletion states and the queue, nothing is leaked. Both pairings."""

from __future__ import annotations

import dataclasses
import re
import uuid

import pytest

from fixtures.cli import assert_one_line_error, run_cli, run_cli_json
from fixtures.inspect import stored_keys
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.retention import all_entries, at_or_above, digest_of, live_object_keys, mixed_topic
from offloader import failpoints
from offloader.exceptions import CommitFailedError, NotFoundError, TrimmedError
from offloader.format.topic_start import decode_start
from offloader.gc.deletion_queue import process_deletions
from offloader.keys import ledger_object_keys, topic_start_key
from offloader.metadata import DeletionState, HotState, OffloadState, Position
from offloader.offload.batch import BatchOffloader
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.read.topic_reader import Source, TopicReader
from offloader.retention.cuts import take_cut
from offloader.retention.deletion import finish_deleted_ledgers, mark_below_start
from offloader.retention.trim import MAX_TRIES, delete_topic, resolve_target, trim_topic
from offloader.runtime import Runtime


def snapshot(rt: Runtime) -> tuple[object, ...]:
    """Everything a refused or dry trim must leave as it was."""
    return (
        rt.metadata.get_topic("orders"),
        rt.metadata.list_ledgers("orders"),
        pending_deletions(rt.metadata),
        {lid: rt.hot.exists("orders", lid) for lid in range(1, 8)},
        stored_keys(rt.objects),
    )


def test_trim_moves_the_start_hides_the_head_and_deletes_what_is_wholly_below(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    before = all_entries(rt, "orders")
    start = Position(ledger_id=ids[3], entry_id=2)  # inside ledger 4
    untouched = snapshot(rt)

    dry = trim_topic(rt, "orders", start, dry_run=True)
    assert (dry.dry_run, dry.changed, dry.start_before, dry.start_after) == (
        True,
        False,
        Position(ledger_id=0, entry_id=0),
        start,
    )
    assert (dry.ledgers_deleting, dry.queued_keys) == (ids[:3], 6)
    assert snapshot(rt) == untouched

    doomed = {lid: rt.metadata.get_ledger("orders", lid) for lid in ids[:3]}
    with caplog.at_level("INFO", logger="offloader.retention.trim"):
        result = trim_topic(rt, "orders", start)
    assert (result.changed, result.start_before, result.start_after) == (
        True,
        Position(ledger_id=0, entry_id=0),
        start,
    )
    logged = [r.getMessage() for r in caplog.records if r.name == "offloader.retention.trim"]
    assert logged == [f"topic orders start moved from 0:0 to {start}"]
    assert (result.ledgers_deleting, result.queued_keys, result.hot_deleted) == (
        ids[:3],
        6,
        [ids[2]],  # 1 and 2 had no hot copy left
    )

    # reads below the start fail at once, naming it; the head of ledger 4 is hidden
    reader = TopicReader(rt)
    named = rf"below the topic's start {ids[3]}:2"
    for ledger_id in ids[:3]:
        with pytest.raises(TrimmedError, match=rf"ledger {ledger_id} .*{named}"):
            next(reader.read("orders", ledger_id))
    with pytest.raises(TrimmedError, match=rf"ledger {ids[3]} entry 1 .*{named}"):
        next(reader.read("orders", ids[3], first=1))
    with pytest.raises(TrimmedError, match=rf"ledger {ids[3]} entry 1 .*{named}"):
        reader.read_entry("orders", ids[3], 1)
    with pytest.raises(TrimmedError, match=rf"ledger {ids[2]} entry 3 .*{named}"):
        reader.read_entry("orders", ids[2], 3, Source.TIERED)  # its objects still exist
    assert [e for e, _ in reader.read("orders", ids[3])] == [2, 3]
    assert reader.read_entry("orders", ids[3], 2) == before[(ids[3], 2)]
    kept = at_or_above(before, start)
    assert all_entries(rt, "orders") == kept
    for source in (Source.AUTO, Source.HOT):
        checksum = reader.checksum("orders", source)
        assert (checksum.digest, checksum.entries) == (digest_of(kept), len(kept))

    # intent recorded: deleting, hot copies gone (mark first), committed keys queued with
    # the store each offload recorded and the ledger they belong to
    queued = {
        (d.object_key, d.store_id, d.topic, d.ledger_id) for d in pending_deletions(rt.metadata)
    }
    expected = set()
    for lid, ledger in doomed.items():
        now = rt.metadata.get_ledger("orders", lid)
        assert (now.deletion_state, now.hot_state) == (DeletionState.DELETING, HotState.DELETED)
        assert not rt.hot.exists("orders", lid)
        expected |= {
            (k, ledger.store_id, "orders", lid) for k in (ledger.data_key, ledger.index_key)
        }
    assert queued == expected
    assert all(rt.metadata.get_ledger("orders", i).is_live for i in ids[3:])
    assert rt.hot.exists("orders", ids[3])  # partly below: stays whole

    # the planner and the offloaders never touch a trimmed ledger
    offloader = LedgerOffloader(rt)
    assert [x.ledger_id for x in offloader.plan("orders", up_to=ids[-1])] == ids[3:5]
    assert offloader.offload_ledger("orders", ids[0]).outcome is Outcome.TRIMMED
    assert [r.outcome for r in BatchOffloader(offloader).offload("orders", ids[:2])] == [
        Outcome.TRIMMED
    ] * 2

    # the GC drains the queue; then the ledgers are deleted and the store holds exactly
    # what the metadata references
    assert finish_deleted_ledgers(rt) == 0  # keys still queued
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.deleted, gc.failed, gc.remaining) == (6, 0, 0)
    assert finish_deleted_ledgers(rt) == 3
    assert [rt.metadata.get_ledger("orders", i).deletion_state for i in ids] == [
        DeletionState.DELETED
    ] * 3 + [DeletionState.NONE] * 3
    last = rt.metadata.get_ledger("orders", ids[5])
    assert last.is_offloaded
    # the data objects of the last ledger and the topic's recorded start (FORMAT.md)
    assert live_object_keys(rt) == {last.data_key, last.index_key}
    assert stored_keys(rt.objects) == live_object_keys(rt) | {topic_start_key("orders")}
    # a second GC pass changes nothing
    again = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (again.deleted, again.failed, again.remaining) == (0, 0, 0)
    assert finish_deleted_ledgers(rt) == 0
    assert all_entries(rt, "orders") == kept


def test_the_cli_names_the_start_when_a_read_is_below_it(runtime: Runtime) -> None:
    ids = mixed_topic(runtime)
    start = Position(ledger_id=ids[3], entry_id=2)
    trim_topic(runtime, "orders", start)
    line = assert_one_line_error(
        run_cli(runtime.settings, "read", "orders", "--ledger", str(ids[0]), ok=False)
    )
    assert line == (
        f"error: ledger {ids[0]} of topic 'orders' is below the topic's start {start}: trimmed"
    )


def test_trim_at_or_below_the_start_is_a_no_op_and_repeats_are_idempotent(
    runtime: Runtime,
) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    start = Position(ledger_id=ids[2], entry_id=0)
    assert trim_topic(rt, "orders", start).changed
    state = snapshot(rt)
    for position in (
        start,
        Position(ledger_id=ids[1], entry_id=3),
        Position(ledger_id=0, entry_id=0),
    ):
        result = trim_topic(rt, "orders", position)
        assert not result.changed
        assert (result.start_before, result.start_after) == (start, start)
        assert (result.ledgers_deleting, result.queued_keys, result.hot_deleted) == ([], 0, [])
        assert snapshot(rt) == state


def test_a_trim_at_the_start_takes_it_as_it_is(runtime: Runtime) -> None:
    """A start just past a ledger's last entry (moved there by the metadata, not by a
    trim): a trim at exactly the start is not normalized to the next ledger, so it moves
    nothing; it only marks the ledger wholly below."""
    rt = runtime
    ids = mixed_topic(rt)
    start = Position(ledger_id=ids[1], entry_id=4)  # 4 entries: ids 0..3
    rt.metadata.retention.move_start(rt.metadata.get_topic("orders"), start)
    result = trim_topic(rt, "orders", start)
    assert (result.start_before, result.start_after) == (start, start)
    assert result.ledgers_deleting == ids[:1]
    assert rt.metadata.get_topic("orders").start == start


def test_a_position_past_a_ledgers_last_entry_is_the_next_ledger(runtime: Runtime) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    result = trim_topic(rt, "orders", Position(ledger_id=ids[1], entry_id=4))  # 4 entries
    assert result.start_after == Position(ledger_id=ids[2], entry_id=0)
    assert result.ledgers_deleting == ids[:2]


def test_a_trim_at_the_start_is_a_no_op_even_when_its_ledger_was_sealed_empty(
    runtime: Runtime,
) -> None:
    """A trim to the end of the sealed data puts the start at the open ledger's entry 0;
    a writer killed right after its rollover leaves that ledger sealed empty. A trim at
    the start is still a no-op, dry or not: the start is not moved past the empty ledger
    (a position above it would be)."""
    rt = runtime
    mixed_topic(rt)
    epoch = rt.metadata.claim_writer("orders").writer_epoch
    empty = rt.metadata.allocate_ledger("orders", epoch)
    start = Position(ledger_id=empty.ledger_id, entry_id=0)
    assert trim_topic(rt, "orders", start).start_after == start
    rt.metadata.seal_ledger(empty, 0, 0, epoch)
    state = snapshot(rt)
    for dry_run in (True, False):
        result = trim_topic(rt, "orders", start, dry_run=dry_run)
        assert (result.changed, result.start_before, result.start_after) == (False, start, start)
        assert (result.ledgers_deleting, result.queued_keys) == ([], 0)
    assert snapshot(rt) == state


def test_a_trim_beyond_the_end_or_at_an_unknown_cut_is_refused_and_changes_nothing(
    runtime: Runtime,
) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    state = snapshot(rt)
    end = f"{ids[-1] + 1}:0"
    expected = (
        f"position {ids[-1] + 1}:1 is beyond the end of topic 'orders' ({end}: the sealed "
        "data ends there)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        trim_topic(rt, "orders", Position(ledger_id=ids[-1] + 1, entry_id=1))
    expected = (
        f"position {ids[4]}:5 is beyond the end of ledger {ids[4]} of topic 'orders' "
        "(4 entries, ids 0..3)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        trim_topic(rt, "orders", Position(ledger_id=ids[4], entry_id=5))
    with pytest.raises(NotFoundError, match="cut 99 of topic 'orders' does not exist"):
        resolve_target(rt, "orders", cut_id=99)
    with pytest.raises(NotFoundError, match="topic 'nope' does not exist"):
        trim_topic(rt, "nope", Position(ledger_id=1, entry_id=0))
    with pytest.raises(
        ValueError, match=r"^a trim takes exactly one of a cut id or a position L:E$"
    ):
        resolve_target(rt, "orders")
    with pytest.raises(ValueError, match=r"^a trim takes exactly one of a cut id or a position"):
        resolve_target(rt, "orders", cut_id=1, position=f"{ids[0]}:0")
    assert snapshot(rt) == state


def test_the_cli_refuses_a_bad_trim_and_changes_nothing(runtime: Runtime) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    state = snapshot(rt)
    for args, fragment in (
        (["--position", f"{ids[-1] + 5}:0"], "is beyond the end of topic 'orders'"),
        (["--cut", "99"], "cut 99 of topic 'orders' does not exist"),
        (["--position", "3"], "position '3': expected LEDGER:ENTRY"),
        (["--position=-1:0"], "expected LEDGER:ENTRY"),
    ):
        assert_one_line_error(run_cli(rt.settings, "trim", "orders", *args, ok=False), fragment)
    assert snapshot(rt) == state


def test_the_cli_dry_run_of_a_trim_at_a_cut_changes_nothing(runtime: Runtime) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    cut = take_cut(rt, "orders")
    state = snapshot(rt)
    report = run_cli_json(rt.settings, "trim", "orders", "--cut", str(cut.cut_id), "--dry-run")
    assert report["dry_run"] and not report["changed"]
    assert report["ledgers_deleting"] == ids and report["queued_keys"] == 8
    assert snapshot(rt) == state


def test_trim_at_a_cut(runtime: Runtime) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    cut = take_cut(rt, "orders")
    state = snapshot(rt)
    dry = trim_topic(rt, "orders", resolve_target(rt, "orders", cut_id=cut.cut_id), dry_run=True)
    assert (dry.dry_run, dry.changed, dry.start_after) == (True, False, cut.position)
    assert (dry.topic, dry.ledgers_deleting, dry.queued_keys, dry.hot_deleted) == (
        "orders",
        ids,
        8,
        [],
    )
    assert snapshot(rt) == state
    result = trim_topic(rt, "orders", resolve_target(rt, "orders", cut_id=cut.cut_id))
    assert result.start_after == cut.position and result.ledgers_deleting == ids
    assert result.topic == "orders"
    assert TopicReader(rt).checksum("orders").entries == 0
    # the history stays countable: a later cut still measures from the first ever entry
    assert take_cut(rt, "orders").offset_bytes == cut.offset_bytes


def test_a_racing_trim_with_a_stale_version_loses_cleanly(runtime: Runtime) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    seen = rt.metadata.get_topic("orders")
    first = rt.metadata.retention.move_start(seen, Position(ledger_id=ids[1], entry_id=0))
    with pytest.raises(CommitFailedError, match=r"topic 'orders' changed since version"):
        rt.metadata.retention.move_start(seen, Position(ledger_id=ids[3], entry_id=0))
    assert rt.metadata.get_topic("orders").start == first.start
    assert rt.metadata.retention.ledgers_to_trim("orders", ids[-1] + 1) == ids  # nothing marked yet
    # trim_topic reads again and wins against a stale start
    result = trim_topic(rt, "orders", Position(ledger_id=ids[3], entry_id=0))
    assert result.start_before == first.start and result.ledgers_deleting == ids[:3]


def test_an_offload_in_flight_when_its_ledger_is_trimmed_cannot_commit_or_leak(
    runtime: Runtime,
) -> None:
    """Single and batched commits both lose; the zombie's objects, written even after the
    GC ran, are queued again when it finds itself superseded, and removed."""
    rt = runtime
    from fixtures.backends import make_topic, produce_ledgers

    make_topic(rt)
    ids = produce_ledgers(rt, "orders", [(5, 2000), (5, 2000), (3, 100)])
    offloader = LedgerOffloader(rt)
    attempts = []
    for lid in ids[:2]:
        attempt_id = str(uuid.uuid4())
        ledger, attempt = rt.metadata.attempts.begin(
            rt.metadata.get_ledger("orders", lid),
            attempt_id,
            *ledger_object_keys(attempt_id, lid),
            "test",
            60_000,
            store_id=rt.stores.default_id(),
        )
        attempts.append((ledger, attempt))
    # the first uploads before the trim, the second (a zombie) only after the GC ran
    first_len = offloader._upload(attempts[0][0], attempts[0][1], lambda: None)
    result = trim_topic(rt, "orders", Position(ledger_id=ids[2], entry_id=0))
    assert result.ledgers_deleting == ids[:2] and result.queued_keys == 4
    for lid in ids[:2]:
        ledger = rt.metadata.get_ledger("orders", lid)
        assert (ledger.attempt_id, ledger.offload_state) == (None, OffloadState.NONE)
    assert {a.state for a in list_attempts(rt.metadata, "orders")} == {"superseded"}
    process_deletions(rt.metadata, rt.stores, rt.settings)
    # the zombie's PUTs land late (its hot copy is gone by now: it had read it earlier)
    zombie = attempts[1][1]
    for key in (zombie.data_key, zombie.index_key):
        rt.objects.put(key, b"late bytes")
    second_len = len(b"late bytes")
    assert stored_keys(rt.objects)  # the zombie's objects are there now

    with pytest.raises(CommitFailedError):
        rt.metadata.attempts.commit(attempts[0][1], first_len)
    assert rt.metadata.attempts.commit_batch([(attempts[1][1], second_len)]) == set()
    rt.metadata.attempts.fail(attempts[0][1], "lost")  # what the offloader does on a loss
    assert not rt.metadata.attempts.renew(attempts[1][1], 60_000)
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert finish_deleted_ledgers(rt) == 2
    assert stored_keys(rt.objects) == {topic_start_key("orders")}  # only the trim's record
    assert all(not rt.metadata.get_ledger("orders", i).is_offloaded for i in ids[:2])


def test_a_trim_or_delete_that_keeps_losing_the_race_gives_up_and_changes_nothing(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    stale = rt.metadata.get_topic("orders")
    rt.metadata.retention.move_start(stale, Position(ledger_id=ids[0], entry_id=1))  # a writer won
    state = snapshot(rt)
    reads: list[str] = []

    def get_topic(name: str) -> object:
        reads.append(name)
        return stale  # every try reads a version that is already gone

    monkeypatch.setattr(rt.metadata, "get_topic", get_topic)
    with pytest.raises(
        CommitFailedError,
        match=r"^could not move the start of topic 'orders': too much contention$",
    ):
        trim_topic(rt, "orders", Position(ledger_id=ids[2], entry_id=0))
    assert reads == ["orders"] * MAX_TRIES == ["orders"] * 20
    with pytest.raises(
        CommitFailedError, match=r"^could not delete topic 'orders': too much contention$"
    ):
        delete_topic(rt, "orders")
    monkeypatch.undo()
    # the metadata is as it was; the start's record went ahead, to the delete's target
    # (it is written before the database moves: a rebuild hides at most what was asked)
    *metadata, keys = snapshot(rt)
    assert (*metadata, keys - {topic_start_key("orders")}) == state
    recorded = decode_start(rt.objects.get(topic_start_key("orders")))
    assert recorded.position == (stale.next_ledger_id, 0)


def test_a_trim_target_is_a_position_or_its_text(runtime: Runtime) -> None:
    position = Position(ledger_id=3, entry_id=2)
    assert resolve_target(runtime, "orders", position=position) == position
    assert resolve_target(runtime, "orders", position="3:2") == position


def test_a_trim_works_in_batches_passing_each_crash_point_in_order(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-process view of what the crash tests kill at: with two ledgers a batch, five
    ledgers are marked in three transactions and their hot copies recorded gone in two."""
    ids = mixed_topic(runtime)
    rt = dataclasses.replace(
        runtime, settings=runtime.settings.model_copy(update={"trim_batch_ledgers": 2})
    )
    reached: list[str] = []
    monkeypatch.setattr(failpoints, "reach", reached.append)
    recorded: list[list[int]] = []
    record_gone = rt.metadata.retention.mark_hot_copies_deleted

    def mark_hot_copies_deleted(topic: str, ledger_ids: list[int]) -> None:
        recorded.append(list(ledger_ids))
        record_gone(topic, ledger_ids)

    monkeypatch.setattr(rt.metadata.retention, "mark_hot_copies_deleted", mark_hot_copies_deleted)
    result = trim_topic(rt, "orders", Position(ledger_id=ids[5], entry_id=0))
    assert (result.ledgers_deleting, result.queued_keys) == (ids[:5], 6)
    assert result.hot_deleted == ids[2:5]  # 1 and 2 had no hot copy left
    assert recorded == [ids[2:4], ids[4:5]]
    assert reached == [
        "after-start-recorded",
        "after-trim-start-moved",
        "mid-trim-ledgers",  # after each full batch: more may follow
        "mid-trim-ledgers",
        "after-ledger-deleting",
        *["after-trim-hot-delete"] * 3,
    ]


def test_a_trim_rerun_that_only_removes_hot_copies_reports_a_change(runtime: Runtime) -> None:
    """A trim killed once its ledgers were marked, run again at the same start: it marks
    nothing new, removes the hot copy left and says it changed something."""
    rt = runtime
    ids = mixed_topic(rt)
    start = Position(ledger_id=ids[3], entry_id=0)
    topic = rt.metadata.retention.move_start(rt.metadata.get_topic("orders"), start)
    assert mark_below_start(rt, topic).ledgers_deleting == ids[:3]
    assert rt.hot.exists("orders", ids[2])
    again = trim_topic(rt, "orders", start)
    assert (again.ledgers_deleting, again.hot_deleted, again.changed) == ([], [ids[2]], True)
    assert not rt.hot.exists("orders", ids[2])


def test_the_gc_finishes_trims_cut_short_and_a_trim_finishes_only_its_topic(
    runtime: Runtime,
) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    kept = mixed_topic(rt, "keep")
    # a trim of orders killed once the start moved: nothing below it marked yet
    start = Position(ledger_id=ids[3], entry_id=0)
    rt.metadata.retention.move_start(rt.metadata.get_topic("orders"), start)
    # a trim of keep killed once its ledgers were marked: their hot copies still there
    keep = rt.metadata.retention.move_start(
        rt.metadata.get_topic("keep"), Position(ledger_id=kept[3], entry_id=0)
    )
    assert mark_below_start(rt, keep).ledgers_deleting == kept[:3]
    assert rt.hot.exists("keep", kept[2])

    # trimming orders again at its start finishes its own trim, not keep's
    again = trim_topic(rt, "orders", start)
    assert (again.start_before, again.start_after) == (start, start)
    assert (again.ledgers_deleting, again.queued_keys, again.hot_deleted) == (ids[:3], 6, [ids[2]])
    assert again.changed
    assert rt.hot.exists("keep", kept[2])

    # the GC's finishing step finishes every topic, then the drained ledgers are deleted
    orders = rt.metadata.get_topic("orders")
    rt.metadata.retention.move_start(
        orders, Position(ledger_id=ids[4], entry_id=0)
    )  # cut short again
    assert finish_deleted_ledgers(rt) == 1  # ids[3] was hot only; the rest wait on keys
    assert not rt.hot.exists("keep", kept[2])
    assert rt.metadata.get_ledger("orders", ids[3]).deletion_state is DeletionState.DELETED
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert finish_deleted_ledgers(rt) == 6
    deleted = {
        (x.topic, x.ledger_id)
        for topic in ("orders", "keep")
        for x in rt.metadata.list_ledgers(topic)
        if x.deletion_state is DeletionState.DELETED
    }
    assert deleted == {("orders", i) for i in ids[:4]} | {("keep", i) for i in kept[:3]}

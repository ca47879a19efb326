"""Crash safety of trim and topic delete: a real CLI process killed with SIGKILL at each
step. Right after the kill the state is checked (the start already moved: nothing below it
readable), then a rerun (or the GC's finish_deleted_ledgers alone) converges: nothing below
the start readable, nothing above lost, nothing leaked. Both pairings."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from fixtures.backends import unaccounted_objects
from fixtures.cli import run_cli, run_cli_json
from fixtures.inspect import stored_keys
from fixtures.metadata import pending_deletions
from fixtures.retention import Entries, all_entries, at_or_above, live_object_keys, mixed_topic
from offloader.exceptions import TopicDeletedError, TrimmedError
from offloader.format.topic_start import decode_start
from offloader.gc.deletion_queue import process_deletions
from offloader.gc.run import collect_garbage
from offloader.keys import topic_start_key
from offloader.metadata import DeletionState, HotState, Position
from offloader.offload.batch import BatchOffloader
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.read.topic_reader import TopicReader
from offloader.retention.deletion import finish_deleted_ledgers
from offloader.runtime import Runtime
from offloader.settings import Settings

TRIM_POINTS = (
    "after-trim-start-moved",
    "mid-trim-ledgers",
    "after-ledger-deleting",
    "after-trim-hot-delete",
)


@pytest.fixture
def rt(backend_settings: Settings) -> Iterator[Runtime]:
    """One ledger per marking batch, so a kill between batches leaves some unmarked."""
    settings = backend_settings.model_copy(update={"trim_batch_ledgers": 1})
    with Runtime.open(settings) as runtime:
        yield runtime


def kill_at(rt: Runtime, point: str, *args: str) -> None:
    done = run_cli(rt.settings, *args, failpoints=point, ok=False)
    assert done.returncode == -signal.SIGKILL, f"{point} was never reached: {done.stderr}"


def ledger_states(rt: Runtime, ids: list[int]) -> list[tuple[DeletionState, HotState]]:
    return [
        (x.deletion_state, x.hot_state) for x in (rt.metadata.get_ledger("orders", i) for i in ids)
    ]


def gc_pass(rt: Runtime) -> int:
    """One GC pass as `offloader gc` runs it: recover, finish, drain, then finish ledgers."""
    gc = collect_garbage(rt, process_deletions)
    assert gc.drained.failed == 0
    return gc.ledgers_deleted


def assert_converged(rt: Runtime, ids: list[int], before: Entries, start: Position) -> None:
    """Nothing below the start readable, nothing above lost, nothing leaked."""
    below = [i for i in ids if i < start.ledger_id]
    for ledger_id in below:
        with pytest.raises(TrimmedError, match=f"below the topic's start {start}"):
            next(TopicReader(rt).read("orders", ledger_id))
        assert not rt.hot.exists("orders", ledger_id)
    assert all_entries(rt, "orders") == at_or_above(before, start)
    assert unaccounted_objects(rt) == set()
    gc_pass(rt)
    gc_pass(rt)  # keys the first pass's finish queued
    assert [x[0] for x in ledger_states(rt, below)] == [DeletionState.DELETED] * len(below)
    # the kept objects and the start's record (FORMAT.md), at the start
    assert stored_keys(rt.objects) == live_object_keys(rt) | {topic_start_key("orders")}
    recorded = decode_start(rt.objects.get(topic_start_key("orders")))
    assert recorded.position == start.key()
    assert pending_deletions(rt.metadata) == []
    assert all_entries(rt, "orders") == at_or_above(before, start)


@pytest.mark.parametrize("converge_by", ["trim", "finish", "gc"])
@pytest.mark.parametrize("point", TRIM_POINTS)
def test_a_trim_killed_at_each_step_is_finished_by_the_next_run(
    rt: Runtime, point: str, converge_by: str
) -> None:
    ids = mixed_topic(rt)
    before = all_entries(rt, "orders")
    start = Position(ledger_id=ids[4], entry_id=1)
    args = ("trim", "orders", "--position", str(start))
    kill_at(rt, point, *args)

    # right after the kill: the start moved first, so nothing below is readable already
    assert rt.metadata.get_topic("orders").start == start
    with pytest.raises(TrimmedError, match=f"below the topic's start {start}"):
        next(TopicReader(rt).read("orders", ids[0]))
    live = (DeletionState.NONE, HotState.DELETED)
    deleting = (DeletionState.DELETING, HotState.DELETED)
    marked_hot = (DeletionState.DELETING, HotState.DELETING)
    present = (DeletionState.NONE, HotState.PRESENT)
    states = ledger_states(rt, ids[:4])
    queued = {(d.ledger_id, d.object_key) for d in pending_deletions(rt.metadata)}
    if point == "after-trim-start-moved":
        assert states == [live, live, present, present] and queued == set()
    elif point == "mid-trim-ledgers":  # one batch of one ledger marked
        assert states == [deleting, live, present, present]
        assert {lid for lid, _ in queued} == {ids[0]} and len(queued) == 2
    elif point == "after-ledger-deleting":
        assert states == [deleting, deleting, marked_hot, marked_hot] and len(queued) == 6
        assert rt.hot.exists("orders", ids[2]) and rt.hot.exists("orders", ids[3])
    else:  # the first hot file removed, not yet recorded
        assert states == [deleting, deleting, marked_hot, marked_hot] and len(queued) == 6
        assert not rt.hot.exists("orders", ids[2]) and rt.hot.exists("orders", ids[3])
    assert ledger_states(rt, ids[4:]) == [present, (DeletionState.NONE, HotState.PRESENT)]
    # whatever is left unmarked below the start, no offload takes it any more
    offloader = LedgerOffloader(rt)
    assert [x.ledger_id for x in offloader.plan("orders", up_to=ids[-1])] == [ids[4]]
    assert offloader.offload_ledger("orders", ids[3]).outcome is Outcome.TRIMMED
    assert BatchOffloader(offloader).offload("orders", [ids[3]])[0].outcome is Outcome.TRIMMED
    # verified before the rerun too: ledgers an unfinished trim left below the start are
    # counted by `offloader verify` (the start hides them), not a breach
    assert unaccounted_objects(rt) == set()

    if converge_by == "trim":
        report = run_cli_json(rt.settings, *args)
        assert report["changed"] and report["start_before"] == report["start_after"]
        assert ledger_states(rt, ids[:4]) == [deleting] * 4
    elif converge_by == "finish":  # the GC's finish step alone marks the rest and removes
        # the hot copies; ledger 4 had nothing in the store, so it is deleted at once; the
        # others wait for their keys
        finish_deleted_ledgers(rt)
        gone = (DeletionState.DELETED, HotState.DELETED)
        assert ledger_states(rt, ids[:4]) == [deleting, deleting, deleting, gone]
    else:  # `offloader gc`: finishes the trim, deletes every queued key, records the ledgers
        report = run_cli_json(rt.settings, "gc")
        assert (report["failed"], report["remaining"], report["ledgers_deleted"]) == (0, 0, 4)
        gone = (DeletionState.DELETED, HotState.DELETED)
        assert ledger_states(rt, ids[:4]) == [gone] * 4
    assert_converged(rt, ids, before, start)


@pytest.mark.parametrize("point", ["after-trim-start-moved", "after-ledger-deleting"])
def test_a_topic_delete_killed_midway_is_finished_by_the_next_run(rt: Runtime, point: str) -> None:
    ids = mixed_topic(rt)
    kill_at(rt, point, "topic", "delete", "orders")
    topic = rt.metadata.get_topic("orders")
    assert topic.is_deleted and topic.start == Position(ledger_id=ids[-1] + 1, entry_id=0)
    with pytest.raises(TopicDeletedError):
        next(TopicReader(rt).read("orders", ids[-1]))
    marked = {x.deletion_state for x in rt.metadata.list_ledgers("orders")}
    expected = DeletionState.NONE if point == "after-trim-start-moved" else DeletionState.DELETING
    assert marked == {expected}

    report = run_cli_json(rt.settings, "topic", "delete", "orders")
    assert report["changed"]
    gc_pass(rt)
    assert gc_pass(rt) == 0
    assert {x.deletion_state for x in rt.metadata.list_ledgers("orders")} == {DeletionState.DELETED}
    # only the deleted topic's record of its start is left (FORMAT.md, "Topic starts")
    assert stored_keys(rt.objects) == {topic_start_key("orders")}
    assert pending_deletions(rt.metadata) == []
    assert not any(rt.hot.exists("orders", i) for i in ids)

"""A rebuild from the objects alone never makes trimmed entries readable again: a trim
inside a ledger is recorded in the store (``_metadata/starts/``) before the start moves in
the database, and the rebuild takes that start. Both pairings; the crash between the two
writes is a real CLI process killed at each side of it."""

from __future__ import annotations

import signal

import pytest

from fixtures.backends import Fresh, make_topic, produce_ledgers
from fixtures.cli import run_cli
from fixtures.inspect import stored_keys
from fixtures.retention import all_entries, digest_of
from offloader.exceptions import TrimmedError
from offloader.format.topic_start import decode_start
from offloader.gc.deletion_queue import process_deletions
from offloader.gc.run import collect_garbage
from offloader.gc.sweep import sweep
from offloader.keys import START_PREFIX, topic_start_key
from offloader.metadata import Position
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import TopicReader
from offloader.recovery import rebuild_from_objects
from offloader.retention.trim import delete_topic, trim_topic
from offloader.runtime import Runtime

TOPIC = "r2/trimmed"


def offloaded_topic(rt: Runtime) -> list[int]:
    """Four sealed ledgers of 4 entries, all offloaded, their hot copies gone: the store
    is the only copy, as after the deletion lag."""
    make_topic(rt, TOPIC)
    ids = produce_ledgers(rt, TOPIC, [(4, 2000)] * 4)
    LedgerOffloader(rt).offload_topic(TOPIC, up_to=ids[-1])
    delete_hot_copies(rt.metadata, rt.hot, TOPIC)
    return ids


def rebuilt(fresh: Fresh, rt: Runtime) -> Runtime:
    into = fresh()
    rebuild_from_objects(into.metadata.engine, into.objects, into.stores.default_location)
    return into


def assert_refused(rt: Runtime, ledger_id: int, first: int, last: int) -> None:
    with pytest.raises(TrimmedError, match="below the topic's start"):
        list(TopicReader(rt).read(TOPIC, ledger_id, first, last))


def test_a_trim_inside_a_ledger_survives_a_rebuild(runtime: Runtime, fresh: Fresh) -> None:
    rt = runtime
    ids = offloaded_topic(rt)
    trim_topic(rt, TOPIC, Position(ledger_id=ids[1], entry_id=2))
    collect_garbage(rt, process_deletions)
    entries = all_entries(rt, TOPIC)
    assert len(entries) == 2 + 4 + 4
    assert_refused(rt, ids[1], 0, 1)
    record = decode_start(rt.objects.get(topic_start_key(TOPIC)))
    assert (record.topic, record.position) == (TOPIC, (ids[1], 2))
    # the orphan sweep never queues the record, however old
    settings = rt.settings.model_copy(update={"sweep_grace_seconds": 0})
    swept = sweep(rt.metadata, rt.stores, settings)
    assert swept.orphans == 0
    assert topic_start_key(TOPIC) in stored_keys(rt.objects, START_PREFIX)

    again = rebuilt(fresh, rt)
    assert again.metadata.get_topic(TOPIC).start == Position(ledger_id=ids[1], entry_id=2)
    assert_refused(again, ids[1], 0, 1)
    after = all_entries(again, TOPIC)
    assert len(after) == len(entries) and digest_of(after) == digest_of(entries)


def test_a_rebuild_without_a_record_reads_from_the_objects(runtime: Runtime, fresh: Fresh) -> None:
    """The control: the same trim whose record is gone (an older release's trim) brings
    the hidden entries back, which is what the record is for."""
    rt = runtime
    ids = offloaded_topic(rt)
    trim_topic(rt, TOPIC, Position(ledger_id=ids[1], entry_id=2))
    collect_garbage(rt, process_deletions)
    rt.objects.delete_many([topic_start_key(TOPIC)])
    again = rebuilt(fresh, rt)
    assert len(all_entries(again, TOPIC)) == 4 + 4 + 4
    # a repeated trim (a no-op in the database) puts the record back
    trim_topic(rt, TOPIC, Position(ledger_id=ids[1], entry_id=2))
    assert decode_start(rt.objects.get(topic_start_key(TOPIC))).position == (ids[1], 2)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after-start-recorded", "after-trim-start-moved"])
def test_a_trim_killed_around_the_start_never_lets_a_rebuild_read_below_it(
    runtime: Runtime, fresh: Fresh, point: str
) -> None:
    """Killed after the record is written and before the database moves, or after both:
    either way a rebuild refuses every entry the trim was asked to hide; the database's own
    reads are unchanged until the start moves there; a rerun converges."""
    rt = runtime
    ids = offloaded_topic(rt)
    everything = all_entries(rt, TOPIC)
    done = run_cli(
        rt.settings, "trim", TOPIC, "--position", f"{ids[1]}:2", failpoints=point, ok=False
    )
    assert done.returncode == -signal.SIGKILL, f"{point} was never reached: {done.stderr}"
    moved = point == "after-trim-start-moved"
    expected_start = (
        Position(ledger_id=ids[1], entry_id=2) if moved else Position(ledger_id=0, entry_id=0)
    )
    assert rt.metadata.get_topic(TOPIC).start == expected_start
    if not moved:
        assert all_entries(rt, TOPIC) == everything  # nothing hidden before the start moves
    again = rebuilt(fresh, rt)
    assert again.metadata.get_topic(TOPIC).start == Position(ledger_id=ids[1], entry_id=2)
    assert_refused(again, ids[1], 0, 1)
    assert_refused(again, ids[0], 0, 3)
    run_cli(rt.settings, "trim", TOPIC, "--position", f"{ids[1]}:2")
    collect_garbage(rt, process_deletions)
    kept = all_entries(rt, TOPIC)
    assert len(kept) == 2 + 4 + 4
    assert digest_of(all_entries(rebuilt(fresh, rt), TOPIC)) == digest_of(kept)


def test_a_deleted_topic_records_its_start_and_a_rebuild_ignores_it_once_empty(
    runtime: Runtime, fresh: Fresh
) -> None:
    rt = runtime
    ids = offloaded_topic(rt)
    delete_topic(rt, TOPIC)
    record = decode_start(rt.objects.get(topic_start_key(TOPIC)))
    assert record.position == (ids[-1] + 1, 0)
    # before the GC ran, a rebuild sees the objects and hides every one of them
    early = rebuilt(fresh, rt)
    assert early.metadata.get_topic(TOPIC).start == Position(ledger_id=ids[-1] + 1, entry_id=0)
    for ledger_id in ids:
        assert_refused(early, ledger_id, 0, 3)
    collect_garbage(rt, process_deletions)
    into = fresh()
    result = rebuild_from_objects(into.metadata.engine, into.objects, into.stores.default_location)
    assert result.topics == []
    assert result.skipped == [
        f"{topic_start_key(TOPIC)}: topic {TOPIC!r} has no objects here; its start is not used"
    ]

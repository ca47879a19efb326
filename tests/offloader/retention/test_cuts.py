"""Stream cuts (PDP-19): a position with its time and the bytes before it. Both pairings."""

from __future__ import annotations

import pytest

from fixtures.backends import make_topic
from fixtures.cli import assert_one_line_error, run_cli, run_cli_json
from fixtures.metadata import pending_deletions
from fixtures.retention import mixed_topic
from offloader.exceptions import NotFoundError
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.metadata import Position
from offloader.retention.cuts import take_cut
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime


def test_cuts_record_the_end_of_the_sealed_data_and_the_bytes_before_it(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    ids = mixed_topic(rt)  # offloaded, hot and offloaded-with-hot ledgers
    sizes = {x.ledger_id: x.size_bytes for x in rt.metadata.list_ledgers("orders")}
    assert len(set(sizes.values())) > 1  # sizes differ, so a wrong sum shows

    with caplog.at_level("INFO", logger="offloader.retention.cuts"):
        first = take_cut(rt, "orders")
    assert (first.topic, first.position) == ("orders", Position(ledger_id=ids[-1] + 1, entry_id=0))
    assert first.offset_bytes == sum(sizes.values())
    # the retention DAG's task log names each cut it takes
    assert [r.getMessage() for r in caplog.records if r.name == "offloader.retention.cuts"] == [
        f"cut {first.cut_id} of orders at {ids[-1] + 1}:0 ({first.offset_bytes} bytes)"
    ]

    writer = ManagedLedgerWriter(rt.metadata, rt.hot, "orders")
    writer.append(b"x" * 50)  # an open ledger: its entries have no recorded length yet
    open_id = ids[-1] + 1
    second = take_cut(rt, "orders")
    assert second.position == Position(ledger_id=open_id, entry_id=0)
    assert second.offset_bytes == first.offset_bytes
    writer.close()  # sealed: one entry of 50 bytes
    third = take_cut(rt, "orders")
    assert third.position == Position(ledger_id=open_id + 1, entry_id=0)
    assert third.offset_bytes == first.offset_bytes + 50

    cuts = rt.metadata.retention.list_cuts("orders")
    assert cuts == [first, second, third]  # oldest first
    assert first.created_ms <= second.created_ms <= third.created_ms
    assert abs(rt.metadata.db_now_ms() - third.created_ms) < 60_000  # the database's clock
    assert rt.metadata.retention.get_cut("orders", second.cut_id) == second

    # a cut partway: trimming keeps measuring from the first ever entry
    trim_topic(rt, "orders", Position(ledger_id=ids[2], entry_id=0))
    assert take_cut(rt, "orders").offset_bytes == third.offset_bytes


def test_the_cli_lists_and_takes_cuts(runtime: Runtime) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    first = take_cut(rt, "orders")
    listed = run_cli_json(rt.settings, "cut", "list", "orders")
    assert [c["cut_id"] for c in listed] == [first.cut_id]
    made = run_cli_json(rt.settings, "cut", "create", "orders")
    assert (made["ledger_id"], made["entry_id"], made["offset_bytes"]) == (
        ids[-1] + 1,
        0,
        first.offset_bytes,
    )
    assert [c.cut_id for c in rt.metadata.retention.list_cuts("orders")] == [
        first.cut_id,
        made["cut_id"],
    ]


def test_a_cut_on_an_empty_topic_is_at_its_first_ledger_with_no_bytes(runtime: Runtime) -> None:
    make_topic(runtime, "empty")
    cut = take_cut(runtime, "empty")
    assert (cut.ledger_id, cut.entry_id, cut.offset_bytes) == (1, 0, 0)
    assert runtime.metadata.retention.list_cuts("empty") == [cut]
    # trimming at it moves the start there and deletes nothing: nothing lies below
    result = trim_topic(runtime, "empty", cut.position)
    assert (result.start_after, result.ledgers_deleting, result.queued_keys) == (
        cut.position,
        [],
        0,
    )
    assert pending_deletions(runtime.metadata) == []


def test_cuts_of_an_unknown_topic_or_an_unknown_cut_are_clear_errors(runtime: Runtime) -> None:
    make_topic(runtime)
    for call in (
        lambda: take_cut(runtime, "nope"),
        lambda: runtime.metadata.retention.list_cuts("nope"),
        lambda: runtime.metadata.retention.get_cut("nope", 1),
    ):
        with pytest.raises(NotFoundError, match="topic 'nope' does not exist"):
            call()
    with pytest.raises(NotFoundError, match="cut 7 of topic 'orders' does not exist"):
        runtime.metadata.retention.get_cut("orders", 7)
    with pytest.raises(NotFoundError, match="cut 3000000000 of topic 'orders' does not"):
        runtime.metadata.retention.get_cut("orders", 3_000_000_000)  # beyond the 32-bit column
    other = take_cut(runtime, "orders")
    make_topic(runtime, "other")
    with pytest.raises(NotFoundError, match=f"cut {other.cut_id} of topic 'other'"):
        runtime.metadata.retention.get_cut("other", other.cut_id)  # a cut belongs to its topic
    assert runtime.metadata.retention.list_cuts("other") == []


def test_the_cli_names_an_unknown_topic_of_a_cut(runtime: Runtime) -> None:
    for sub in ("create", "list"):
        assert_one_line_error(
            run_cli(runtime.settings, "cut", sub, "nope", ok=False), "topic 'nope' does not exist"
        )

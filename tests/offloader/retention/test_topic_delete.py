"""`offloader topic delete`: the writer fenced, reads refused, every ledger deleting then
deleted through the queue, the name not reused. Both pairings."""

from __future__ import annotations

import contextlib

import pytest

from fixtures.backends import produce_ledgers
from fixtures.cli import assert_one_line_error, run_cli, run_cli_json
from fixtures.inspect import stored_keys
from fixtures.retention import live_object_keys, mixed_topic
from offloader.exceptions import AlreadyExistsError, CommitFailedError, TopicDeletedError
from offloader.gc.deletion_queue import process_deletions
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.keys import topic_start_key
from offloader.metadata import DeletionState, HotState, Position
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.policy import OffloadPolicy
from offloader.read.topic_reader import TopicReader
from offloader.retention.cuts import take_cut
from offloader.retention.deletion import finish_deleted_ledgers
from offloader.retention.trim import delete_topic, trim_topic
from offloader.runtime import Runtime


def test_deleting_a_topic_fences_its_writer_and_deletes_every_ledger(runtime: Runtime) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    mixed_topic(rt, "keep")  # another topic: untouched throughout
    LedgerOffloader(rt).offload_topic("keep", up_to=10)
    keep_sum = TopicReader(rt).checksum("keep")
    writer = ManagedLedgerWriter(rt.metadata, rt.hot, "orders")
    writer.append(b"y" * 10)  # a live writer holds an open ledger
    open_ledger = rt.metadata.list_ledgers("orders")[-1]
    assert open_ledger.ledger_id == ids[-1] + 1

    result = delete_topic(rt, "orders")
    assert result.changed and result.ledgers_deleting == [*ids, open_ledger.ledger_id]
    assert result.queued_keys == 8  # the four offloaded ledgers
    topic = rt.metadata.get_topic("orders")
    assert topic.is_deleted and topic.deleted_ms is not None
    assert topic.start == Position(ledger_id=open_ledger.ledger_id + 1, entry_id=0)
    for ledger in rt.metadata.list_ledgers("orders"):
        assert (ledger.deletion_state, ledger.hot_state) == (
            DeletionState.DELETING,
            HotState.DELETED,
        )
        assert not rt.hot.exists("orders", ledger.ledger_id)

    # the old writer is fenced; a new one, produce, reads, cuts and trims are refused
    with pytest.raises(CommitFailedError, match="fenced"):
        rt.metadata.seal_ledger(open_ledger, 1, 10, writer._epoch)
    with pytest.raises(TopicDeletedError, match="'orders' was deleted; it cannot be written"):
        rt.metadata.allocate_ledger("orders", writer._epoch)
    with pytest.raises(TopicDeletedError, match="cannot be written to"):
        produce_ledgers(rt, "orders", [(1, 10)])
    with pytest.raises(TopicDeletedError, match="nothing of it is readable"):
        next(TopicReader(rt).read("orders", ids[-1]))
    with pytest.raises(TopicDeletedError, match="nothing of it is readable"):
        TopicReader(rt).checksum("orders")
    with pytest.raises(TopicDeletedError):
        take_cut(rt, "orders")
    with pytest.raises(
        TopicDeletedError, match=r"^topic 'orders' was deleted; it cannot be trimmed$"
    ):
        trim_topic(rt, "orders", Position(ledger_id=1, entry_id=0))

    # the queue drains, the ledgers become deleted, only the other topic's objects stay
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert finish_deleted_ledgers(rt) == len(ids) + 1
    assert {x.deletion_state for x in rt.metadata.list_ledgers("orders")} == {DeletionState.DELETED}
    # the other topic's objects, and the deleted topic's recorded start (FORMAT.md)
    assert stored_keys(rt.objects) == live_object_keys(rt) | {topic_start_key("orders")}
    assert live_object_keys(rt) != set()
    assert TopicReader(rt).checksum("keep") == keep_sum

    # deleting again only finishes leftovers; the name is not reused
    deleted = rt.metadata.get_topic("orders")
    again = delete_topic(rt, "orders")
    assert (again.changed, again.ledgers_deleting, again.queued_keys) == (False, [], 0)
    assert again.start_before == again.start_after == deleted.start
    assert rt.metadata.get_topic("orders") == deleted
    with pytest.raises(AlreadyExistsError, match=r"'orders' was deleted; .*not reused"):
        rt.metadata.create_topic("orders", OffloadPolicy())
    with contextlib.suppress(OSError):
        writer._writable.close()  # type: ignore[union-attr]  # release the fenced file


def test_the_cli_refuses_a_deleted_topic_and_deleting_again_changes_nothing(
    runtime: Runtime,
) -> None:
    rt = runtime
    ids = mixed_topic(rt)
    delete_topic(rt, "orders")
    assert_one_line_error(
        run_cli(rt.settings, "produce", "orders", "--count", "1", "--size", "1", ok=False),
        "topic 'orders' was deleted; it cannot be written to",
    )
    assert_one_line_error(
        run_cli(rt.settings, "read", "orders", "--ledger", str(ids[0]), ok=False),
        "topic 'orders' was deleted",
    )
    again = run_cli_json(rt.settings, "topic", "delete", "orders")
    assert not again["changed"] and again["ledgers_deleting"] == []
    assert_one_line_error(run_cli(rt.settings, "topic", "create", "orders", ok=False), "not reused")

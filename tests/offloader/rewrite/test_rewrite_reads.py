"""Readers never see a gap across a rewrite, on both pairings: a reader looping over the
topic while rewrites commit and the GC deletes the old objects reads the same bytes; a
reader that looked the old objects up before the swap keeps reading them during the
grace; with no grace, a reader whose objects vanish under it looks the ledger up again and
goes on from the next entry."""

from __future__ import annotations

import threading

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.inspect import checksum, entries_digest, stored_keys
from fixtures.rewrites import T, check_one_copy, gc, rewrite, shape, v1_topic
from offloader.exceptions import ObjectNotFoundError
from offloader.format import decode_segment_index
from offloader.metadata import OffloadMode
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import Source, TopicReader
from offloader.rewrite.report import REWRITTEN
from offloader.runtime import Runtime

MiB = 1024 * 1024


def test_a_reader_looping_over_the_topic_while_rewrites_commit_reads_the_same_bytes(
    runtime: Runtime,
) -> None:
    rt = runtime
    v1_topic(rt, 6)
    before = checksum(rt, T)
    seen: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.is_set() or len(seen) < 3:
                seen.append(checksum(rt, T))
        except BaseException as err:
            errors.append(err)

    reader = threading.Thread(target=loop)
    reader.start()
    try:
        for _ in range(3):  # one group a run, the old objects deleted at once (no grace)
            report = rewrite(rt, max_groups=1, small_bytes=shape(rt).target)
            gc(rt)
            if not report.groups:
                break
            assert [g.outcome for g in report.groups] == [REWRITTEN]
    finally:
        stop.set()
        reader.join(timeout=300)
    assert errors == [] and not reader.is_alive()
    assert set(seen) == {before} and len(seen) >= 3
    assert any(x.offload_mode is OffloadMode.STREAM for x in rt.metadata.list_ledgers(T))
    check_one_copy(rt)


@pytest.fixture
def big(runtime: Runtime) -> tuple[Runtime, int, str]:
    """A ledger of about 20 MiB offloaded as v1 (several 8 MiB sequential ranges), its
    hot copy deleted, read without read-ahead: each range is fetched when reached. The
    runtime, the ledger id and the digest of its entries."""
    rt = runtime
    rt.settings = rt.settings.model_copy(update={"read_prefetch": 0})
    make_topic(rt, T, read_buffer_size=64 * 1024)
    (ledger_id,) = produce_ledgers(rt, T, [(40, MiB)])
    LedgerOffloader(rt).offload_topic(T, up_to=ledger_id)
    delete_hot_copies(rt.metadata, rt.hot, T)
    digest = entries_digest(TopicReader(rt).read(T, ledger_id, source=Source.TIERED))
    return rt, ledger_id, digest


def _started(rt: Runtime, ledger_id: int):  # type: ignore[no-untyped-def]
    """A read of the whole ledger that has handed out its first entry (the first range is
    fetched, the others not yet)."""
    entries = TopicReader(rt).read(T, ledger_id)
    first = next(entries)
    assert first[0] == 0
    return first, entries


def test_a_reader_keeps_reading_the_old_objects_during_the_grace(
    big: tuple[Runtime, int, str],
) -> None:
    rt, ledger_id, digest = big
    rt.settings = rt.settings.model_copy(update={"replaced_object_grace_seconds": 3600})
    old = rt.metadata.get_ledger(T, ledger_id)
    first, entries = _started(rt, ledger_id)
    report = rewrite(rt, mode="to-v2")
    assert [g.outcome for g in report.groups] == [REWRITTEN]
    gc(rt)  # nothing due yet
    assert {old.data_key, old.index_key} <= stored_keys(rt.objects)
    assert entries_digest([first, *entries]) == digest


def test_a_reader_whose_objects_vanish_looks_the_ledger_up_again(
    big: tuple[Runtime, int, str],
) -> None:
    rt, ledger_id, digest = big
    old = rt.metadata.get_ledger(T, ledger_id)
    first, entries = _started(rt, ledger_id)
    assert [g.outcome for g in rewrite(rt, mode="to-v2").groups] == [REWRITTEN]
    (segment,) = rt.metadata.segments.of_topic(T)  # several parts of the topic's part size
    index = decode_segment_index(rt.objects.get(segment.index_key))
    assert len({b.part_id for x in index.ledgers for b in x.blocks}) >= 2
    gc(rt)  # no grace: the old objects are gone
    assert not {old.data_key, old.index_key} & stored_keys(rt.objects)
    assert entries_digest([first, *entries]) == digest
    # and once only: a ledger whose objects are gone for good is an error, not a loop
    (segment,) = rt.metadata.segments.of_topic(T)
    rt.objects.delete_many([segment.data_key])
    with pytest.raises(ObjectNotFoundError):
        list(TopicReader(rt).read(T, ledger_id))

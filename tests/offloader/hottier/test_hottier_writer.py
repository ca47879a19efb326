"""The managed-ledger writer: roll-over rules, fencing, recovery of a crashed writer."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from fixtures.backends import make_topic
from fixtures.cli import child_env
from offloader.exceptions import CommitFailedError
from offloader.hottier import filestore, ledger_files
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.metadata import LedgerState
from offloader.read.topic_reader import TopicReader
from offloader.runtime import Runtime


@pytest.fixture
def rt(tmp_path) -> Runtime:  # type: ignore[no-untyped-def]
    from fixtures.databases import upgraded
    from offloader.settings import Settings

    with Runtime.open(upgraded(Settings(data_dir=tmp_path / "data"))) as runtime:
        yield runtime


def test_rolls_over_by_entry_count(rt: Runtime) -> None:
    make_topic(rt, ledger_max_entries=3)
    with ManagedLedgerWriter(rt.metadata, rt.hot, "orders") as writer:
        positions = [writer.append(b"x") for _ in range(7)]
    assert positions == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (3, 0)]
    ledgers = rt.metadata.list_ledgers("orders")
    assert [(x.entry_count, x.state) for x in ledgers] == [(3, "sealed")] * 2 + [(1, "sealed")]


def test_rolls_over_by_bytes(rt: Runtime) -> None:
    make_topic(rt, ledger_max_bytes=1000)
    with ManagedLedgerWriter(rt.metadata, rt.hot, "orders") as writer:
        for _ in range(5):
            writer.append(b"x" * 400)
    assert [x.size_bytes for x in rt.metadata.list_ledgers("orders")] == [1200, 800]


def test_rolls_over_by_age(rt: Runtime) -> None:
    make_topic(rt, ledger_max_age_seconds=0.2)
    with ManagedLedgerWriter(rt.metadata, rt.hot, "orders") as writer:
        writer.append(b"a")
        time.sleep(0.25)
        writer.append(b"b")  # the ledger is old now: this entry seals it
        writer.append(b"c")
    assert [x.entry_count for x in rt.metadata.list_ledgers("orders")] == [2, 1]


def test_a_new_writer_fences_the_old_one(rt: Runtime) -> None:
    make_topic(rt, ledger_max_entries=2)
    old = ManagedLedgerWriter(rt.metadata, rt.hot, "orders")
    old.append(b"before")
    # the old writer still holds its ledger: the new one cannot seal it yet, and moves on
    new = ManagedLedgerWriter(rt.metadata, rt.hot, "orders")
    with pytest.raises(CommitFailedError, match="fenced"):
        old.append(b"fenced")  # ledger 1 is full now: sealing it is refused
    new.append(b"after")
    new.close()
    states = [(x.ledger_id, x.state) for x in rt.metadata.list_ledgers("orders")]
    assert states == [(1, LedgerState.OPEN), (2, LedgerState.SEALED)]
    # once the old writer is gone, the next owner's recovery seals what it acknowledged
    ManagedLedgerWriter(rt.metadata, rt.hot, "orders").close()
    ledgers = rt.metadata.list_ledgers("orders")
    assert [(x.ledger_id, x.entry_count) for x in ledgers] == [(1, 2), (2, 1)]
    assert all(x.state is LedgerState.SEALED for x in ledgers)
    assert [p for _, p in TopicReader(rt).read("orders", 1)] == [b"before", b"fenced"]


READY_AT = 2000
# a SIGKILL loses at most the writer's unflushed buffer: entries of 800 bytes plus a header
AT_MOST_LOST = filestore._WRITE_BUFFER // (ledger_files.RECORD_HEADER.size + 800)
WRITER = f"""
READY_AT = {READY_AT}
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.runtime import Runtime
with Runtime.open() as rt:
    writer = ManagedLedgerWriter(rt.metadata, rt.hot, "orders")
    i = 0
    while True:
        writer.append(i.to_bytes(8, "big") * 100)
        i += 1
        if i == READY_AT:
            print("ready", flush=True)
"""


def test_a_killed_writer_leaves_a_ledger_the_next_writer_seals(rt: Runtime) -> None:
    make_topic(rt, ledger_max_entries=1_000_000)
    env = child_env(rt.settings)
    child = subprocess.Popen([sys.executable, "-c", WRITER], env=env, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    time.sleep(0.2)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()
    (open_ledger,) = rt.metadata.list_ledgers("orders")
    assert open_ledger.state is LedgerState.OPEN
    ManagedLedgerWriter(rt.metadata, rt.hot, "orders").close()
    (sealed,) = rt.metadata.list_ledgers("orders")
    # every entry written out before "ready" survives; the sealed ledger is what reached
    # the file, no more (a partial record at the tail is cut off)
    assert sealed.state is LedgerState.SEALED
    assert sealed.entry_count >= READY_AT - AT_MOST_LOST
    entries = list(TopicReader(rt).read("orders", sealed.ledger_id))
    assert [e for e, _ in entries] == list(range(sealed.entry_count))
    assert all(p == i.to_bytes(8, "big") * 100 for i, p in entries)

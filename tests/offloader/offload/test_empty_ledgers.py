"""Empty ledgers (a writer killed right after a rollover leaves one) are retired explicitly.

The writer is really killed (SIGKILL in a child process) between allocating the next
ledger and flushing its first entry, so the ledger exists in the metadata and as an
empty hot file. Runs on both backend pairings.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from fixtures.backends import make_topic
from fixtures.cli import child_env, run_cli
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.metadata import HotState, LedgerState, OffloadState
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.offload.planner import due_ledgers
from offloader.read.topic_reader import TopicReader
from offloader.runtime import Runtime

ENTRIES = 5  # ledger 1 is full after 5 entries; the 6th opens ledger 2, then the kill

KILLED_WRITER = textwrap.dedent(
    f"""
    import os, signal
    from offloader.hottier.writer import ManagedLedgerWriter
    from offloader.runtime import Runtime
    rt = Runtime.open()
    writer = ManagedLedgerWriter(rt.metadata, rt.hot, "orders")
    for i in range({ENTRIES} + 1):
        writer.append(bytes([i]) * 100)  # the 6th stays in the write buffer
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def kill_a_writer_after_rollover(rt: Runtime) -> None:
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER],
        env=child_env(rt.settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


def test_empty_ledger_is_retired_and_the_open_one_left_alone(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, ledger_max_entries=ENTRIES)
    kill_a_writer_after_rollover(rt)
    one, two = rt.metadata.list_ledgers("orders")
    assert (one.state, one.entry_count) == (LedgerState.SEALED, ENTRIES)
    assert two.state is LedgerState.OPEN and rt.hot.exists("orders", 2)

    # The open empty ledger is the (dead) writer's current one: offload never touches it.
    results = LedgerOffloader(rt).offload_topic("orders", up_to=2)
    assert [(r.ledger_id, r.outcome) for r in results] == [(1, Outcome.OFFLOADED)]
    assert rt.metadata.get_ledger("orders", 2) == two and rt.hot.exists("orders", 2)
    before = TopicReader(rt).checksum("orders")

    ManagedLedgerWriter(rt.metadata, rt.hot, "orders").close()  # recovery seals it empty
    two = rt.metadata.get_ledger("orders", 2)
    assert (two.state, two.entry_count, two.hot_state) == (LedgerState.SEALED, 0, HotState.PRESENT)

    # Retired through the CLI, whatever the policy (no rule makes anything due).
    done = run_cli(rt.settings, "offload", "orders")
    assert "ledger 2: retired-empty (0 bytes)" in done.stdout.splitlines()
    two = rt.metadata.get_ledger("orders", 2)
    assert (two.state, two.offload_state, two.hot_state) == (
        LedgerState.SEALED,
        OffloadState.NONE,
        HotState.DELETED,
    )
    assert not rt.hot.exists("orders", 2)
    assert rt.metadata.counts()["ledgers_by_state"]["sealed/none/deleted"] == 1

    reader = TopicReader(rt)
    assert list(reader.read("orders", 2)) == []
    with pytest.raises(ValueError, match="ledger 2 of topic 'orders' is empty"):
        list(reader.read("orders", 2, 0, 0))
    assert reader.checksum("orders") == before
    # Idempotent: nothing more is due, and asking again says the same.
    assert LedgerOffloader(rt).offload_topic("orders") == []
    again = LedgerOffloader(rt).offload_ledger("orders", 2)
    assert again.outcome is Outcome.RETIRED_EMPTY


def test_retirement_killed_after_the_mark_is_finished_by_the_next_run(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, ledger_max_entries=ENTRIES)
    kill_a_writer_after_rollover(rt)
    ManagedLedgerWriter(rt.metadata, rt.hot, "orders").close()
    killed = run_cli(
        rt.settings,
        "offload",
        "orders",
        "--up-to",
        "2",
        failpoints="after-mark-hot-deleting",
        ok=False,
    )
    assert killed.returncode == -signal.SIGKILL
    two = rt.metadata.get_ledger("orders", 2)
    assert two.hot_state is HotState.DELETING and rt.hot.exists("orders", 2)

    results = LedgerOffloader(rt).offload_topic("orders")
    assert [(r.ledger_id, r.outcome) for r in results] == [(2, Outcome.RETIRED_EMPTY)]
    assert rt.metadata.get_ledger("orders", 2).hot_state is HotState.DELETED
    assert not rt.hot.exists("orders", 2)


def test_planner_takes_sealed_empty_ledgers_whatever_the_policy(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, ledger_max_entries=ENTRIES)
    kill_a_writer_after_rollover(rt)
    policy = rt.metadata.get_topic("orders").policy
    assert policy.offload_threshold_bytes is None and policy.offload_age_seconds is None
    assert due_ledgers(rt.metadata.list_ledgers("orders"), policy, 0) == []  # 2 is open
    ManagedLedgerWriter(rt.metadata, rt.hot, "orders").close()
    due = due_ledgers(rt.metadata.list_ledgers("orders"), policy, 0)
    assert [x.ledger_id for x in due] == [2]
    assert due_ledgers(rt.metadata.list_ledgers("orders"), policy, 0, up_to=1) == [
        rt.metadata.get_ledger("orders", 1)
    ]


def test_reading_an_empty_ledger_before_it_is_retired(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, ledger_max_entries=ENTRIES)
    kill_a_writer_after_rollover(rt)
    reader = TopicReader(rt)
    for _ in ("open", "sealed"):  # before and after the recovery seals it
        assert list(reader.read("orders", 2)) == []
        with pytest.raises(ValueError, match=r"^ledger 2 of topic 'orders' is empty$"):
            list(reader.read("orders", 2, 0, 3))
        ManagedLedgerWriter(rt.metadata, rt.hot, "orders").close()
    assert reader.checksum("orders").entries == ENTRIES


def test_the_dag_run_summary_counts_retired_empty_ledgers(runtime: Runtime) -> None:
    """What the offload_ledgers DAG's plan, batch and summary tasks call."""
    from offloader.offload.runs import offload_batch, plan_batches, summarize

    rt = runtime
    make_topic(rt, ledger_max_entries=ENTRIES)
    kill_a_writer_after_rollover(rt)
    ManagedLedgerWriter(rt.metadata, rt.hot, "orders").close()
    batches = plan_batches(rt.metadata, "orders", None, batch_size=10)
    assert [(b.topic, b.ledger_ids) for b in batches] == [("orders", [2])]
    results = [r for b in batches for r in offload_batch(rt, b.topic, b.ledger_ids)]
    summary = summarize(results)
    assert summary["outcomes"] == {"retired-empty": 1}
    assert (summary["ledgers"], summary["offloaded"], summary["bytes"]) == (1, 0, 0)

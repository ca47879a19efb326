"""Hot deletion in process: which hot copies are due (the lag, to the millisecond), what a
pass reports, the lag checked again when marking, and a retirement that lost a race.

The end-to-end cases (offload, read back, delete after the lag) are in
test_offload_roundtrip.py; the clock-skew ones in test_offload_clock.py.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from fixtures.backends import make_topic, produce_ledgers
from fixtures.faults import HotDeleteFails
from fixtures.metadata import ledger_record
from offloader.metadata import HotState, Ledger, LedgerState, OffloadState, schema
from offloader.offload.hot_deletion import (
    HotDeletion,
    delete_hot_copies,
    hot_copies_due,
    retire_empty_ledger,
)
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.runtime import Runtime

OFFLOADED_MS = 1_000_000_000
HOUR_MS = 3_600_000


def offloaded(ledger_id: int, **fields: object) -> Ledger:
    """An offloaded ledger record whose hot copy is still present."""
    values: dict[str, object] = dict(
        offload_state=OffloadState.OFFLOADED, offloaded_ms=OFFLOADED_MS
    )
    return ledger_record(ledger_id, **{**values, **fields})


def ids(ledgers: list[Ledger]) -> list[int]:
    return [x.ledger_id for x in ledgers]


def test_a_hot_copy_is_due_exactly_when_the_lag_has_passed() -> None:
    ledgers = [offloaded(1)]
    assert hot_copies_due(ledgers, 2.5, OFFLOADED_MS + 2499) == []
    assert ids(hot_copies_due(ledgers, 2.5, OFFLOADED_MS + 2500)) == [1]
    assert ids(hot_copies_due(ledgers, 0, OFFLOADED_MS)) == [1]
    # a long lag in milliseconds, not truncated or rounded away
    assert hot_copies_due(ledgers, 7 * 24 * 3600, OFFLOADED_MS + 7 * 24 * HOUR_MS - 1) == []
    assert ids(hot_copies_due(ledgers, 7 * 24 * 3600, OFFLOADED_MS + 7 * 24 * HOUR_MS)) == [1]


@pytest.mark.parametrize(
    ("fields", "due"),
    [
        (dict(hot_state=HotState.DELETING), True),  # a pass crashed after the mark
        (dict(hot_state=HotState.DELETING, offloaded_ms=OFFLOADED_MS + HOUR_MS), True),
        (dict(hot_state=HotState.DELETED), False),
        (dict(offloaded_ms=None), False),
        (dict(offload_state=OffloadState.NONE, offloaded_ms=None), False),
        (dict(offload_state=OffloadState.OFFLOADING, offloaded_ms=None), False),
        (dict(offload_state=OffloadState.NONE, hot_state=HotState.DELETING), False),
    ],
    ids=[
        "deleting",
        "deleting-within-lag",
        "deleted",
        "no-offload-time",
        "not-offloaded",
        "offloading",
        "empty-being-retired",
    ],
)
def test_which_hot_copies_are_due(fields: dict[str, object], due: bool) -> None:
    """Only offloaded ledgers: past the lag, or marked by an interrupted pass."""
    ledgers = [offloaded(1), offloaded(2, **fields), offloaded(3, offloaded_ms=None)]
    expected = [1, 2] if due else [1]
    assert ids(hot_copies_due(ledgers, 60, OFFLOADED_MS + 60_000)) == expected


def offloaded_ledgers(rt: Runtime, count: int, lag_seconds: float) -> list[Ledger]:
    make_topic(rt, deletion_lag_seconds=lag_seconds)
    ids = produce_ledgers(rt, "orders", [(5, 300 * (i + 1)) for i in range(count)])
    LedgerOffloader(rt).offload_topic("orders", up_to=ids[-1])
    return rt.metadata.list_ledgers("orders")


def backdate_offload(rt: Runtime, ledger_id: int, age_ms: int) -> None:
    """Make a ledger look offloaded ``age_ms`` ago by the database's clock."""
    ledgers = schema.ledgers
    offloaded_ms = rt.metadata.db_now_ms() - age_ms
    with rt.metadata.engine.begin() as conn:
        conn.execute(
            sa.update(ledgers)
            .where(ledgers.c.topic == "orders", ledgers.c.ledger_id == ledger_id)
            .values(offloaded_ms=offloaded_ms)
        )


def test_a_pass_reports_each_deleted_hot_copy_and_its_size(runtime: Runtime) -> None:
    rt = runtime
    one, two = offloaded_ledgers(rt, 2, lag_seconds=3600)
    backdate_offload(rt, one.ledger_id, HOUR_MS + 1000)
    expected = [HotDeletion("orders", one.ledger_id, one.size_bytes)]
    assert one.size_bytes != two.size_bytes > 0
    assert delete_hot_copies(rt.metadata, rt.hot, "orders", dry_run=True) == expected
    assert rt.metadata.get_ledger("orders", one.ledger_id).hot_state is HotState.PRESENT
    assert delete_hot_copies(rt.metadata, rt.hot, "orders") == expected
    assert rt.metadata.get_ledger("orders", one.ledger_id).hot_state is HotState.DELETED
    assert not rt.hot.exists("orders", one.ledger_id)
    assert rt.metadata.get_ledger("orders", two.ledger_id) == two
    assert rt.hot.exists("orders", two.ledger_id)


def test_marking_checks_the_lag_again_and_a_refused_ledger_does_not_stop_the_pass(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listing decides on one reading of the database's clock, the mark on another,
    inside its conditional update. If the clock steps back in between (an NTP correction
    on the database server, faked here since it cannot be made on demand), a hot copy the
    listing thought due must stay, and the pass goes on with the next ledger."""
    rt = runtime
    young, old, older = offloaded_ledgers(rt, 3, lag_seconds=3600)
    backdate_offload(rt, young.ledger_id, 60_000)  # a minute old: within the lag
    backdate_offload(rt, old.ledger_id, HOUR_MS + 2000)  # the lag passed 2 s ago
    backdate_offload(rt, older.ledger_id, 2 * HOUR_MS)
    real_now = rt.metadata.db_now_ms
    monkeypatch.setattr(rt.metadata, "db_now_ms", lambda: real_now() + HOUR_MS)

    deleted = delete_hot_copies(rt.metadata, rt.hot, "orders")
    assert deleted == [
        HotDeletion("orders", old.ledger_id, old.size_bytes),
        HotDeletion("orders", older.ledger_id, older.size_bytes),
    ]
    assert rt.metadata.get_ledger("orders", young.ledger_id).hot_state is HotState.PRESENT
    assert rt.hot.exists("orders", young.ledger_id)
    for ledger in (old, older):
        assert rt.metadata.get_ledger("orders", ledger.ledger_id).hot_state is HotState.DELETED
        assert not rt.hot.exists("orders", ledger.ledger_id)


def sealed_empty_ledger(rt: Runtime) -> Ledger:
    """A sealed ledger without entries whose (empty) hot file exists: one to retire."""
    make_topic(rt)
    epoch = rt.metadata.claim_writer("orders").writer_epoch
    ledger = rt.metadata.allocate_ledger("orders", epoch)
    writable = rt.hot.create("orders", ledger.ledger_id)
    writable.seal()
    writable.close()
    return rt.metadata.seal_ledger(ledger, 0, 0, epoch)


def test_retiring_an_empty_ledger_marks_then_deletes_and_is_idempotent(runtime: Runtime) -> None:
    rt = runtime
    ledger = sealed_empty_ledger(rt)
    assert rt.hot.exists("orders", ledger.ledger_id)
    retired = retire_empty_ledger(rt.metadata, rt.hot, ledger)
    assert retired == rt.metadata.get_ledger("orders", ledger.ledger_id)
    assert (retired.state, retired.hot_state) == (LedgerState.SEALED, HotState.DELETED)
    assert not rt.hot.exists("orders", ledger.ledger_id)
    assert retire_empty_ledger(rt.metadata, rt.hot, retired) == retired


def test_a_retirement_whose_delete_fails_leaves_the_mark_for_the_next_run(
    runtime: Runtime,
) -> None:
    """Mark first, delete second: when the hot file cannot be removed, the ledger is
    already marked deleting (so no reader or planner counts on the file) and stays so; the
    next retirement deletes the file and records it."""
    rt = runtime
    ledger = sealed_empty_ledger(rt)
    seen: list[HotState] = []
    failing = HotDeleteFails(
        rt.hot, lambda t, i: seen.append(rt.metadata.get_ledger(t, i).hot_state)
    )
    with pytest.raises(OSError, match=f"cannot unlink the hot copy of orders/{ledger.ledger_id}"):
        retire_empty_ledger(rt.metadata, failing, ledger)
    assert (seen, failing.tries) == ([HotState.DELETING], 1)
    marked = rt.metadata.get_ledger("orders", ledger.ledger_id)
    assert marked.hot_state is HotState.DELETING and marked.version == ledger.version + 1
    assert rt.hot.exists("orders", ledger.ledger_id)

    retired = retire_empty_ledger(rt.metadata, rt.hot, marked)
    assert retired.hot_state is HotState.DELETED and retired.version == marked.version + 1
    assert not rt.hot.exists("orders", ledger.ledger_id)


def test_a_retirement_that_lost_the_race_returns_the_ledger_as_the_winner_left_it(
    runtime: Runtime,
) -> None:
    """Two runs read the same empty ledger; the first retires it, the second's mark fails
    its compare-and-set and it reports the ledger's current row instead of failing."""
    rt = runtime
    ledger = sealed_empty_ledger(rt)
    winner = retire_empty_ledger(rt.metadata, rt.hot, ledger)
    loser = retire_empty_ledger(rt.metadata, rt.hot, ledger)  # its record is stale
    assert loser == winner == rt.metadata.get_ledger("orders", ledger.ledger_id)
    assert loser.hot_state is HotState.DELETED and loser.version > ledger.version

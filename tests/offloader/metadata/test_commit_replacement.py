"""The replacement transition in the store (scrub's repair): one committed attempt per
ledger after the swap, the replaced objects queued, and refusals that name the attempt.

In-process on both backends; the SIGKILL crash test of the same transition is
tests/offloader/scrub/test_scrub_crash.py.
"""

from __future__ import annotations

import pytest

from fixtures.backends import produce_ledgers
from fixtures.metadata import begin, pending_deletions
from fixtures.scrub import offloaded_topic
from offloader.exceptions import CommitFailedError
from offloader.metadata import AttemptState
from offloader.runtime import Runtime

SMALL = [(10, 500), (10, 500)]


def test_the_swap_supersedes_only_the_replaced_attempt(runtime: Runtime) -> None:
    rt = runtime
    first, second = offloaded_topic(rt, shapes=SMALL)
    _, attempt = begin(rt.metadata, first, "repl", replace=True)
    reason = "crc mismatch " + "x" * 3000  # a long reason is cut to the column's 2,000
    swapped = rt.metadata.attempts.commit_replacement(attempt, 123, reason)

    assert (swapped.offload_attempt_id, swapped.data_key, swapped.index_key, swapped.data_len) == (
        "repl",
        "repl-d",
        "repl-i",
        123,
    )
    assert swapped.attempt_id is None and swapped.version > first.version
    old = rt.metadata.attempts.get(first.offload_attempt_id or "")
    assert old.state is AttemptState.SUPERSEDED
    assert old.detail == f"replaced by repl: {reason}"[:2000]
    new = rt.metadata.attempts.get("repl")
    assert new.state is AttemptState.COMMITTED and new.finished_ms is not None
    # the other ledger's committed attempt is untouched
    assert rt.metadata.attempts.get(second.offload_attempt_id or "").state is AttemptState.COMMITTED
    assert rt.metadata.get_ledger("orders", second.ledger_id) == second
    queued = {(d.object_key, d.attempt_id) for d in pending_deletions(rt.metadata)}
    assert queued == {
        (first.data_key, first.offload_attempt_id),
        (first.index_key, first.offload_attempt_id),
    }
    assert {d.reason for d in pending_deletions(rt.metadata)} == {f"replaced: {reason}"[:255]}


def test_an_attempt_that_lost_its_ledger_is_refused_by_name(runtime: Runtime) -> None:
    rt = runtime
    (first,) = offloaded_topic(rt, shapes=SMALL[:1])
    _, stale = begin(rt.metadata, first, "stale", lease_ms=-1, replace=True)
    ledger = rt.metadata.get_ledger("orders", first.ledger_id)
    begin(rt.metadata, ledger, "winner", replace=True)  # the stale one's lease was over
    before = rt.metadata.get_ledger("orders", first.ledger_id)
    message = rf"^attempt stale \(epoch {stale.epoch}\) no longer owns offloaded ledger orders/"
    with pytest.raises(CommitFailedError, match=message):
        rt.metadata.attempts.commit_replacement(stale, 1, "r")
    assert rt.metadata.get_ledger("orders", first.ledger_id) == before
    # only the takeover's queueing of the stale attempt's keys: the offloaded objects stay
    assert {d.object_key for d in pending_deletions(rt.metadata)} == {"stale-d", "stale-i"}


def test_a_ledger_that_is_not_offloaded_cannot_be_replaced(runtime: Runtime) -> None:
    """An ordinary first attempt owns its ledger too: the replacement commit still refuses
    it, because there is nothing offloaded to replace."""
    rt = runtime
    offloaded_topic(rt, shapes=SMALL[:1])
    (fresh_id,) = produce_ledgers(rt, "orders", [(5, 100)])
    fresh = rt.metadata.get_ledger("orders", fresh_id)
    owned, attempt = begin(rt.metadata, fresh, "first-try")
    with pytest.raises(CommitFailedError, match="no longer owns offloaded ledger"):
        rt.metadata.attempts.commit_replacement(attempt, 1, "r")
    assert rt.metadata.get_ledger("orders", fresh_id) == owned
    assert rt.metadata.attempts.get("first-try").state is AttemptState.STARTED


def test_the_replaced_objects_are_due_after_the_grace(runtime: Runtime) -> None:
    """A reader that looked the old keys up before the swap still finds them: they are
    queued due ``grace_ms`` after the database's now, not at once."""
    rt = runtime
    first, _ = offloaded_topic(rt, shapes=SMALL)
    _, attempt = begin(rt.metadata, first, "repl", replace=True)
    before = rt.metadata.db_now_ms()
    rt.metadata.attempts.commit_replacement(attempt, 123, "crc mismatch", grace_ms=3_600_000)
    after = rt.metadata.db_now_ms()

    queued = pending_deletions(rt.metadata)
    assert {d.object_key for d in queued} == {first.data_key, first.index_key}
    assert all(before + 3_600_000 <= d.next_try_ms <= after + 3_600_000 for d in queued)
    assert rt.metadata.deletions.due(10) == []
    assert len(rt.metadata.deletions.due(10, at_ms=after + 3_600_000)) == 2

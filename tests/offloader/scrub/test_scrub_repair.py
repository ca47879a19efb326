"""Repair on both backends: a damaged ledger whose hot copy is present is offloaded again
through the normal path (reads then return the hot copy's bytes, the damaged keys are
queued, exactly one attempt is committed); one without a hot copy fails the run and
nothing changes."""

from __future__ import annotations

import pytest

from fixtures.backends import unaccounted_objects
from fixtures.inspect import entries_digest
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.scrub import DAMAGES, offloaded_topic
from offloader.exceptions import ScrubFailedError
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import AttemptState, Ledger
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime
from offloader.scrub import Action, run_scrub


def committed(rt: Runtime, ledger: Ledger) -> list[str]:
    return [
        a.attempt_id
        for a in list_attempts(rt.metadata, ledger.topic, AttemptState.COMMITTED)
        if a.ledger_id == ledger.ledger_id
    ]


@pytest.mark.parametrize(
    "kind", ["flipped-payload-byte", "missing-data-object", "missing-index-object"]
)
def test_a_damaged_ledger_with_a_hot_copy_is_offloaded_again(runtime: Runtime, kind: str) -> None:
    rt = runtime
    ledgers = offloaded_topic(rt)
    victim = ledgers[0]
    hot = entries_digest(rt.hot.read(victim.topic, victim.ledger_id))
    DAMAGES[kind](rt, victim)
    report = run_scrub(rt)
    (verdict,) = report.damaged
    assert verdict.action is Action.REPAIRED and not report.failed, verdict.detail
    report.raise_for_failure()
    after = rt.metadata.get_ledger("orders", victim.ledger_id)
    assert after.is_offloaded and after.offload_attempt_id == verdict.replaced_by
    assert (
        after.offload_attempt_id != victim.offload_attempt_id and after.data_key != victim.data_key
    )
    assert committed(rt, victim) == [after.offload_attempt_id]  # exactly one
    old = rt.metadata.attempts.get(victim.offload_attempt_id or "")
    assert old.state is AttemptState.SUPERSEDED and "replaced by" in (old.detail or "")
    queued = {d.object_key: d for d in pending_deletions(rt.metadata)}
    assert set(queued) == {victim.data_key, victim.index_key}
    assert all(d.reason.startswith("replaced: scrub: ") for d in queued.values())
    tiered = TopicReader(rt).read("orders", victim.ledger_id, source=Source.TIERED)
    assert entries_digest(tiered) == hot
    # the other ledgers were not touched, and a second scrub finds nothing
    for other in ledgers[1:]:
        assert rt.metadata.get_ledger("orders", other.ledger_id) == other
    again = run_scrub(rt)
    assert again.damaged == [] and again.counts.entries == sum(x.entry_count for x in ledgers)
    assert unaccounted_objects(rt) == set()
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.deleted, gc.failed, gc.remaining) == (
        2,
        0,
        0,
    )
    assert not rt.objects.exists(victim.index_key or "") and not rt.objects.exists(
        victim.data_key or ""
    )


def test_a_damaged_ledger_without_a_hot_copy_fails_the_run_and_changes_nothing(
    runtime: Runtime,
) -> None:
    rt = runtime
    ledgers = offloaded_topic(rt)
    delete_hot_copies(rt.metadata, rt.hot, "orders")
    victim = rt.metadata.get_ledger("orders", ledgers[0].ledger_id)
    assert not victim.has_hot_copy
    DAMAGES["flipped-payload-byte"](rt, victim)
    ledgers_before = rt.metadata.list_ledgers("orders")
    attempts_before = list_attempts(rt.metadata)
    objects_before = {i.key: rt.objects.get(i.key) for i in rt.objects.list()}
    report = run_scrub(rt)
    (verdict,) = report.damaged
    assert verdict.action is Action.NO_HOT_COPY and report.failed
    assert "hot copy deleted" in verdict.detail
    with pytest.raises(
        ScrubFailedError, match=f"orders/{victim.ledger_id} \\(no-hot-copy\\)"
    ) as raised:
        report.raise_for_failure()
    assert raised.value.report is report
    assert rt.metadata.list_ledgers("orders") == ledgers_before
    assert list_attempts(rt.metadata) == attempts_before
    assert pending_deletions(rt.metadata) == []
    assert {i.key: rt.objects.get(i.key) for i in rt.objects.list()} == objects_before


def test_a_ledger_replaced_since_the_scrub_read_it_is_left_alone(runtime: Runtime) -> None:
    """The driver settles findings against the metadata as it is then: objects the ledger no
    longer names are not repaired twice (a second scrub or repair got there first)."""
    from offloader.scrub import finish_scrub, plan_scrub, scrub_targets

    rt = runtime
    victim = offloaded_topic(rt)[1]
    DAMAGES["flipped-index-byte"](rt, victim)
    results = scrub_targets(rt.stores, plan_scrub(rt.metadata, ["orders"]))
    first = run_scrub(rt)  # another run repairs it meanwhile
    assert [v.action for v in first.damaged] == [Action.REPAIRED]
    late = finish_scrub(rt, results, topics=["orders"], repair=True, started_ms=0)
    (verdict,) = late.damaged
    assert verdict.action is Action.CHANGED and not late.failed
    assert len(committed(rt, victim)) == 1

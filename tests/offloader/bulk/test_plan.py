"""The export's plan (offloader/bulk/plan.py), from the metadata store alone: which ledgers,
cut into slices of about ``slice_bytes``, each slice carrying what an executor needs; what
the plan refuses, naming the topic or ledger and what to do."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from fixtures.backends import make_topic, produce_ledgers
from offloader.bulk.params import ExportParams
from offloader.bulk.plan import plan_export
from offloader.exceptions import TopicDeletedError
from offloader.metadata import schema
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.retention.trim import delete_topic
from offloader.runtime import Runtime

pytestmark = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)


def offloaded(rt: Runtime, topic: str, shapes: list[tuple[int, int]], hot: int = 0) -> list[int]:
    """A topic of fixed-size ledgers (entry count, entry size), all offloaded but the last
    ``hot``; their ids."""
    make_topic(rt, topic)
    ids = produce_ledgers(rt, topic, shapes, fixed=True)
    LedgerOffloader(rt).offload_topic(topic, up_to=ids[len(ids) - hot - 1])
    return ids


def at_ms(ms: int) -> datetime:
    """The instant ``ms`` epoch milliseconds, exactly (no float rounding)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def edit_ledger(rt: Runtime, topic: str, ledger_id: int, **values: object) -> None:
    """Change a ledger's row behind the library's back (damage, or an old revision)."""
    with rt.metadata.transaction() as conn:
        conn.execute(
            sa.update(schema.ledgers)
            .where(schema.ledgers.c.topic == topic, schema.ledgers.c.ledger_id == ledger_id)
            .values(**values)
        )


def test_the_summary_counts_what_the_plan_exports(runtime: Runtime) -> None:
    """The summary (logged by the driver) counts the offloaded ledgers, their entries and
    bytes, and lists every selected ledger that is only in the hot tier."""
    ids = offloaded(runtime, "a", [(10, 100), (20, 50), (5, 10), (5, 10)], hot=2)
    plan = plan_export(runtime.metadata, ExportParams(slice_bytes=300))
    ledgers = [runtime.metadata.get_ledger("a", i) for i in ids[:2]]
    assert plan.to_json() == {
        "ledgers": 2,
        "slices": len(plan.slices),
        "entries": sum(x.entry_count for x in ledgers),
        "bytes": sum(x.size_bytes for x in ledgers),
        "not_offloaded": [f"a/{ids[2]}", f"a/{ids[3]}"],
        "streamed": 0,
    }
    assert plan.bytes == 10 * 100 + 20 * 50 and len(plan.slices) > 2


def test_slices_are_about_slice_bytes_and_carry_their_ledger(runtime: Runtime) -> None:
    """A slice holds as many entries as fit in ``slice_bytes`` at the ledger's mean entry
    size (at least one: a larger entry is a slice of its own), and names its ledger's
    objects, store, last entry and creation time."""
    slice_bytes = 5
    ids = offloaded(runtime, "a", [(12, 1), (4, 100), (9, 2)])
    plan = plan_export(runtime.metadata, ExportParams(slice_bytes=slice_bytes))
    for ledger_id in ids:
        ledger = runtime.metadata.get_ledger("a", ledger_id)
        assert ledger.store_id is not None
        mean = ledger.size_bytes / ledger.entry_count
        slices = [s for s in plan.slices if s.ledger_id == ledger_id]
        ranges = [(s.first_entry_id, s.last_entry_id) for s in slices]
        assert [e for a, b in ranges for e in range(a, b + 1)] == list(range(ledger.entry_count))
        for s in slices:
            assert s.entries == 1 or s.entries * mean <= slice_bytes
        for s in slices[:-1]:  # one more entry would not fit
            assert (s.entries + 1) * mean > slice_bytes
        for s in slices:
            assert (s.data_key, s.index_key) == (ledger.data_key, ledger.index_key)
            assert s.store == runtime.metadata.get_location(ledger.store_id)
            assert s.ledger_last_entry_id == ledger.entry_count - 1
            assert s.created_ms == ledger.created_ms
            assert not s.in_segment


def test_created_before_alone_bounds_the_plan_from_above(runtime: Runtime) -> None:
    ids = offloaded(runtime, "a", [(3, 10)] * 3)
    created = [runtime.metadata.get_ledger("a", i).created_ms for i in ids]
    assert created == sorted(set(created))  # three distinct instants

    def chosen(**window: datetime) -> set[int]:
        plan = plan_export(runtime.metadata, ExportParams(**window))
        return {s.ledger_id for s in plan.slices}

    assert chosen(created_to=at_ms(created[1])) == {ids[0]}  # before: exclusive
    assert chosen(created_to=at_ms(created[1] + 1)) == {ids[0], ids[1]}
    assert chosen(created_from=at_ms(created[1]), created_to=at_ms(created[2])) == {ids[1]}
    assert chosen(created_from=at_ms(created[1])) == {ids[1], ids[2]}


def test_a_deleted_topic_is_skipped_unless_named(runtime: Runtime) -> None:
    offloaded(runtime, "a", [(3, 10)])
    delete_topic(runtime, "a")
    kept = offloaded(runtime, "b", [(3, 10), (4, 10)])  # after "a" in the topic order
    plan = plan_export(runtime.metadata, ExportParams())
    assert {(s.topic, s.ledger_id) for s in plan.slices} == {("b", i) for i in kept}
    assert plan.ledgers == 2
    with pytest.raises(TopicDeletedError, match="topic 'a' was deleted"):
        plan_export(runtime.metadata, ExportParams(topics=["a", "b"]))


def test_a_ledger_without_a_recorded_store_fails_the_plan(runtime: Runtime) -> None:
    """A ledger offloaded before the metadata recorded stores (revision 0002) cannot be
    located: the plan names it and the command that records its store."""
    ids = offloaded(runtime, "orders", [(3, 10), (3, 10)])
    edit_ledger(runtime, "orders", ids[1], store_id=None)
    message = (
        rf"ledger orders/{ids[1]} names no object store \(written before revision 0002\): "
        r"run `offloader db upgrade`"
    )
    with pytest.raises(ValueError, match=message):
        plan_export(runtime.metadata, ExportParams())


def test_an_offloaded_ledger_without_its_index_key_fails_the_plan(runtime: Runtime) -> None:
    """Damaged metadata (an offloaded ledger that lost one of its keys) stops the plan
    before any executor is handed a slice it cannot read."""
    (ledger_id,) = offloaded(runtime, "orders", [(3, 10)])
    edit_ledger(runtime, "orders", ledger_id, index_key=None)
    with pytest.raises(AssertionError):
        plan_export(runtime.metadata, ExportParams())

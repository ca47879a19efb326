"""The observations: every figure of every topic equals what the records say one by one,
and what ``offloader status`` shows; read in a fixed number of statements and without a
single object-store request. On both pairings (files + SQLite, SeaweedFS + PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

from fixtures import tier_scenario
from fixtures.backends import BACKENDS, make_topic, produce_ledgers
from fixtures.counting import REQUESTS, counting_statements
from offloader.metadata import schema
from offloader.metrics.observe import AGES, TierFigures, observe, totals
from offloader.objectstore import ObjectStore
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.runtime import Runtime
from offloader.status import status_report

BOTH = pytest.mark.parametrize("backend_settings", BACKENDS, indirect=True)


@BOTH
def test_every_figure_equals_the_records_and_the_status(runtime: Runtime) -> None:
    rt = runtime
    tier_scenario.build(rt)
    settings = rt.settings.model_copy(update={"gc_failing_tries": tier_scenario.FAILING_TRIES})
    obs = observe(rt.metadata, settings)
    by_name = {t.topic: t for t in obs.topics}
    assert sorted(by_name) == ["events", "kept", "orders"]
    for name, got in by_name.items():
        assert got == tier_scenario.expected(rt, name, obs.now_ms, settings.gc_failing_tries)

    # what the scenario was built to hold, so the comparison above is not of zeros
    orders, kept, events = by_name["orders"], by_name["kept"], by_name["events"]
    assert (orders.offload_lag_ledgers, orders.hot_deletion_lag_ledgers) == (2, 1)
    assert orders.offload_lag_bytes > 0 and orders.hot_deletion_lag_bytes > 0
    assert orders.offload_lag_seconds is not None and orders.hot_deletion_lag_seconds is not None
    assert (orders.stream_lag_bytes, orders.stream_lag_seconds) == (0, None)
    # the trimmed ledger's two objects and the attempt's two leftovers; one of them failing
    assert (orders.deletion_backlog_keys, orders.deletion_failing_keys) == (4, 1)
    assert orders.tiered_ledgers == 2 and orders.tiered_objects == 4
    assert (kept.hot_deletion_lag_ledgers, kept.hot_deletion_lag_seconds) == (0, None)
    assert (kept.offload_lag_ledgers, kept.offload_lag_seconds) == (0, None)
    assert events.streaming and events.tiered_segments >= 1
    assert events.tiered_objects == 2 * events.tiered_segments
    assert events.stream_lag_seconds is not None and events.stream_lag_bytes > 0
    assert events.stream_lag_bytes == events.offload_lag_bytes

    status = status_report(rt)
    for tiers in status.tiers:
        got = by_name[tiers.topic]
        assert (got.hot_bytes, got.hot_ledgers) == (tiers.hot_bytes, tiers.hot_ledgers)
        assert (got.tiered_bytes, got.tiered_ledgers) == (
            tiers.offloaded_bytes,
            tiers.offloaded_ledgers,
        )
        assert got.deletion_backlog_keys == tiers.pending_deletions
    counts: dict[str, Any] = status.counts
    assert obs.metadata_rows["topics"] == counts["topics"] == 3
    assert obs.metadata_rows["ledgers"] == sum(counts["ledgers_by_state"].values())
    assert obs.metadata_rows["offload_attempts"] == sum(counts["attempts_by_state"].values())
    assert obs.metadata_rows["deletion_queue"] == sum(counts["deletions_by_state"].values())
    assert obs.metadata_rows["segments"] == sum(counts["segments_by_state"].values())
    assert set(obs.metadata_rows) == {t.name for t in schema.metadata.sorted_tables}
    assert obs.metadata_rows["segment_ledgers"] > 0 and obs.metadata_rows["segment_parts"] > 0

    backlog = obs.deletion_backlog
    assert (backlog.pending, backlog.failing_count) == (status.deletion_backlog.pending, 2)
    assert backlog.pending == orders.deletion_backlog_keys + 1  # the orphan no topic owns


@BOTH
def test_totals_sum_the_topics_and_take_the_oldest_age(runtime: Runtime) -> None:
    tier_scenario.build(runtime)
    obs = observe(runtime.metadata, runtime.settings)
    assert obs.totals == totals(obs.topics)
    assert obs.totals.topics == 3
    for name in TierFigures.model_fields:
        values = [getattr(t, name) for t in obs.topics]
        if name in AGES:
            assert getattr(obs.totals, name) == max(v for v in values if v is not None)
        else:
            assert getattr(obs.totals, name) == sum(values)


def test_an_empty_metadata_observes_nothing(runtime: Runtime) -> None:
    obs = observe(runtime.metadata, runtime.settings)
    assert obs.topics == [] and obs.totals.topics == 0
    assert obs.totals.offload_lag_seconds is None and obs.totals.offload_lag_bytes == 0
    assert obs.deletion_backlog.pending == 0
    # the configured store may be recorded as the runtime opens; nothing else is there
    assert {table: n for table, n in obs.metadata_rows.items() if table != "object_stores"} == {
        t.name: 0 for t in schema.metadata.sorted_tables if t.name != "object_stores"
    }


def count_store_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every request any object store binding is asked for from now on, whoever opened
    the store (the verbs of fixtures.counting, on the classes themselves)."""
    from offloader.objectstore.filesystem import FilesystemObjectStore
    from offloader.objectstore.s3 import S3ObjectStore

    made: list[str] = []
    for binding in (FilesystemObjectStore, S3ObjectStore, ObjectStore):
        for verb in REQUESTS:
            original = binding.__dict__.get(verb)
            if original is None:
                continue

            def counted(*args: Any, _verb: str = verb, _f: Any = original, **kw: Any) -> Any:
                made.append(_verb)
                return _f(*args, **kw)

            monkeypatch.setattr(binding, verb, counted)
    return made


def test_statements_do_not_grow_with_the_ledgers_and_no_store_request(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    requests = count_store_requests(monkeypatch)
    make_topic(rt, "orders")
    make_topic(rt, "other", deletion_lag_seconds=60)
    produce_ledgers(rt, "orders", [(2, 100)] * 3)
    LedgerOffloader(rt).offload_topic("orders", up_to=1)
    assert "put" in requests or "complete_multipart" in requests  # the counting counts
    requests.clear()
    with counting_statements(rt.metadata.engine) as few:
        first = observe(rt.metadata, rt.settings)
    assert requests == []
    assert first.totals.hot_ledgers == 3 and first.totals.tiered_ledgers == 1

    produce_ledgers(rt, "orders", [(2, 100)] * 27)
    produce_ledgers(rt, "other", [(2, 100)] * 10)
    LedgerOffloader(rt).offload_topic("orders", up_to=20)
    requests.clear()
    with counting_statements(rt.metadata.engine) as many:
        second = observe(rt.metadata, rt.settings)
    assert requests == []
    assert second.totals.hot_ledgers == 40 and second.totals.tiered_ledgers == 20
    assert len(many) == len(few) <= 16, many  # 2 BEGINs (SQLite), 13 SELECTs

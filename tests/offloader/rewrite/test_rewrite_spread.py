"""A rewrite whose parts are written elsewhere (the Spark driver's path, without Spark): the
work orders cross a pickle boundary to :func:`write_partition` with only the object-store
settings, as they reach executors. The result equals a run here; a group that fails where
it was sent, or a wave whose writing fails as a whole, is failed and cleaned up; the
orders carry no secret and no database URL."""

from __future__ import annotations

import logging
import pickle

import pytest

from fixtures.inspect import checksum, stored_keys
from fixtures.rewrites import (
    T,
    check_clean_store,
    check_one_copy,
    entry_digests,
    gc,
    rewrite,
    shape,
    sweep_now,
    v1_topic,
)
from offloader.metadata import SegmentOrigin, SegmentState
from offloader.rewrite.params import TO_V2, RewriteParams
from offloader.rewrite.plan import LEDGER, SEGMENT
from offloader.rewrite.report import FAILED, REWRITTEN
from offloader.rewrite.run import Spread, run_rewrite
from offloader.rewrite.work import WorkOrder, WorkResult, write_partition
from offloader.runtime import Runtime


def elsewhere(rt: Runtime, sent: list[WorkOrder] | None = None) -> Spread:
    """Orders pickled and written with the executors' settings, one "task" per order."""
    closure = rt.settings.for_object_stores()

    def spread(orders: list[WorkOrder]) -> list[WorkResult]:
        if sent is not None:
            sent.extend(orders)
        shipped = pickle.loads(pickle.dumps((orders, closure)))
        return [r for order in shipped[0] for r in write_partition([order], shipped[1])]

    return spread


def test_spread_compaction_and_migration_equal_the_source_and_leave_no_orphan(
    runtime: Runtime,
) -> None:
    rt = runtime
    v1_topic(rt, 7)
    before, digests = checksum(rt, T), entry_digests(rt)
    sent: list[WorkOrder] = []

    # v1 objects -> small v2 segments (re-encoded where the orders went), in waves of two
    migrated = rewrite(
        rt, spread=elsewhere(rt, sent), wave=2, mode=TO_V2, target_bytes=shape(rt).target // 3
    )
    assert {g.outcome for g in migrated.groups} == {REWRITTEN} and len(migrated.groups) >= 4
    assert {g.kind for g in migrated.groups} == {LEDGER}
    assert len(sent) == len(migrated.groups) and all(o.ledgers for o in sent)
    # ... then the small segments merged into fewer (copied or downloaded where they went)
    sent.clear()
    compacted = rewrite(rt, spread=elsewhere(rt, sent), wave=2)
    assert {g.outcome for g in compacted.groups} == {REWRITTEN}
    assert {g.kind for g in compacted.groups} == {SEGMENT}
    assert all(o.segments and not o.ledgers for o in sent)
    assert len(compacted.groups) < len(migrated.groups)

    assert checksum(rt, T) == before and entry_digests(rt) == digests
    check_one_copy(rt)
    live = rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED])
    assert {s.origin for s in live} == {SegmentOrigin.REWRITE}
    gc(rt)
    check_clean_store(rt)
    assert len(stored_keys(rt.objects)) == 2 * len(live) < 14
    again = rewrite(rt, spread=elsewhere(rt), wave=2)
    assert again.groups == [] and checksum(rt, T) == before


def test_a_group_failed_where_it_was_sent_is_given_up_and_the_others_swap(
    runtime: Runtime,
) -> None:
    rt = runtime
    v1_topic(rt, 7)
    before = checksum(rt, T)
    write = elsewhere(rt)

    def first_fails(orders: list[WorkOrder]) -> list[WorkResult]:
        results = write(orders)
        results[0] = WorkResult(orders[0].segment_id, error="OSError: executor disk full")
        return results

    report = rewrite(rt, spread=first_fails, mode=TO_V2, wave=10)
    outcomes = [g.outcome for g in report.groups]
    assert outcomes[0] == FAILED and set(outcomes[1:]) == {REWRITTEN} and len(outcomes) >= 2
    assert "executor disk full" in (report.groups[0].detail or "")
    failed = rt.metadata.segments.of_topic(T, [SegmentState.FAILED])
    assert [s.segment_id for s in failed] == [report.groups[0].segment_id]
    assert checksum(rt, T) == before
    check_one_copy(rt)
    sweep_now(rt)  # the failed group's keys were queued, its upload aborted
    check_clean_store(rt)


def test_a_wave_whose_writing_fails_swaps_nothing_and_leaves_nothing(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    v1_topic(rt, 7)
    before, stored = checksum(rt, T), stored_keys(rt.objects)

    def lost(orders: list[WorkOrder]) -> list[WorkResult]:
        elsewhere(rt)(orders[:1])  # a part or two written, then the job is lost
        raise RuntimeError("Job aborted due to stage failure: executor lost")

    with caplog.at_level(logging.WARNING, logger="offloader.rewrite.run"):
        report = rewrite(rt, spread=lost, mode=TO_V2, wave=10)
    assert {g.outcome for g in report.groups} == {FAILED}
    assert all("executor lost" in (g.detail or "") for g in report.groups)
    (lost_job,) = [r for r in caplog.records if "parts" in r.getMessage()]
    assert lost_job.getMessage() == "the rewrite's parts could not be written"
    assert lost_job.exc_info is not None and lost_job.exc_info[0] is RuntimeError
    assert rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED]) == []
    assert checksum(rt, T) == before
    sweep_now(rt)
    assert stored_keys(rt.objects) == stored and list(rt.objects.list_multipart_uploads()) == []
    check_clean_store(rt)


@pytest.mark.parametrize("backend_settings", ["s3-sqlite"], indirect=True)
def test_work_orders_carry_no_secret_and_no_database(runtime: Runtime) -> None:
    rt = runtime
    v1_topic(rt, 3)
    sent: list[WorkOrder] = []
    rewrite(rt, spread=elsewhere(rt, sent), wave=2, mode=TO_V2)
    assert sent
    shipped = pickle.dumps(sent)
    secret = rt.settings.s3_secret_access_key
    assert secret is not None and secret.get_secret_value().encode() not in shipped
    assert rt.settings.resolved_metadata_url.encode() not in shipped


def test_a_rewrite_recovered_before_its_upload_was_recorded_is_changed(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver froze between creating the upload and recording it, long enough for the
    GC to recover the rewrite: recording fails the CAS, the group is ``changed``, its
    upload aborted, nothing swapped (the freeze is the one thing a test has to stage)."""
    import time

    from offloader.gc.run import recover_stale_rewrites
    from offloader.rewrite.report import CHANGED

    rt = runtime
    v1_topic(rt, 3)
    before = checksum(rt, T)
    create = rt.objects.create_multipart

    def frozen(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        upload = create(*args, **kwargs)  # type: ignore[arg-type]
        time.sleep(1.2)
        assert len(recover_stale_rewrites(rt)) == 1
        return upload

    monkeypatch.setattr(rt.objects, "create_multipart", frozen)
    params = RewriteParams(mode=TO_V2, target_bytes=shape(rt).target, max_groups=1)
    report = run_rewrite(rt, params, owner="driver", lease_seconds=1, spread=elsewhere(rt))
    assert [g.outcome for g in report.groups] == [CHANGED]
    assert rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED]) == []
    assert list(rt.objects.list_multipart_uploads()) == []
    assert checksum(rt, T) == before
    check_clean_store(rt)


def test_an_order_failing_on_its_executor_comes_back_as_its_error(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The executor's function turns an order's exception into that order's result (its
    segment id, ``Type: message``), so the other orders of the same Spark task still swap;
    the driver's warning describes the group by its sources, first and last ledger."""
    from offloader.rewrite import work

    rt = runtime
    v1_topic(rt, 7)
    before = checksum(rt, T)
    real, failing = work.write_order, []

    def write_order(order: WorkOrder, *args: object) -> object:
        if not failing:
            failing.append(order.segment_id)
            raise OSError("executor disk full")
        return real(order, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(work, "write_order", write_order)
    with caplog.at_level(logging.WARNING, logger="offloader.rewrite.run"):
        report = rewrite(rt, spread=elsewhere(rt), mode=TO_V2, wave=10)
    (failed,) = [g for g in report.groups if g.outcome == FAILED]
    assert failed.segment_id == failing[0]
    assert failed.detail == "RewriteWorkError: OSError: executor disk full"
    assert len(failed.ledgers) >= 3  # first, second and last differ
    (warning,) = [r for r in caplog.records if r.msg == "rewrite of %s failed"]
    assert warning.args == (
        f"{T}: {failed.sources} {failed.kind} object(s) of ledgers "
        f"{failed.ledgers[0]}..{failed.ledgers[-1]} ({failed.bytes_before} bytes)",
    )
    assert {g.outcome for g in report.groups if g is not failed} == {REWRITTEN}
    assert checksum(rt, T) == before
    check_one_copy(rt)
    sweep_now(rt)
    check_clean_store(rt)

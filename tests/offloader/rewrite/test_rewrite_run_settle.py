"""What the driver does with what comes back from the executors (``Rewriter._settle``): a
group whose result never came back or came back without data is failed with a text saying
so, a source that moved before the swap is ``changed`` with the swap's refusal as text, and
either way the rewrite segment is failed with that text, its keys queued and its multipart
upload aborted. When failing or aborting itself fails, the original outcome stands and the
failure is only logged with its traceback (the lease runs out, the GC recovers)."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable

import pytest

from fixtures.inspect import uploads
from fixtures.metadata import pending_deletions
from fixtures.rewrites import T, shape, v1_topic
from offloader.metadata import Position, Segment, SegmentState
from offloader.objectstore import MultipartUpload
from offloader.rewrite.params import RewriteParams
from offloader.rewrite.plan import RewriteGroup, plan_rewrite
from offloader.rewrite.report import CHANGED, FAILED, GroupResult
from offloader.rewrite.run import Rewriter, RewriteWorkError, Spread
from offloader.rewrite.work import WorkOrder, WorkResult, write_partition
from offloader.runtime import Runtime

LOGGER = "offloader.rewrite.run"


def one_group(rt: Runtime) -> tuple[RewriteGroup, list[int]]:
    """Three small v1 ledgers planned as one compaction group (and their ids)."""
    ids = v1_topic(rt, 3, hot=True)
    params = RewriteParams(target_bytes=10 * shape(rt).target, small_bytes=shape(rt).target)
    (group,) = plan_rewrite(rt.metadata, params)
    return group, ids


def written(rt: Runtime, orders: list[WorkOrder]) -> list[WorkResult]:
    """The orders written as an executor writes them (pickled, store settings only), so
    the upload holds parts by the time the driver settles."""
    shipped, settings = pickle.loads(pickle.dumps((orders, rt.settings.for_object_stores())))
    return write_partition(shipped, settings)


def settle(rt: Runtime, group: RewriteGroup, spread: Spread) -> tuple[GroupResult, Segment]:
    """``group`` through the spread path; its result and its (only) rewrite segment."""
    (result,) = Rewriter(rt, owner="test", lease_seconds=30).rewrite_spread([group], spread)
    (segment,) = rt.metadata.segments.of_topic(T)
    return result, segment


def given_up(rt: Runtime, segment: Segment, detail: str) -> None:
    """The rewrite segment failed with ``detail``, its keys queued, its upload aborted."""
    assert (segment.state, segment.detail) == (SegmentState.FAILED, detail)
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    assert {segment.data_key, segment.index_key} <= queued
    assert uploads(rt.objects) == set()


def warnings(caplog: pytest.LogCaptureFixture, msg: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.msg == msg]


def check_failed_warning(
    caplog: pytest.LogCaptureFixture, group: RewriteGroup, error: type[BaseException]
) -> None:
    """One "rewrite of %s failed" warning naming the group, with the error's traceback."""
    (record,) = warnings(caplog, "rewrite of %s failed")
    assert record.levelno == logging.WARNING
    assert record.args == (group.describe(),)
    assert record.getMessage() == f"rewrite of {group.describe()} failed"
    assert record.exc_info is not None and isinstance(record.exc_info[1], error)


def _lost_result(rt: Runtime, orders: list[WorkOrder]) -> list[WorkResult]:
    """The executors wrote the parts but returned no result for the order."""
    written(rt, orders)
    return []


def _empty_result(rt: Runtime, orders: list[WorkOrder]) -> list[WorkResult]:
    """A result for the order carrying neither data nor an error."""
    return [WorkResult(r.segment_id) for r in written(rt, orders)]


@pytest.mark.parametrize(
    ("spread", "detail"),
    [
        (_lost_result, "RewriteWorkError: no result came back"),
        (_empty_result, "RewriteWorkError: no data came back"),
    ],
    ids=["no-result", "no-data"],
)
def test_a_group_without_its_data_is_failed_and_its_upload_aborted(
    runtime: Runtime,
    caplog: pytest.LogCaptureFixture,
    spread: Callable[[Runtime, list[WorkOrder]], list[WorkResult]],
    detail: str,
) -> None:
    """The driver cannot complete what it was not sent: it gives the group up, with a
    text that says what was missing."""
    rt = runtime
    group, _ = one_group(rt)
    caplog.set_level(logging.WARNING, LOGGER)
    result, segment = settle(rt, group, lambda orders: spread(rt, orders))
    assert (result.outcome, result.segment_id, result.detail) == (
        FAILED,
        segment.segment_id,
        detail,
    )
    given_up(rt, segment, detail)
    check_failed_warning(caplog, group, RewriteWorkError)


def test_a_source_trimmed_before_the_swap_is_changed_and_the_rewrite_given_up(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger trimmed while the executors wrote: the swap refuses, the group is
    ``changed`` (the next run re-plans) with the refusal as text, the rewrite failed with
    the same text, and nothing is logged as a failure."""
    rt = runtime
    group, ids = one_group(rt)

    def trimmed_meanwhile(orders: list[WorkOrder]) -> list[WorkResult]:
        results = written(rt, orders)
        rt.metadata.retention.move_start(
            rt.metadata.get_topic(T), Position(ledger_id=ids[1], entry_id=0)
        )
        rt.metadata.retention.mark_ledgers_deleting(T, ids[1], 100)
        return results

    caplog.set_level(logging.WARNING, LOGGER)
    result, segment = settle(rt, group, trimmed_meanwhile)
    state = rt.metadata.get_ledger(T, ids[0]).deletion_state
    detail = f"ledger {T}/{ids[0]} was trimmed ({state}): the rewrite of it is called off"
    assert (result.outcome, result.segment_id, result.detail) == (
        CHANGED,
        segment.segment_id,
        detail,
    )
    assert (result.topic, result.ledgers) == (group.topic, group.ledger_ids)
    given_up(rt, segment, detail)
    assert warnings(caplog, "rewrite of %s failed") == []


def test_a_rewrite_that_cannot_be_failed_is_logged_and_its_upload_still_aborted(
    runtime: Runtime, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database refuses to record the failure (the one fault staged): the group is
    still reported failed, the upload still aborted, and the refusal logged with its
    traceback; the segment stays assigned for the GC to recover once its lease runs out."""
    rt = runtime
    group, _ = one_group(rt)

    def refused(segment: Segment, detail: str) -> Segment:
        raise RuntimeError("database is locked")

    monkeypatch.setattr(rt.metadata.rewrites, "fail", refused)
    caplog.set_level(logging.WARNING, LOGGER)
    result, segment = settle(rt, group, lambda orders: [])
    assert (result.outcome, result.detail) == (FAILED, "RewriteWorkError: no result came back")
    assert segment.state is SegmentState.ASSIGNED
    assert uploads(rt.objects) == set()
    (record,) = warnings(caplog, "could not fail rewrite %s")
    assert record.args == (segment.segment_id,)
    assert record.getMessage() == f"could not fail rewrite {segment.segment_id}"
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)
    assert warnings(caplog, "could not abort the upload of %s") == []


def test_an_upload_that_cannot_be_aborted_is_logged_and_the_rewrite_still_failed(
    runtime: Runtime, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the abort (staged): the rewrite is failed anyway and the refusal
    logged with its traceback; the orphan sweep aborts the upload later."""
    rt = runtime
    group, _ = one_group(rt)

    def refused(upload: MultipartUpload) -> None:
        raise OSError("store unavailable")

    monkeypatch.setattr(rt.objects, "abort_multipart", refused)
    caplog.set_level(logging.WARNING, LOGGER)
    result, segment = settle(rt, group, lambda orders: [])
    detail = "RewriteWorkError: no result came back"
    assert (result.outcome, result.detail) == (FAILED, detail)
    assert (segment.state, segment.detail) == (SegmentState.FAILED, detail)
    assert len(uploads(rt.objects)) == 1
    (record,) = warnings(caplog, "could not abort the upload of %s")
    assert record.args == (segment.segment_id,)
    assert record.getMessage() == f"could not abort the upload of {segment.segment_id}"
    assert record.exc_info is not None and isinstance(record.exc_info[1], OSError)
    assert warnings(caplog, "could not fail rewrite %s") == []

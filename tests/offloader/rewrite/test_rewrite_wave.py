"""One wave of a spread rewrite (``Rewriter.rewrite_spread``, the Spark driver's loop)
without Spark: a group whose start fails is reported failed with its error while the
others of the wave swap, and every started group's lease is renewed from the driver while
the executors write, however long they take."""

from __future__ import annotations

import logging
import time

import pytest

from fixtures.inspect import checksum
from fixtures.rewrites import T, check_one_copy, rewrite, sweep_now, v1_topic
from offloader.metadata import SegmentState
from offloader.objectstore import ObjectStore
from offloader.rewrite.params import TO_V2
from offloader.rewrite.report import FAILED, REWRITTEN
from offloader.rewrite.work import WorkOrder, WorkResult, write_partition
from offloader.runtime import Runtime

pytestmark = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)


def here(rt: Runtime, pause: float = 0.0):  # type: ignore[no-untyped-def]
    """Orders written in this process after ``pause`` seconds (a slow Spark job)."""

    def spread(orders: list[WorkOrder]) -> list[WorkResult]:
        time.sleep(pause)
        return write_partition(orders, rt.settings.for_object_stores())

    return spread


def test_a_group_whose_start_fails_is_reported_and_the_others_swap(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    v1_topic(rt, 7)
    before = checksum(rt, T)
    store = type(rt.objects)
    real, refused = store.create_multipart, []

    def create_multipart(self: ObjectStore, key: str, **kwargs: object):  # type: ignore[no-untyped-def]
        if not refused:
            refused.append(key)
            raise OSError("store refused the upload")
        return real(self, key, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "create_multipart", create_multipart)
    with caplog.at_level(logging.WARNING, logger="offloader.rewrite.run"):
        report = rewrite(rt, spread=here(rt), mode=TO_V2, wave=10)
    first, *others = report.groups
    assert first.outcome == FAILED and first.detail == "OSError: store refused the upload"
    assert first.topic == T and len(first.ledgers) >= 3 and first.sources == len(first.ledgers)
    assert others and {g.outcome for g in others} == {REWRITTEN}
    (warning,) = [r for r in caplog.records if r.msg == "rewrite of %s failed"]
    assert warning.args == (
        f"{T}: {first.sources} {first.kind} object(s) of ledgers "
        f"{first.ledgers[0]}..{first.ledgers[-1]} ({first.bytes_before} bytes)",
    )
    assert warning.exc_info is not None and warning.exc_info[0] is OSError
    (failed,) = rt.metadata.segments.of_topic(T, [SegmentState.FAILED])
    assert failed.data_key == refused[0]  # its intent was recorded, then failed
    assert checksum(rt, T) == before
    check_one_copy(rt)
    sweep_now(rt)


def test_leases_are_renewed_while_the_executors_write(runtime: Runtime) -> None:
    """The executors take two and a half lease periods: without the driver's renewals every
    rewrite would lose its segment and commit nothing."""
    rt = runtime
    v1_topic(rt, 5)
    before = checksum(rt, T)
    report = rewrite(rt, spread=here(rt, pause=2.5), mode=TO_V2, wave=10, lease_seconds=1.0)
    assert report.groups and {g.outcome for g in report.groups} == {REWRITTEN}, str(report)
    assert checksum(rt, T) == before
    check_one_copy(rt)

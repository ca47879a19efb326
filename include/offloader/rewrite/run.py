"""A rewrite run: groups planned from the metadata, each rewritten into one v2 segment.

One group, by the invariants:
1. ``recover_stale`` first: rewrites whose lease ran out are failed, their uploads aborted
   (once before the plan, so a run with nothing to plan still recovers them, and again
   before each group);
2. intent (``begin``): the segment's keys, store, owner and lease recorded; sources
   checked (one that moved since the plan: outcome ``changed``, nothing written);
3. the multipart upload created, then its id recorded;
4. parts uploaded while a keeper thread renews the lease: v1 sources re-encoded client
   side (rewrite/encode.py), segments merged server side where the store allows it
   (rewrite/merge.py);
5. the upload completed (If-None-Match), the index written (If-None-Match);
6. the swap committed by compare-and-set (metadata/rewrites.py).

On any error the rewrite is failed (its keys queued at once) and its upload aborted; a
source that moved before the swap is outcome ``changed`` (the next run re-plans), any other
error outcome ``failed`` for the run's report. A run killed anywhere leaves an assigned
rewrite segment whose lease runs out: the next run or ``offloader gc`` recovers it
(:func:`offloader.gc.run.recover_stale_rewrites`), and the orphan sweep aborts an upload
created but never recorded. Failpoints: ``rewrite-after-begin``, ``rewrite-after-create-upload``,
``rewrite-after-first-part``, ``rewrite-after-complete``, ``rewrite-after-index``,
``mid-rewrite-commit`` (inside the swap) and ``rewrite-after-commit``.

Mode ``to-v1`` is the other direction, ledger by ledger through the replacement of an
offloaded ledger (rewrite/to_v1.py); its results come back in the same report.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from offloader import failpoints
from offloader.exceptions import CommitFailedError
from offloader.format.object_metadata import segment_user_metadata
from offloader.gc.run import recover_stale_rewrites
from offloader.keys import segment_object_keys
from offloader.metadata import Segment
from offloader.objectstore import MultipartUpload, ObjectStore, PartInfo
from offloader.rewrite.encode import RewrittenData
from offloader.rewrite.lease import RewriteLease
from offloader.rewrite.params import TO_V1, RewriteParams
from offloader.rewrite.plan import SEGMENT, RewriteGroup, plan_rewrite
from offloader.rewrite.report import (
    CHANGED,
    FAILED,
    PLANNED,
    REWRITTEN,
    GroupResult,
    RewriteReport,
)
from offloader.rewrite.to_v1 import ToV1Outcome, ToV1Result, migrate_to_v1, plan_to_v1
from offloader.rewrite.work import StoreRef, WorkOrder, WorkResult, order_for, write_order
from offloader.runtime import Runtime

log = logging.getLogger(__name__)

#: writes a wave's work orders somewhere (Spark executors) and gives one result per order
Spread = Callable[[list[WorkOrder]], list[WorkResult]]

# a ledger migrated back to v1 is reported like a rewritten group
_TO_V1 = {
    ToV1Outcome.MIGRATED: REWRITTEN,
    ToV1Outcome.CHANGED: CHANGED,
    ToV1Outcome.IN_PROGRESS: CHANGED,  # another replacement holds it: the next run goes on
    ToV1Outcome.FAILED: FAILED,
    ToV1Outcome.PLANNED: PLANNED,
}


def run_rewrite(
    runtime: Runtime,
    params: RewriteParams,
    *,
    owner: str,
    lease_seconds: float | None = None,
    spread: Spread | None = None,
    wave: int = 8,
) -> RewriteReport:
    """Plan ``params``' groups and rewrite up to ``max_groups`` of them as ``owner`` (dry:
    only plan), each under a lease of ``lease_seconds`` (default: the settings'
    ``attempt_lease_seconds``). A group that fails is reported and the others still run;
    the caller decides what a failure means (:meth:`RewriteReport.raise_for_failure`).

    Without ``spread`` each group is written here, one after the other. With it (a Spark
    job's driver) groups go ``wave`` at a time: their intents and uploads recorded here,
    their parts written wherever ``spread`` sends the work orders, then completed and
    swapped here, one by one, while this process keeps every lease of the wave."""
    # dead rewrites first, whatever the plan holds: a run with nothing to plan recovers
    # them as `offloader gc` does (and their sources are planned again at once)
    recovered = [] if params.dry_run else [s.segment_id for s in recover_stale_rewrites(runtime)]
    if params.mode == TO_V1:
        report = _to_v1(runtime, params)
        report.recovered[:0] = recovered
        return report
    groups = plan_rewrite(runtime.metadata, params)
    chosen = groups[: params.max_groups]
    report = RewriteReport(params.mode, params.dry_run, left=len(groups) - len(chosen))
    report.recovered += recovered
    if params.dry_run:
        report.groups = [GroupResult.of(g, PLANNED) for g in chosen]
        return report
    rewriter = Rewriter(runtime, owner=owner, lease_seconds=lease_seconds)
    if spread is not None:
        for first in range(0, len(chosen), max(1, wave)):
            report.recovered += [s.segment_id for s in recover_stale_rewrites(runtime)]
            report.groups += rewriter.rewrite_spread(chosen[first : first + wave], spread)
    else:
        for group in chosen:
            report.recovered += [s.segment_id for s in recover_stale_rewrites(runtime)]
            try:
                report.groups.append(rewriter.rewrite(group))
            except Exception as err:  # one group's failure does not hold the others back
                log.warning("rewrite of %s failed", group.describe(), exc_info=True)
                report.groups.append(GroupResult.of(group, FAILED, detail=_text(err)))
    # one result per chosen group, in order
    done = [g for g, r in zip(chosen, report.groups, strict=True) if r.outcome == REWRITTEN]
    read = [x.store_id for g in done for x in g.ledgers]
    _record_stores(
        runtime, report, read + [s.store_id for g in done for s in g.segments], bool(done)
    )
    return report


def _record_stores(
    runtime: Runtime, report: RewriteReport, read: Sequence[int | None], wrote: bool
) -> None:
    """The report's stores: those ``read`` (store ids) and, if anything was ``wrote``, the
    default store, where every rewrite writes."""
    locations = runtime.metadata.get_locations(i for i in read if i is not None)
    report.stores_read = [x.store_url for x in locations]
    report.stores_written = [runtime.stores.default_location.store_url] if wrote else []


@dataclass(frozen=True)
class Started:
    """A group whose intent and multipart upload are recorded: what its writer needs."""

    group: RewriteGroup
    segment: Segment
    order: WorkOrder


class Rewriter:
    """Rewrites groups of one runtime as ``owner``: :meth:`rewrite` one here, or
    :meth:`rewrite_spread` several whose parts are written elsewhere."""

    def __init__(self, runtime: Runtime, *, owner: str, lease_seconds: float | None = None) -> None:
        self.runtime = runtime
        self.metadata = runtime.metadata
        self.owner = owner
        self.lease_seconds = lease_seconds or runtime.settings.attempt_lease_seconds
        self.grace_ms = int(runtime.settings.replaced_object_grace_seconds * 1000)

    def rewrite(self, group: RewriteGroup) -> GroupResult:
        """One group through every step; ``changed`` when a source moved (nothing
        swapped). Other errors are raised after the rewrite was failed and its upload
        aborted."""
        started = self.start(group)
        if isinstance(started, GroupResult):
            return started
        try:
            with RewriteLease(self.metadata, started.segment, self.lease_seconds) as lease:
                written = write_order(started.order, self._open, _first_part_hook(lease.check))
                lease.check()
                return self.finish(started, written)
        except CommitFailedError as err:  # a source moved, or the lease was lost
            self.give_up(started, str(err))
            return GroupResult.of(
                group, CHANGED, segment_id=started.segment.segment_id, detail=str(err)
            )
        except Exception as err:
            self.give_up(started, _text(err))
            raise

    def rewrite_spread(self, groups: Sequence[RewriteGroup], spread: Spread) -> list[GroupResult]:
        """``groups`` started here, written by ``spread`` (one result per order, in order),
        finished here; every lease kept from this process until its group is settled. A
        failed ``spread`` (the Spark job lost) fails every group of the wave."""
        results: list[GroupResult | Started] = []
        for group in groups:
            try:
                results.append(self.start(group))
            except Exception as err:
                log.warning("rewrite of %s failed", group.describe(), exc_info=True)
                results.append(GroupResult.of(group, FAILED, detail=_text(err)))
        started = [s for s in results if isinstance(s, Started)]
        with ExitStack() as leases:
            kept = {
                s.segment.segment_id: leases.enter_context(
                    RewriteLease(self.metadata, s.segment, self.lease_seconds)
                )
                for s in started
            }
            try:
                done = {w.segment_id: w for w in spread([s.order for s in started])}
            except Exception as err:
                log.warning("the rewrite's parts could not be written", exc_info=True)
                done = {
                    s.segment.segment_id: WorkResult(s.segment.segment_id, error=_text(err))
                    for s in started
                }
            return [
                r
                if isinstance(r, GroupResult)
                else self._settle(r, done, kept[r.segment.segment_id])
                for r in results
            ]

    def start(self, group: RewriteGroup) -> Started | GroupResult:
        """Record ``group``'s intent, then its multipart upload (invariant 1); ``changed``
        when a source moved since the plan (nothing recorded) or the rewrite was recovered
        before its upload was recorded. Another error after the intent fails the rewrite
        (keys queued) and is raised."""
        segment_id = str(uuid.uuid4())
        data_key, index_key = segment_object_keys(segment_id)
        target = StoreRef(self.runtime.stores.default_id(), self.runtime.stores.default_location)
        try:
            segment = self.metadata.rewrites.begin(
                group.topic,
                segment_id=segment_id,
                data_key=data_key,
                index_key=index_key,
                store_id=target.store_id,
                owner=self.owner,
                lease_ms=int(self.lease_seconds * 1000),
                ledgers=group.ledgers,
                segments=group.segments,
            )
        except CommitFailedError as err:
            return GroupResult.of(group, CHANGED, detail=str(err))
        failpoints.reach("rewrite-after-begin")
        store = self.runtime.objects
        upload: MultipartUpload | None = None
        try:
            upload = store.create_multipart(
                data_key, metadata=segment_user_metadata(group.topic, segment_id, "data")
            )
            failpoints.reach("rewrite-after-create-upload")
            segment = self.metadata.rewrites.record_upload(segment, upload.upload_id)
            order = order_for(
                self.metadata,
                group,
                segment,
                upload,
                target=target,
                read_prefetch=self.runtime.settings.read_prefetch,
                concurrency=self.runtime.settings.upload_concurrency,
            )
        except CommitFailedError as err:  # recovered meanwhile (its lease ran out)
            self._fail(segment, upload, str(err))
            return GroupResult.of(group, CHANGED, segment_id=segment_id, detail=str(err))
        except Exception as err:
            self._fail(segment, upload, _text(err))
            raise
        return Started(group, segment, order)

    def finish(self, started: Started, written: RewrittenData) -> GroupResult:
        """Complete the upload, write the index, swap by compare-and-set (the caller holds
        the lease and gives up on an error)."""
        store = self.runtime.objects
        group, segment = started.group, started.segment
        store.complete_multipart(started.order.upload, written.parts, if_none_match=True)
        failpoints.reach("rewrite-after-complete")
        meta = segment_user_metadata(group.topic, segment.segment_id, "index")
        store.put(segment.index_key, written.index, metadata=meta, if_none_match=True)
        failpoints.reach("rewrite-after-index")
        self.metadata.rewrites.commit(
            segment,
            written.pieces,
            group.ledgers,
            group.segments,
            data_len=written.data_len,
            grace_ms=self.grace_ms,
        )
        failpoints.reach("rewrite-after-commit")
        return GroupResult.of(
            group,
            REWRITTEN,
            segment_id=segment.segment_id,
            objects_after=2,
            bytes_after=written.data_len,
        )

    def give_up(self, started: Started, detail: str) -> None:
        """Fail ``started``'s rewrite (keys queued) and abort its upload."""
        self._fail(started.segment, started.order.upload, detail)

    def _settle(
        self, started: Started, done: Mapping[str, WorkResult], lease: RewriteLease
    ) -> GroupResult:
        """A spread group's result finished and swapped, or given up."""
        segment_id = started.segment.segment_id
        result = done.get(segment_id) or WorkResult(segment_id, error="no result came back")
        try:
            if result.written is None:
                raise RewriteWorkError(result.error or "no data came back")
            lease.check()
            return self.finish(started, result.written)
        except CommitFailedError as err:
            self.give_up(started, str(err))
            return GroupResult.of(started.group, CHANGED, segment_id=segment_id, detail=str(err))
        except Exception as err:
            log.warning("rewrite of %s failed", started.group.describe(), exc_info=True)
            self.give_up(started, _text(err))
            return GroupResult.of(started.group, FAILED, segment_id=segment_id, detail=_text(err))

    def _open(self, ref: StoreRef) -> ObjectStore:
        return self.runtime.stores.get(ref.store_id, f"store {ref.location}")

    def _fail(self, segment: Segment, upload: MultipartUpload | None, detail: str) -> None:
        """Fail the rewrite (keys queued) and abort its upload; the original error is what
        matters, so a failure here is only logged (the lease runs out, the GC recovers)."""
        try:
            self.metadata.rewrites.fail(segment, detail)
        except Exception:
            log.warning("could not fail rewrite %s", segment.segment_id, exc_info=True)
        if upload is not None:
            try:
                self.runtime.objects.abort_multipart(upload)
            except Exception:
                log.warning("could not abort the upload of %s", segment.segment_id, exc_info=True)


class RewriteWorkError(Exception):
    """A group's parts could not be written where they were sent (the text says why)."""


def _first_part_hook(check: Callable[[], None]) -> Callable[[PartInfo], None]:
    """After each part: the failpoint after the first, and the lease check."""
    seen = [0]

    def on_part(_: PartInfo) -> None:
        seen[0] += 1
        if seen[0] == 1:
            failpoints.reach("rewrite-after-first-part")
        check()

    return on_part


def _to_v1(runtime: Runtime, params: RewriteParams) -> RewriteReport:
    """Mode to-v1: up to ``max_groups`` streamed ledgers back to their own v1 objects
    (rewrite/to_v1.py), one replacement each, oldest first; a ledger is one group."""
    planned = plan_to_v1(runtime.metadata, params.topics, params.first_ledger, params.last_ledger)
    chosen = planned[: params.max_groups]
    report = RewriteReport(params.mode, params.dry_run, left=len(planned) - len(chosen))
    read: list[int | None] = []
    migrated = False
    for ledger in chosen:
        if params.dry_run:
            done = [ToV1Result(ledger.topic, ledger.ledger_id, ToV1Outcome.PLANNED)]
        else:
            one = ledger.ledger_id
            # its segments, before the migration releases them
            segments: list[int | None] = [
                p.segment.store_id for p in runtime.metadata.segments.pieces(ledger.topic, one)
            ]
            done = migrate_to_v1(runtime, [ledger.topic], one, one) or [
                ToV1Result(ledger.topic, one, ToV1Outcome.CHANGED, detail="no longer streamed")
            ]
            if any(r.outcome is ToV1Outcome.MIGRATED for r in done):
                read, migrated = read + segments, True
        report.groups += [_v1_group(r, ledger.size_bytes) for r in done]
    _record_stores(runtime, report, read, migrated)
    return report


def _v1_group(result: ToV1Result, size: int) -> GroupResult:
    """A ledger migrated to v1 as a group: before, its entries (``size`` payload bytes) in
    segments it may share with others (no object of its own); after, its two objects."""
    outcome = _TO_V1[result.outcome]
    done = outcome == REWRITTEN
    return GroupResult(
        topic=result.topic,
        kind=SEGMENT,
        ledgers=[result.ledger_id],
        sources=1,
        objects_before=0,
        bytes_before=size,
        outcome=outcome,
        objects_after=2 if done else 0,
        bytes_after=result.bytes if done else 0,
        detail=result.detail or None,
    )


def _text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"

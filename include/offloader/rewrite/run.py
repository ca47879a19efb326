"""A rewrite run: groups planned from the metadata, each rewritten into one v2 segment.

One group, by the invariants:
1. ``recover_stale`` first: rewrites whose lease ran out are failed, their uploads aborted;
2. intent (``begin``): the segment's keys, store, owner and lease recorded; sources
   checked (one that moved since the plan: outcome ``changed``, nothing written);
3. the multipart upload created, then its id recorded;
4. parts uploaded while a keeper thread renews the lease: v1 sources re-encoded client
   side (rewrite/encode.py), segments merged server side where the store allows it
   (``offloader.rewrite.merge``);
5. the upload completed (If-None-Match), the index written (If-None-Match);
6. the swap committed by compare-and-set (metadata/rewrites.py).

On any error the rewrite is failed (its keys queued at once) and its upload aborted; a
source that moved before the swap is outcome ``changed`` (the next run re-plans), any other
error outcome ``failed`` for the run's report. A run killed anywhere leaves an assigned
rewrite segment whose lease runs out: the next run or ``offloader gc`` recovers it
(:func:`recover_stale_rewrites`), and the orphan sweep aborts an upload created but never
recorded. Failpoints: ``rewrite-after-begin``, ``rewrite-after-create-upload``,
``rewrite-after-first-part``, ``rewrite-after-complete``, ``rewrite-after-index``,
``mid-rewrite-commit`` (inside the swap) and ``rewrite-after-commit``.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import uuid
from collections.abc import Callable
from typing import Any

from offloader import failpoints
from offloader.exceptions import CommitFailedError
from offloader.metadata import Segment
from offloader.objectstore import MultipartUpload, ObjectStore, PartInfo
from offloader.read.tiered import INDEX_CACHE
from offloader.rewrite.encode import RewrittenData, encode_ledgers
from offloader.rewrite.lease import RewriteLease
from offloader.rewrite.params import TO_V1, RewriteParams
from offloader.rewrite.plan import SEGMENT, RewriteGroup, plan_rewrite
from offloader.rewrite.report import (
    CHANGED,
    FAILED,
    PLANNED,
    REFUSED,
    REWRITTEN,
    GroupResult,
    RewriteReport,
)
from offloader.runtime import Runtime
from offloader.stream.offloader import segment_object_keys, segment_user_metadata

log = logging.getLogger(__name__)

MERGE_MODULE = "offloader.rewrite.merge"  # server-side merge of v2 segments
TO_V1_MODULE = "offloader.rewrite.to_v1"  # v2 -> v1 migration


def run_rewrite(
    runtime: Runtime,
    params: RewriteParams,
    *,
    owner: str,
    lease_seconds: float | None = None,
) -> RewriteReport:
    """Plan ``params``' groups and rewrite up to ``max_groups`` of them as ``owner`` (dry:
    only plan), each under a lease of ``lease_seconds`` (default: the settings'
    ``attempt_lease_seconds``). A group that fails is reported and the others still run;
    the caller decides what a failure means (:meth:`RewriteReport.raise_for_failure`)."""
    if params.mode == TO_V1:
        return _optional(TO_V1_MODULE, "mode to-v1 (v2 -> v1 migration)").run_to_v1(
            runtime, params, owner=owner
        )
    groups = plan_rewrite(runtime.metadata, params)
    chosen = groups[: params.max_groups]
    report = RewriteReport(params.mode, params.dry_run, left=len(groups) - len(chosen))
    if params.dry_run:
        report.groups = [GroupResult.of(g, PLANNED) for g in chosen]
        return report
    rewriter = Rewriter(runtime, owner=owner, lease_seconds=lease_seconds)
    for group in chosen:
        report.recovered += [s.segment_id for s in recover_stale_rewrites(runtime)]
        try:
            report.groups.append(rewriter.rewrite(group))
        except Exception as err:  # one group's failure does not hold the others back
            log.warning("rewrite of %s failed", group.describe(), exc_info=True)
            report.groups.append(GroupResult.of(group, FAILED, detail=_text(err)))
    return report


def recover_stale_rewrites(runtime: Runtime) -> list[Segment]:
    """Fail the rewrites whose lease ran out (their keys queued) and abort their recorded
    uploads; what `offloader gc` and the `garbage_collection` DAG run before draining. An
    upload that cannot be aborted now is left to the orphan sweep."""
    failed = runtime.metadata.rewrites.recover_stale()
    for segment in failed:
        log.warning("rewrite segment %s lost its lease: failed, keys queued", segment.segment_id)
        if segment.upload_id is None:
            continue
        try:
            store = runtime.stores.get(segment.store_id, f"segment {segment.segment_id}")
            store.abort_multipart(MultipartUpload(segment.data_key, segment.upload_id))
        except Exception:
            log.warning("could not abort the upload of %s", segment.segment_id, exc_info=True)
    return failed


class Rewriter:
    """Rewrites groups of one runtime as ``owner``, one group per :meth:`rewrite`."""

    def __init__(self, runtime: Runtime, *, owner: str, lease_seconds: float | None = None) -> None:
        self.runtime = runtime
        self.metadata = runtime.metadata
        self.owner = owner
        self.lease_seconds = lease_seconds or runtime.settings.attempt_lease_seconds
        self.grace_ms = int(runtime.settings.replaced_object_grace_seconds * 1000)

    def rewrite(self, group: RewriteGroup) -> GroupResult:
        """One group through every step; ``changed`` when a source moved (nothing
        swapped), ``refused`` when this build cannot merge segments. Other errors are
        raised after the rewrite was failed and its upload aborted."""
        merge = None
        if group.kind == SEGMENT:
            if importlib.util.find_spec(MERGE_MODULE) is None:
                detail = "merging segments needs the server-side segment merge, not in this build"
                return GroupResult.of(group, REFUSED, detail=detail)
            merge = importlib.import_module(MERGE_MODULE).merge_segments
        store = self.runtime.objects
        segment_id = str(uuid.uuid4())
        data_key, index_key = segment_object_keys(segment_id)
        try:
            segment = self.metadata.rewrites.begin(
                group.topic,
                segment_id=segment_id,
                data_key=data_key,
                index_key=index_key,
                store_id=self.runtime.stores.default_id(),
                owner=self.owner,
                lease_ms=int(self.lease_seconds * 1000),
                ledgers=group.ledgers,
                segments=group.segments,
            )
        except CommitFailedError as err:
            return GroupResult.of(group, CHANGED, detail=str(err))
        failpoints.reach("rewrite-after-begin")
        upload: MultipartUpload | None = None
        try:
            upload = store.create_multipart(
                data_key, metadata=segment_user_metadata(group.topic, segment_id, "data")
            )
            failpoints.reach("rewrite-after-create-upload")
            segment = self.metadata.rewrites.record_upload(segment, upload.upload_id)
            with RewriteLease(self.metadata, segment, self.lease_seconds) as lease:
                written = self._write(group, store, upload, _first_part_hook(lease.check), merge)
                lease.check()
                store.complete_multipart(upload, written.parts, if_none_match=True)
                failpoints.reach("rewrite-after-complete")
                meta = segment_user_metadata(group.topic, segment_id, "index")
                store.put(index_key, written.index, metadata=meta, if_none_match=True)
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
        except CommitFailedError as err:  # a source moved, or the lease was lost
            self._give_up(segment, store, upload, str(err))
            return GroupResult.of(group, CHANGED, segment_id=segment_id, detail=str(err))
        except Exception as err:
            self._give_up(segment, store, upload, _text(err))
            raise
        return GroupResult.of(
            group,
            REWRITTEN,
            segment_id=segment_id,
            objects_after=2,
            bytes_after=written.data_len,
        )

    def _write(
        self,
        group: RewriteGroup,
        store: ObjectStore,
        upload: MultipartUpload,
        on_part: Callable[[PartInfo], None],
        merge: Any,
    ) -> RewrittenData:
        """The group's parts uploaded and its index built: v1 sources re-encoded here,
        segments merged by the merge module (server side where the store can)."""
        if merge is None:
            return encode_ledgers(
                self.runtime, group.topic, group.ledgers, store, upload, on_part=on_part
            )
        sources = []
        for segment in group.segments:
            source = self.runtime.stores.get(segment.store_id, f"segment {segment.segment_id}")
            index = INDEX_CACHE.get_segment(source, segment.index_key)
            sources.append((segment, index, source))
        return merge(store, upload, sources, on_part=on_part)  # type: ignore[no-any-return]

    def _give_up(
        self, segment: Segment, store: ObjectStore, upload: MultipartUpload | None, detail: str
    ) -> None:
        """Fail the rewrite (keys queued) and abort its upload; the original error is what
        matters, so a failure here is only logged (the lease runs out, the GC recovers)."""
        try:
            self.metadata.rewrites.fail(segment, detail)
        except Exception:
            log.warning("could not fail rewrite %s", segment.segment_id, exc_info=True)
        if upload is not None:
            try:
                store.abort_multipart(upload)
            except Exception:
                log.warning("could not abort the upload of %s", segment.segment_id, exc_info=True)


def _first_part_hook(check: Callable[[], None]) -> Callable[[PartInfo], None]:
    """After each part: the failpoint after the first, and the lease check."""
    seen = [0]

    def on_part(_: PartInfo) -> None:
        seen[0] += 1
        if seen[0] == 1:
            failpoints.reach("rewrite-after-first-part")
        check()

    return on_part


def _optional(module: str, what: str) -> Any:
    """A module another part of the product provides; ValueError naming it until then."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"{what} is not available in this build ({module} is missing)")
    return importlib.import_module(module)


def _text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"

"""The orphan sweep: the one code path that lists a bucket (DESIGN: "never LISTed to learn state").

Every object the system writes is recorded before its first byte (invariant 1), so an
object that nothing in the metadata references is garbage: a crash between an upload and
its deletion being queued, a zombie that wrote after its keys were deleted, a snapshot
left by a killed export. The sweep lists each recorded store page by page and asks the
database, per page and in one statement, which of that page's keys are referenced:

- a ledger's data or index key (committed offloads, and ledgers on their way out);
- an attempt's keys while it is started (in flight, whatever its lease) or committed;
- a segment's data or index key while the segment is assigned, closing or offloaded,
  whether the stream or a rewrite wrote it (metadata/segments.py, metadata/rewrites.py);
- a pending deletion (already on its way out: queued once is enough).

Keys of failed and superseded attempts are not references: those attempts queued their
keys for deletion, so an object of theirs still present after the queue ran is a late
write and exactly what the sweep exists to catch. The same holds for segments: a failed
one queued its keys when it failed (SegmentStore.fail), a replaced one was failed first,
and a deleted one queued them when retention released it. A reference counts whatever store it
names: keys carry a fresh uuid, and two recorded locations may be one physical store.

What is left and older than ``sweep_grace_seconds`` (the object's LastModified against the
database's clock, invariant 6) is queued for deletion (invariant 5); the GC deletes it.
The grace period covers writes whose record this sweep could not see yet and any skew
between the store's clock and the database's. Metadata snapshots (``_metadata/``, see
metadata/snapshot.py) are protected by their manifest. Multipart uploads started longer
than ``multipart_max_age_seconds`` ago are aborted unless a live attempt (started, lease
not over) owns their key, or, under a segment key, the upload is the one recorded on an
assigned or closing segment (its id, not just its key: a stream's segment stays open across
passes, for as long as its age limit allows, and its upload with it). Any other upload
under a segment key (one a pass created but died before recording, or a failed segment's)
is aborted once past the age.

Only keys of the shapes the offloader writes are ever candidates: ledger objects
(``<uuid>-ledger-<id>[-index]``), segment objects (``<uuid>[-index]``; every shape in
offloader/keys.py) and snapshots directly under
``_metadata/snapshots/``. Anything else in a listed prefix is counted as ``foreign`` and
left alone: another tool's objects in a shared bucket, or the keys of a recorded store
nested inside this one (``tiered/<uuid>-ledger-5`` when both ``s3://b`` and
``s3://b/tiered`` are recorded), which that store's own sweep judges.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from offloader import failpoints
from offloader.exceptions import ObjectNotFoundError, StoreUnavailableError
from offloader.keys import (
    MANIFEST_KEY,
    METADATA_PREFIX,
    is_metadata_key,
    is_offloaded_object_key,
    is_segment_object_key,
    is_snapshot_key,
)
from offloader.metadata import MetadataStore
from offloader.metadata.snapshot import read_manifest
from offloader.objectstore import MultipartUpload, ObjectInfo, ObjectStore
from offloader.objectstore.location import StoreLocation
from offloader.objectstore.registry import StoreRegistry
from offloader.results import fields_json
from offloader.settings import Settings

log = logging.getLogger(__name__)

PAGE = 1000  # keys per metadata lookup (one statement) and per enqueue transaction
ORPHAN_REASON = "orphan (sweep)"


@dataclass(frozen=True)
class Orphan:
    """An unreferenced object older than the grace period."""

    key: str
    size: int
    age_seconds: float


@dataclass(frozen=True)
class StaleUpload:
    """A multipart upload older than the limit that no live attempt owns."""

    key: str
    upload_id: str
    age_seconds: float


@dataclass
class StoreSweep:
    """What the sweep found (and, unless a scan, did) in one store."""

    store_id: int | None  # None: the configured store, not yet recorded (a scan only)
    store: str  # the location, safe to log
    listed: int = 0
    referenced: int = 0
    young: int = 0  # unreferenced, but within the grace period: left alone
    foreign: int = 0  # not a key the offloader writes: never touched
    orphans: int = 0
    orphan_bytes: int = 0
    queued: int = 0
    stale_uploads: int = 0
    aborted_uploads: int = 0
    objects: list[Orphan] = field(default_factory=list)  # filled by a scan only
    uploads: list[StaleUpload] = field(default_factory=list)  # filled by a scan only
    error: str | None = None  # the store could not be swept (it stays as it is)


@dataclass
class SweepResult:
    """What the sweep (or, ``dry_run``, the scan) found and did, store by store."""

    dry_run: bool
    grace_seconds: float
    multipart_max_age_seconds: float
    stores: list[StoreSweep]

    @property
    def orphans(self) -> int:
        return sum(s.orphans for s in self.stores)

    @property
    def errors(self) -> list[str]:
        return [f"{s.store}: {s.error}" for s in self.stores if s.error]

    def raise_for_errors(self) -> None:
        """After the others were swept: fail naming the stores that could not be."""
        if self.errors:
            raise StoreUnavailableError(f"not swept: {'; '.join(self.errors)}")

    def to_json(self) -> dict[str, Any]:
        return {**fields_json(self), "orphans": self.orphans}

    def __str__(self) -> str:
        queue, abort = ("would queue", "would abort") if self.dry_run else ("queued", "aborted")
        lines = []
        for s in self.stores:
            if s.error:
                lines.append(f"{s.store}: NOT SWEPT: {s.error}")
                continue
            queued = s.orphans if self.dry_run else s.queued
            aborted = s.stale_uploads if self.dry_run else s.aborted_uploads
            lines.append(
                f"{s.store}: listed {s.listed}, referenced {s.referenced}, young {s.young}, "
                f"foreign {s.foreign}, "
                f"orphans {s.orphans} ({s.orphan_bytes} bytes, {queue} {queued}), "
                f"stale uploads {s.stale_uploads} ({abort} {aborted})"
            )
            for o in s.objects:
                lines.append(f"  {o.key}  {o.size} bytes  {o.age_seconds:.0f} s old")
            for u in s.uploads:
                lines.append(f"  upload {u.key} ({u.upload_id})  {u.age_seconds:.0f} s old")
        return "\n".join(lines) or "(no stores recorded)"


def sweep(
    metadata: MetadataStore, stores: StoreRegistry, settings: Settings, *, dry_run: bool = False
) -> SweepResult:
    """Sweep every recorded store (the default one recorded first); ``dry_run`` is the scan.

    A store that cannot be opened or listed is reported and left alone; the others are
    still swept.
    """
    if not dry_run:
        stores.default_id()  # the configured store is swept even before its first offload
    targets: list[tuple[int | None, StoreLocation]] = list(metadata.list_locations())
    if stores.default_location not in [location for _, location in targets]:
        targets.insert(0, (None, stores.default_location))  # a scan records nothing
    result = SweepResult(
        dry_run, settings.sweep_grace_seconds, settings.multipart_max_age_seconds, []
    )
    for store_id, location in targets:
        outcome = StoreSweep(store_id, str(location))
        result.stores.append(outcome)
        try:
            store = stores.default if store_id is None else stores.get(store_id, str(location))
            _sweep_store(metadata, store, settings, outcome, dry_run=dry_run)
        except Exception as exc:  # one store's trouble must not stop the others
            log.warning("sweep of %s failed", location, exc_info=True)
            outcome.error = f"{type(exc).__name__}: {exc}"
    return result


def list_objects(store: ObjectStore, prefix: str = "") -> Iterator[list[ObjectInfo]]:
    """The store's objects under ``prefix`` in pages of :data:`PAGE`: the only LIST."""
    it = iter(store.list(prefix))
    while page := list(itertools.islice(it, PAGE)):
        yield page


def _sweep_store(
    metadata: MetadataStore,
    store: ObjectStore,
    settings: Settings,
    out: StoreSweep,
    *,
    dry_run: bool,
) -> None:
    now_ms = metadata.db_now_ms()  # one reading: ages are against the database's clock
    grace_ms = int(settings.sweep_grace_seconds * 1000)
    snapshots = protected_snapshots(store)
    for page in list_objects(store):
        out.listed += len(page)
        judged = judge_page(metadata, page, snapshots)
        out.foreign += len(judged.foreign)
        out.referenced += len(judged.referenced)
        due: list[Orphan] = []
        for info in judged.unreferenced:
            age_ms = _age_ms(info.last_modified, now_ms)
            if age_ms is None or age_ms < grace_ms:
                out.young += 1
                continue
            due.append(Orphan(info.key, info.size, round(age_ms / 1000, 3)))
        out.orphans += len(due)
        out.orphan_bytes += sum(o.size for o in due)
        if dry_run:
            out.objects.extend(due)
        elif due:
            assert out.store_id is not None  # a sweep records the store first
            metadata.deletions.enqueue([o.key for o in due], ORPHAN_REASON, store_id=out.store_id)
            out.queued += len(due)
            failpoints.reach("after-sweep-enqueue")
    if store.capabilities.multipart:
        _sweep_uploads(metadata, store, settings, out, now_ms, dry_run=dry_run)


def _sweep_uploads(
    metadata: MetadataStore,
    store: ObjectStore,
    settings: Settings,
    out: StoreSweep,
    now_ms: int,
    *,
    dry_run: bool,
) -> None:
    max_age_ms = int(settings.multipart_max_age_seconds * 1000)
    uploads = iter(store.list_multipart_uploads())
    while page := list(itertools.islice(uploads, PAGE)):
        old = [
            (u, age)
            for u in page
            if (age := _age_ms(u.initiated, now_ms)) is not None and age >= max_age_ms
        ]
        live = metadata.live_attempt_keys([u.key for u, _ in old])
        recorded = metadata.open_segment_uploads(
            [u.key for u, _ in old if is_segment_object_key(u.key)]
        )
        for upload, age_ms in old:
            if upload.key in live or not is_offloaded_object_key(upload.key):
                continue
            if (upload.key, upload.upload_id) in recorded:
                continue  # an open segment's upload: the next streaming pass goes on with it
            out.stale_uploads += 1
            if dry_run:
                out.uploads.append(StaleUpload(upload.key, upload.upload_id, age_ms / 1000))
            else:
                _abort(store, upload)
                out.aborted_uploads += 1


@dataclass(frozen=True)
class PageJudgement:
    """One listed page split by what the metadata says of each key (one statement)."""

    foreign: list[ObjectInfo]  # not a key the offloader writes: never touched
    referenced: list[ObjectInfo]  # referenced, or a snapshot the manifest keeps
    unreferenced: list[ObjectInfo]  # an offloader key nothing references: sweepable


def judge_page(
    metadata: MetadataStore, page: list[ObjectInfo], snapshots: set[str] | None
) -> PageJudgement:
    """Split ``page`` with one ``referenced_keys`` statement; ``snapshots`` is what
    :func:`protected_snapshots` read for the page's store. The sweep and `offloader verify`
    judge every page this way."""
    referenced = metadata.referenced_keys([o.key for o in page])
    judged = PageJudgement([], [], [])
    for info in page:
        if not _is_offloader_key(info.key):
            judged.foreign.append(info)
        elif info.key in referenced or _is_protected_snapshot(info.key, snapshots):
            judged.referenced.append(info)
        else:
            judged.unreferenced.append(info)
    return judged


def _is_offloader_key(key: str) -> bool:
    return is_offloaded_object_key(key) or is_snapshot_key(key)


def _abort(store: ObjectStore, upload: MultipartUpload) -> None:
    log.info("aborting stale multipart upload %s of %s", upload.upload_id, upload.key)
    store.abort_multipart(upload)


def protected_snapshots(store: ObjectStore) -> set[str] | None:
    """Keys under ``_metadata/`` the sweep must keep: the manifest and the snapshots it
    names. None when the manifest cannot be read: then nothing there is touched."""
    try:
        manifest = read_manifest(store)
    except ObjectNotFoundError:
        return {MANIFEST_KEY}
    except Exception:
        log.warning("snapshot manifest unreadable; the sweep leaves %s alone", METADATA_PREFIX)
        return None
    return {MANIFEST_KEY, *(s.key for s in manifest)}


def _is_protected_snapshot(key: str, snapshots: set[str] | None) -> bool:
    if not is_metadata_key(key):
        return False
    return snapshots is None or key in snapshots


def _age_ms(when: datetime | None, now_ms: int) -> int | None:
    """Age on the database's clock; None when the store gave no time (never swept)."""
    if when is None:
        return None
    return now_ms - int(when.timestamp() * 1000)


def count_stale_uploads(metadata: MetadataStore, store: ObjectStore, settings: Settings) -> int:
    """How many multipart uploads of ``store`` the sweep would abort now (a scan's count,
    nothing aborted): what `offloader verify` reports beside its breaches."""
    if not store.capabilities.multipart:
        return 0
    out = StoreSweep(None, "")
    _sweep_uploads(metadata, store, settings, out, metadata.db_now_ms(), dry_run=True)
    return out.stale_uploads

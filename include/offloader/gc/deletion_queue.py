"""Draining the deletion queue (invariant 5): batched deletes, retries with backoff.

Nothing is dropped: a key leaves the queue only once the store confirms it gone, and a key
the store no longer has counts as gone. Every queued key names the store it lives in
(invariant 7); a store that cannot be opened or does not answer keeps its keys queued,
untried and counted as ``skipped`` with the store named, so the other stores are still
drained (invariant 8). A pass is bounded (``limit`` rows) and reads the queue a batch at
a time in the order of its index, so its cost does not grow with the queue's history. The pass never
lists the bucket: unfinished multipart uploads are the orphan sweep's to abort.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

from offloader import failpoints
from offloader.exceptions import StoreUnavailableError
from offloader.metadata import Deletion, DeletionBacklog, MetadataStore
from offloader.objectstore import ObjectStore
from offloader.results import fields_json
from offloader.settings import Settings
from offloader.status import backlog_lines

log = logging.getLogger(__name__)

#: The most rows one pass takes unless told otherwise.
DEFAULT_PASS_LIMIT = 10_000


@dataclass(frozen=True)
class DeletionPass:
    """One pass: what it did (``delete_requests`` = store delete calls, each one
    DeleteObjects on S3), and the backlog it left (``remaining`` = ``backlog.pending``)."""

    deleted: int
    failed: int
    remaining: int
    delete_requests: int
    backlog: DeletionBacklog
    skipped: int = 0  # rows left queued, untried: their store is unreachable
    skipped_stores: list[str] = field(default_factory=list)  # each: the store and why

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        """What it did, then the backlog for people (:func:`~offloader.status.backlog_lines`)."""
        done = (
            f"deleted {self.deleted}, failed {self.failed}, pending {self.remaining} "
            f"({self.delete_requests} delete requests)"
        )
        if self.skipped:
            done += f", skipped {self.skipped} (store unreachable)"
        skipped = [f"skipped store {store}" for store in self.skipped_stores]
        return "\n".join([done, *skipped, *backlog_lines(self.backlog)])


def backoff_ms(tries: int, settings: Settings) -> int:
    """Exponential: base * 2**tries, capped."""
    delay = min(settings.delete_retry_base_seconds * (2**tries), settings.delete_retry_max_seconds)
    return int(delay * 1000)


class Stores(Protocol):
    """Opens the store a row recorded (offloader.objectstore.registry.StoreRegistry)."""

    def get(self, store_id: int | None, what: str) -> ObjectStore: ...


def process_deletions(
    metadata: MetadataStore,
    stores: Stores,
    settings: Settings,
    limit: int = DEFAULT_PASS_LIMIT,
) -> DeletionPass:
    """Delete up to ``limit`` due keys, each in the store it was queued for, in batches of
    ``settings.gc_batch_keys`` (one delete request each)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    started_ms = metadata.db_now_ms()
    deleted = failed = requests = taken = skipped = 0
    skipped_stores: dict[int | None, str] = {}
    while taken < limit:
        # Rows tried in this pass are rescheduled after its start, so they are not due again.
        due = metadata.deletions.due(min(settings.gc_batch_keys, limit - taken), started_ms)
        if not due:
            break
        taken += len(due)
        by_store: dict[int | None, list[Deletion]] = defaultdict(list)
        for row in due:
            by_store[row.store_id].append(row)
        for store_id, rows in by_store.items():
            try:
                store = stores.get(store_id, f"queued deletion {rows[0].id}")
            except StoreUnavailableError as exc:
                if store_id not in skipped_stores:
                    log.warning("deletions skip store %s: %s", store_id, exc)
                skipped_stores[store_id] = str(exc)
                metadata.deletions.postpone([r.id for r in rows], started_ms + 1, str(exc))
                skipped += len(rows)
                continue
            done, errors, calls = _delete_in_store(metadata, store, rows, settings)
            _retry_later(metadata, settings, rows, errors, started_ms + 1)
            deleted += done
            failed += len(errors)
            requests += calls
    backlog = metadata.deletions.backlog(settings.gc_failing_tries)
    return DeletionPass(
        deleted=deleted,
        failed=failed,
        remaining=backlog.pending,
        delete_requests=requests,
        backlog=backlog,
        skipped=skipped,
        skipped_stores=list(skipped_stores.values()),
    )


def _delete_in_store(
    metadata: MetadataStore,
    store: ObjectStore,
    rows: list[Deletion],
    settings: Settings,
) -> tuple[int, dict[str, str], int]:
    """Delete rows of one store in batches. Returns (done, errors by key, delete calls)."""
    batch = min(settings.gc_batch_keys, store.capabilities.max_delete_batch)
    done, errors, calls = 0, {}, 0
    for start in range(0, len(rows), batch):
        n, failed = _delete_batch(metadata, store, rows[start : start + batch])
        done, calls = done + n, calls + 1
        errors.update(failed)
    return done, errors, calls


def _delete_batch(
    metadata: MetadataStore, store: ObjectStore, rows: list[Deletion]
) -> tuple[int, dict[str, str]]:
    """Delete one batch (one request); mark the confirmed ones done (a key the store did
    not have is confirmed gone). Returns (done, errors by key)."""
    try:
        errors = store.delete_many([row.object_key for row in rows]).failed
    except Exception as exc:
        errors = {row.object_key: f"{type(exc).__name__}: {exc}" for row in rows}
    failpoints.reach("after-store-delete")
    done = [row.id for row in rows if row.object_key not in errors]
    metadata.deletions.complete(done)
    return len(done), errors


def _retry_later(
    metadata: MetadataStore,
    settings: Settings,
    rows: list[Deletion],
    errors: dict[str, str],
    not_before_ms: int,
) -> None:
    """Record each failed row's try and error and back it off, in one transaction."""
    failures = []
    for row in rows:
        if row.object_key in errors:
            error = errors[row.object_key]
            log.warning("delete of %s failed (try %d): %s", row.object_key, row.tries + 1, error)
            failures.append((row, error, backoff_ms(row.tries, settings)))
    metadata.deletions.retry_later(failures, not_before_ms)


@dataclass(frozen=True)
class DrainResult:
    """Passes run until nothing more could be deleted, ``max_items`` rows were taken or the
    time budget was spent (``stopped`` says which); ``backlog`` is what is left."""

    passes: int
    deleted: int
    failed: int
    delete_requests: int
    seconds: float
    stopped: str  # drained | max items | time budget | dry run
    dry_run: bool
    backlog: DeletionBacklog
    skipped: int = 0  # rows left queued, untried: their store is unreachable
    skipped_stores: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        text = (
            f"{self.passes} passes: deleted {self.deleted}, failed {self.failed} in "
            f"{self.delete_requests} delete requests, {self.seconds:.1f}s (stopped: {self.stopped})"
        )
        if self.skipped:
            text += f", skipped {self.skipped} (store unreachable)"
        return "\n".join([text, *(f"skipped store {s}" for s in self.skipped_stores)])


def drain_queue(
    metadata: MetadataStore,
    stores: Stores,
    settings: Settings,
    *,
    max_items: int = 100_000,
    time_budget_seconds: float = 1800.0,
    dry_run: bool = False,
) -> DrainResult:
    """Run bounded passes back to back (the ``garbage_collection`` DAG's drain task).

    A pass that deletes nothing ends the drain: nothing is due, or what is due keeps failing
    and has been backed off. A dry run only reports the backlog. The budget is a duration on
    this worker's monotonic clock, not an age, so the database's clock is not needed.
    """
    if max_items < 1:
        raise ValueError(f"max_items must be >= 1, got {max_items}")
    if time_budget_seconds <= 0:
        raise ValueError(f"time_budget_seconds must be > 0, got {time_budget_seconds}")
    started = time.monotonic()
    passes = deleted = failed = requests = skipped = 0
    skipped_stores: list[str] = []
    stopped = "dry run" if dry_run else "drained"
    while not dry_run:
        if deleted + failed >= max_items:
            stopped = "max items"
            break
        if time.monotonic() - started >= time_budget_seconds:
            stopped = "time budget"
            break
        limit = min(DEFAULT_PASS_LIMIT, max_items - deleted - failed)
        one = process_deletions(metadata, stores, settings, limit=limit)
        passes += 1
        deleted, failed = deleted + one.deleted, failed + one.failed
        requests += one.delete_requests
        # a skipped row is due again in the next pass: count each once, not once a pass
        skipped = max(skipped, one.skipped)
        skipped_stores += [s for s in one.skipped_stores if s not in skipped_stores]
        log.info("pass %d: deleted %d, failed %d", passes, one.deleted, one.failed)
        if one.deleted == 0:
            break
    return DrainResult(
        passes=passes,
        deleted=deleted,
        failed=failed,
        delete_requests=requests,
        seconds=round(time.monotonic() - started, 3),
        stopped=stopped,
        dry_run=dry_run,
        backlog=metadata.deletions.backlog(settings.gc_failing_tries),
        skipped=skipped,
        skipped_stores=skipped_stores,
    )

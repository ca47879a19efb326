"""Draining the deletion queue (invariant 5): batched deletes, retries with backoff.

Nothing is dropped: a key leaves the queue only once the store confirms it gone. Unfinished
multipart uploads of a key (a crash mid-upload) are aborted with it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from offloader import failpoints
from offloader.metadata import Deletion, MetadataStore, now_ms
from offloader.objectstore import ObjectStore
from offloader.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeletionPass:
    deleted: int
    failed: int
    remaining: int


def backoff_ms(tries: int, settings: Settings) -> int:
    """Exponential: base * 2**tries, capped."""
    delay = min(settings.delete_retry_base_seconds * (2**tries), settings.delete_retry_max_seconds)
    return int(delay * 1000)


def process_deletions(
    metadata: MetadataStore, store: ObjectStore, settings: Settings, limit: int = 10_000
) -> DeletionPass:
    due = metadata.due_deletions(limit)
    failed = 0
    deleted = 0
    batch = store.capabilities.max_delete_batch
    for start in range(0, len(due), batch):
        rows = due[start : start + batch]
        _abort_uploads(store, rows)
        try:
            result = store.delete_many([row.object_key for row in rows])
            errors = result.failed
        except Exception as exc:
            errors = {row.object_key: f"{type(exc).__name__}: {exc}" for row in rows}
        failpoints.reach("after-store-delete")
        done = [row.id for row in rows if row.object_key not in errors]
        metadata.complete_deletions(done)
        deleted += len(done)
        for row in rows:
            if row.object_key in errors:
                failed += 1
                log.warning(
                    "delete of %s failed (try %d): %s",
                    row.object_key,
                    row.tries + 1,
                    errors[row.object_key],
                )
                metadata.retry_deletion_later(
                    row, errors[row.object_key], now_ms() + backoff_ms(row.tries, settings)
                )
    remaining = len(metadata.pending_deletions())
    return DeletionPass(deleted=deleted, failed=failed, remaining=remaining)


def _abort_uploads(store: ObjectStore, rows: list[Deletion]) -> None:
    if not store.capabilities.multipart:
        return
    keys = {row.object_key for row in rows}
    try:
        for upload in store.list_multipart_uploads():
            if upload.key in keys:
                store.abort_multipart(upload)
    except Exception:
        log.warning("could not abort multipart uploads of queued keys", exc_info=True)

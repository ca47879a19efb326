"""Draining the deletion queue (invariant 5): batched deletes, retries with backoff.

Nothing is dropped: a key leaves the queue only once the store confirms it gone. Unfinished
multipart uploads of a key (a crash mid-upload) are aborted with it. Every queued key names
the store it lives in (invariant 7); a store that cannot be opened keeps its keys queued,
with the error naming the store.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

from offloader import failpoints
from offloader.exceptions import StoreUnavailableError
from offloader.metadata import Deletion, MetadataStore
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


class Stores(Protocol):
    """Opens the store a row recorded (offloader.objectstore.registry.StoreRegistry)."""

    def get(self, store_id: int | None, what: str) -> ObjectStore: ...


def process_deletions(
    metadata: MetadataStore, stores: Stores, settings: Settings, limit: int = 10_000
) -> DeletionPass:
    """Delete due keys, each in the store it was queued for."""
    by_store: dict[int | None, list[Deletion]] = defaultdict(list)
    for row in metadata.due_deletions(limit):
        by_store[row.store_id].append(row)
    deleted = failed = 0
    for store_id, due in by_store.items():
        try:
            store = stores.get(store_id, f"queued deletion {due[0].id}")
        except StoreUnavailableError as exc:
            _retry_later(metadata, settings, due, {row.object_key: str(exc) for row in due})
            failed += len(due)
            continue
        batch = store.capabilities.max_delete_batch
        for start in range(0, len(due), batch):
            done, errors = _delete_batch(metadata, store, due[start : start + batch])
            _retry_later(metadata, settings, due[start : start + batch], errors)
            deleted += done
            failed += len(errors)
    remaining = len(metadata.pending_deletions())
    return DeletionPass(deleted=deleted, failed=failed, remaining=remaining)


def _delete_batch(
    metadata: MetadataStore, store: ObjectStore, rows: list[Deletion]
) -> tuple[int, dict[str, str]]:
    """Delete one batch; mark the confirmed ones done. Returns (done, errors by key)."""
    _abort_uploads(store, rows)
    try:
        errors = store.delete_many([row.object_key for row in rows]).failed
    except Exception as exc:
        errors = {row.object_key: f"{type(exc).__name__}: {exc}" for row in rows}
    failpoints.reach("after-store-delete")
    done = [row.id for row in rows if row.object_key not in errors]
    metadata.complete_deletions(done)
    return len(done), errors


def _retry_later(
    metadata: MetadataStore, settings: Settings, rows: list[Deletion], errors: dict[str, str]
) -> None:
    for row in rows:
        if row.object_key in errors:
            error = errors[row.object_key]
            log.warning("delete of %s failed (try %d): %s", row.object_key, row.tries + 1, error)
            metadata.retry_deletion_later(row, error, backoff_ms(row.tries, settings))


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

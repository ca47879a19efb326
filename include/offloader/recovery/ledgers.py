"""Offloaded ledgers (v1) as their objects state them: an index object, its user metadata
and its data object, read back into what a rebuild records (docs/FORMAT.md)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from offloader.format import decode_index
from offloader.format.object_metadata import LEDGER_OBJECT_FORMAT_VERSION
from offloader.metadata.snapshot import SnapshotError
from offloader.objectstore import ObjectStore
from offloader.recovery._objects import whole_data_object


@dataclass(frozen=True)
class FoundLedger:
    """One complete copy of a ledger's objects."""

    topic: str
    ledger_id: int
    attempt_id: str
    data_key: str
    index_key: str
    entry_count: int
    size_bytes: int
    data_len: int
    created_ms: int
    sealed_ms: int
    offloaded_ms: int


def read_ledger(store: ObjectStore, index_key: str, attempt_id: str, ledger_id: int) -> FoundLedger:
    """A ledger from its v1 index, checked against its key, user metadata and data object."""
    user = store.stat(index_key).metadata
    index = decode_index(store.get(index_key))
    meta = index.metadata
    if meta is None:
        raise SnapshotError("the index holds no ledger metadata (a foreign index)")
    if user.get("format-version", LEDGER_OBJECT_FORMAT_VERSION) != LEDGER_OBJECT_FORMAT_VERSION:
        raise SnapshotError(f"unknown object format-version {user.get('format-version')!r}")
    from_user = (unquote(user.get("managed-ledger", meta.topic)), user.get("ledger-id"))
    if from_user != (meta.topic, str(meta.ledger_id)) or meta.ledger_id != ledger_id:
        raise SnapshotError(
            f"the index says {meta.topic}/{meta.ledger_id}, the key and user metadata say "
            f"{from_user[0]}/{from_user[1] or ledger_id}"
        )
    data_key, data_len = whole_data_object(store, index_key, index.data_object_len)
    return FoundLedger(
        topic=meta.topic,
        ledger_id=meta.ledger_id,
        attempt_id=attempt_id,
        data_key=data_key,
        index_key=index_key,
        entry_count=meta.entry_count,
        size_bytes=meta.length,
        data_len=data_len,
        created_ms=meta.created_ms,
        sealed_ms=meta.sealed_ms,
        offloaded_ms=0,
    )

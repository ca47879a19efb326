"""What reading a ledger's (v1) and a segment's (v2) objects back share: the data object
beside an index, checked against the length the index gives it (docs/FORMAT.md)."""

from __future__ import annotations

from offloader.keys import data_key_of
from offloader.metadata.snapshot import SnapshotError
from offloader.objectstore import ObjectStore


def whole_data_object(store: ObjectStore, index_key: str, data_object_len: int) -> tuple[str, int]:
    """(key, length) of the data object of the index at ``index_key``; SnapshotError unless
    its length is the index's ``data_object_len``."""
    data_key = data_key_of(index_key)
    data_len = store.stat(data_key).size
    if data_len != data_object_len:
        raise SnapshotError(
            f"data object {data_key} is {data_len} bytes, the index says {data_object_len}"
        )
    return data_key, data_len

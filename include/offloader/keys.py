"""The object-key namespace of a store (docs/FORMAT.md): every key shape the offloader writes,
built, parsed and recognised here and nowhere else.

- offloaded ledgers (v1): ``<uuid>-ledger-<id>`` and ``<uuid>-ledger-<id>-index``, a new
  uuid per attempt;
- streaming segments (v2): ``<uuid>`` and ``<uuid>-index``, the segment's uuid;
- the reserved ``_metadata/`` prefix (no offload key starts with ``_``): metadata
  snapshots and their manifest under ``_metadata/snapshots/``, each topic's recorded start
  under ``_metadata/starts/``;
- bulk exports: ``<export id>/_manifest.json`` and the attempt's files under
  ``<export id>/<attempt>/`` (a local directory stages attempts under ``.attempts/``),
  by default under ``exports/`` of the configured store; scrub reports, by default under
  ``scrub-reports/``.

Keys are flat under the store's prefix; which store is recorded in the metadata, never in
the key. What each object carries besides its key (its user metadata) is part of the object
format: ``offloader/format/object_metadata.py``. This module imports nothing of the
offloader, so every layer can use it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from urllib.parse import quote, unquote

INDEX_SUFFIX = "-index"

# a uuid4 as str(uuid.uuid4()) spells it: lower-case hex in 8-4-4-4-12
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


# --- offloaded ledgers (v1) and streaming segments (v2) ------------------------------------
def ledger_object_keys(attempt_id: str, ledger_id: int) -> tuple[str, str]:
    """(data key, index key): ``<uuid>-ledger-<id>`` and ``<uuid>-ledger-<id>-index``."""
    data = f"{attempt_id}-ledger-{ledger_id}"
    return data, f"{data}{INDEX_SUFFIX}"


def segment_object_keys(segment_id: str) -> tuple[str, str]:
    """(data key, index key): ``<uuid>`` and ``<uuid>-index`` (FORMAT.md, PIP-76)."""
    return segment_id, f"{segment_id}{INDEX_SUFFIX}"


def data_key_of(index_key: str) -> str:
    """The data object's key beside an index key, of a ledger or a segment."""
    return index_key.removesuffix(INDEX_SUFFIX)


# what ledger_object_keys makes of a uuid4 attempt id (the orphan sweep touches nothing else)
LEDGER_OBJECT_KEY = re.compile(_UUID + r"-ledger-\d+(?:-index)?")

# what segment_object_keys makes of a uuid4 segment id: ``<uuid>`` (the data object) and
# ``<uuid>-index``
SEGMENT_OBJECT_KEY = re.compile(_UUID + r"(?:-index)?")

_LEDGER_INDEX_KEY = re.compile(rf"^({_UUID})-ledger-(\d+)-index$")
_SEGMENT_INDEX_KEY = re.compile(rf"^({_UUID})-index$")


def is_ledger_object_key(key: str) -> bool:
    """Whether ``key`` has the shape of an offloaded ledger's data or index object."""
    return LEDGER_OBJECT_KEY.fullmatch(key) is not None


def is_segment_object_key(key: str) -> bool:
    """Whether ``key`` has the shape of a streaming segment's data or index object."""
    return SEGMENT_OBJECT_KEY.fullmatch(key) is not None


def is_offloaded_object_key(key: str) -> bool:
    """Whether ``key`` has the shape of any object an offload writes (ledger or segment)."""
    return is_ledger_object_key(key) or is_segment_object_key(key)


def parse_ledger_index_key(key: str) -> tuple[str, int] | None:
    """(attempt id, ledger id) of a ledger's index key; None for any other key."""
    match = _LEDGER_INDEX_KEY.match(key)
    return None if match is None else (match.group(1), int(match.group(2)))


def parse_segment_index_key(key: str) -> str | None:
    """The segment id of a segment's index key; None for any other key."""
    match = _SEGMENT_INDEX_KEY.match(key)
    return None if match is None else match.group(1)


# --- the reserved _metadata/ prefix: metadata snapshots ------------------------------------
METADATA_PREFIX = "_metadata/"
SNAPSHOT_PREFIX = METADATA_PREFIX + "snapshots/"
MANIFEST_KEY = SNAPSHOT_PREFIX + "manifest.json"
_SNAPSHOT_KEY = re.compile(r"_metadata/snapshots/[^/]+\.jsonl\.gz")


def snapshot_key(created_ms: int, snapshot_id: str) -> str:
    """``_metadata/snapshots/<YYYYMMDDTHHMMSSmmm>Z-<uuid>.jsonl.gz``, the time in UTC."""
    stamp = datetime.fromtimestamp(created_ms / 1000, UTC)
    return f"{SNAPSHOT_PREFIX}{stamp:%Y%m%dT%H%M%S}{created_ms % 1000:03d}Z-{snapshot_id}.jsonl.gz"


def is_snapshot_key(key: str) -> bool:
    """Whether ``key`` has the shape of a snapshot directly under ``_metadata/snapshots/``."""
    return _SNAPSHOT_KEY.fullmatch(key) is not None


# a topic's start, recorded where a rebuild from the objects alone finds it (FORMAT.md)
START_PREFIX = METADATA_PREFIX + "starts/"
_START_KEY = re.compile(r"_metadata/starts/([^/]+)\.json")


def topic_start_key(topic: str) -> str:
    """``_metadata/starts/<topic, percent-encoded>.json``: one safe key segment per topic."""
    return f"{START_PREFIX}{quote(topic, safe='')}.json"


def parse_topic_start_key(key: str) -> str | None:
    """The topic whose start ``key`` records; None for any other key."""
    match = _START_KEY.fullmatch(key)
    return None if match is None else unquote(match.group(1))


def is_metadata_key(key: str) -> bool:
    """Whether ``key`` is under the reserved ``_metadata/`` prefix."""
    return key.startswith(METADATA_PREFIX)


# --- bulk exports and scrub reports ---------------------------------------------------------
EXPORTS_DIR = "exports"  # bulk_export's output under the configured store, by default
EXPORT_MANIFEST_NAME = "_manifest.json"
EXPORT_ATTEMPTS_DIR = ".attempts"  # a local directory's staged attempts
# an attempt's folder under ``<export id>/`` (``ExportTarget.new_attempt``: a uuid4 hex)
_EXPORT_ATTEMPT_FOLDER = re.compile(r"[0-9a-f]{32}/")
SCRUB_REPORTS_DIR = "scrub-reports"  # a scrub's report under the configured store, by default


def export_prefix(export_id: str) -> str:
    """``<export id>/``: the folder of an export's manifest (and, on S3, its attempts)."""
    return f"{export_id}/"


def export_attempt_folder(attempt: str) -> str:
    """``<attempt>/``: an attempt's folder relative to its export's."""
    return f"{attempt}/"


def is_export_attempt_key(key: str, export_id: str) -> bool:
    """Whether ``key`` lies in an attempt's folder of export ``export_id``."""
    prefix = export_prefix(export_id)
    return key.startswith(prefix) and _EXPORT_ATTEMPT_FOLDER.match(key, len(prefix)) is not None


def export_file_path(topic: str, ledger_id: int, first_entry_id: int, last_entry_id: int) -> str:
    """A slice's Parquet file relative to its attempt's folder, partitioned by topic and
    ledger (Hive style; the topic percent-encoded, so any topic name is one safe path
    segment)."""
    return (
        f"topic={quote(topic, safe='')}/ledger_id={ledger_id}/"
        f"part-{first_entry_id:020d}-{last_entry_id:020d}.parquet"
    )


def scrub_report_key(name: str) -> str:
    """``scrub-reports/<name>.json``: a scrub's report under the configured store."""
    return f"{SCRUB_REPORTS_DIR}/{name}.json"

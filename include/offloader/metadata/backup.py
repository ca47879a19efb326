"""Metadata backup (PDP-34's metadata export): snapshots to the object store, restore, rebuild.

``export_snapshot`` writes every table of ``schema.metadata`` (generically: tables other
releases add are included) as one gzip'd JSON-lines object under ``_metadata/snapshots/``,
with the format version, the Alembic revision and a SHA-256 over its lines; docs/FORMAT.md
describes it. A snapshot becomes visible only when the manifest (``_metadata/snapshots/
manifest.json``) names it, and the manifest is written after the snapshot is complete, so
an export killed half-way never turns into the "latest". The manifest keeps the last
``metadata_snapshots_keep``; older snapshots go through the deletion queue (invariant 5).
The manifest, not a LIST, is how a restore finds snapshots: only the sweep lists.

``import_snapshot`` restores one into an empty database at the same revision, checking the
checksum before it writes anything, all in one transaction. ``rebuild_from_objects`` is the
last resort without a snapshot: topics, offloaded ledgers and streaming segments from the
index objects' own metadata (FORMAT.md) and the objects' user metadata.

Tables are exported generically, so the streaming tables (``streams``, ``segments``,
``segment_parts``, ``segment_ledgers``) and ``ledgers.offload_mode`` round-trip like the rest.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import json
import logging
import re
import tempfile
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import unquote

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from offloader import failpoints
from offloader.exceptions import FormatError, ObjectNotFoundError, OffloaderError
from offloader.format import SEGMENT_FORMAT_VERSION, decode_index, decode_segment_index
from offloader.metadata import schema
from offloader.metadata.clock import db_now_ms
from offloader.metadata.locations import record_location
from offloader.metadata.migrate import head_revision
from offloader.metadata.records import (
    AttemptState,
    HotState,
    LedgerState,
    OffloadMode,
    OffloadState,
    SegmentState,
)
from offloader.objectstore import ObjectStore
from offloader.offload.keys import FORMAT_VERSION as OBJECT_FORMAT_VERSION
from offloader.policy import OffloadPolicy

if TYPE_CHECKING:
    from offloader.runtime import Runtime

log = logging.getLogger(__name__)

SNAPSHOT_PREFIX = "_metadata/snapshots/"
MANIFEST_KEY = SNAPSHOT_PREFIX + "manifest.json"
FORMAT = "offloader-metadata-snapshot"
FORMAT_VERSION = 1
ROWS_PER_INSERT = 1000
PART_SIZE = 16 * 1024 * 1024  # multipart above this (S3's minimum part is 5 MiB)
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_INDEX_KEY = re.compile(rf"^({_UUID})-ledger-(\d+)-index$")
_SEGMENT_INDEX_KEY = re.compile(rf"^({_UUID})-index$")  # stream/offloader.py's shape


class SnapshotError(OffloaderError):
    """A snapshot cannot be restored (damaged, other revision) or the database is not empty."""


@dataclass(frozen=True)
class SnapshotInfo:
    """One manifest entry."""

    key: str
    created_ms: int
    revision: str
    sha256: str
    bytes: int
    rows: dict[str, int]


@dataclass(frozen=True)
class ExportResult:
    snapshot: SnapshotInfo
    kept: list[str]
    retired: list[str]  # queued for deletion


@dataclass(frozen=True)
class RebuildResult:
    topics: list[str]
    ledgers: int  # offloaded ledgers recorded, of both modes
    skipped: list[str]  # index objects (or streamed ledgers) not used, each with the reason
    segments: int = 0  # offloaded streaming segments recorded (those some ledger needs)
    streamed_ledgers: int = 0  # of ``ledgers``, those recorded in stream mode


# --- the manifest --------------------------------------------------------------------------
def read_manifest(store: ObjectStore) -> list[SnapshotInfo]:
    """The snapshots the manifest names, oldest first; ObjectNotFoundError without one."""
    raw = json.loads(store.get(MANIFEST_KEY))
    if raw.get("format") != FORMAT or raw.get("format_version") != FORMAT_VERSION:
        raise SnapshotError(f"{MANIFEST_KEY}: not a version {FORMAT_VERSION} snapshot manifest")
    return [SnapshotInfo(**item) for item in raw["snapshots"]]


def _write_manifest(store: ObjectStore, snapshots: list[SnapshotInfo]) -> None:
    body = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "snapshots": [asdict(s) for s in snapshots],
    }
    store.put(MANIFEST_KEY, json.dumps(body, indent=1, sort_keys=True).encode())


def latest_snapshot(store: ObjectStore) -> SnapshotInfo:
    try:
        snapshots = read_manifest(store)
    except ObjectNotFoundError:
        snapshots = []
    if not snapshots:
        raise SnapshotError(
            f"no metadata snapshot in {store.url} ({MANIFEST_KEY} names none): run "
            "`offloader metadata export`, or `offloader metadata rebuild` without one"
        )
    return snapshots[-1]


# --- export --------------------------------------------------------------------------------
def export_snapshot(engine: Engine, store: ObjectStore, store_id: int, keep: int) -> ExportResult:
    """Write a snapshot of every table to ``store`` (recorded as ``store_id``), make it the
    latest, and queue all but the newest ``keep`` for deletion."""
    from offloader.metadata.store import MetadataStore

    with tempfile.TemporaryDirectory(prefix="offloader-snapshot-") as tmp:
        path = Path(tmp) / "snapshot.jsonl.gz"
        with path.open("wb") as raw:
            created_ms, revision, sha256, rows = _dump(engine, raw)
        stamp = datetime.fromtimestamp(created_ms / 1000, UTC)
        key = (
            f"{SNAPSHOT_PREFIX}{stamp:%Y%m%dT%H%M%S}{created_ms % 1000:03d}Z-"
            f"{uuid.uuid4()}.jsonl.gz"
        )
        info = SnapshotInfo(key, created_ms, revision, sha256, path.stat().st_size, rows)
        _upload(store, key, path, {"sha256": sha256, "revision": revision})
    failpoints.reach("after-snapshot-upload")
    try:
        previous = read_manifest(store)
    except ObjectNotFoundError:
        previous = []
    snapshots = [*previous, info]
    kept, retired = snapshots[-keep:], snapshots[:-keep]
    _write_manifest(store, kept)  # the snapshot is now the latest
    if retired:
        MetadataStore(engine).deletions.enqueue(
            [s.key for s in retired], "metadata snapshot beyond the kept ones", store_id=store_id
        )
    return ExportResult(info, [s.key for s in kept], [s.key for s in retired])


def export_from(rt: Runtime) -> ExportResult:
    """``offloader metadata export`` and the GC DAG: a snapshot of ``rt``'s database in its
    configured store, keeping the newest ``metadata_snapshots_keep``."""
    return export_snapshot(
        rt.metadata.engine, rt.objects, rt.stores.default_id(), rt.settings.metadata_snapshots_keep
    )


def _dump(engine: Engine, raw: IO[bytes]) -> tuple[int, str, str, dict[str, int]]:
    """Stream every table into ``raw`` from one consistent read; returns (created_ms,
    revision, sha256 of the lines, rows per table)."""
    digest = hashlib.sha256()
    rows: dict[str, int] = {}
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as out:

        def line(value: Any) -> None:
            data = json.dumps(value, separators=(",", ":"), sort_keys=True).encode() + b"\n"
            digest.update(data)
            out.write(data)

        options = {"isolation_level": "REPEATABLE READ"} if _is_postgres(engine) else {}
        with engine.connect().execution_options(**options) as conn:
            revision = _revision(conn)
            created_ms = db_now_ms(conn)
            tables = schema.metadata.sorted_tables  # parents before children
            line(
                {
                    "format": FORMAT,
                    "format_version": FORMAT_VERSION,
                    "revision": revision,
                    "created_ms": created_ms,
                    "tables": {t.name: [c.name for c in t.columns] for t in tables},
                }
            )
            for table in tables:
                rows[table.name] = 0
                query = sa.select(table).order_by(*table.primary_key.columns)
                for row in conn.execution_options(yield_per=ROWS_PER_INSERT).execute(query):
                    line({"t": table.name, "r": list(row)})
                    rows[table.name] += 1
        out.write(
            json.dumps({"end": True, "rows": rows, "sha256": digest.hexdigest()}).encode() + b"\n"
        )
    return created_ms, revision, digest.hexdigest(), rows


def _revision(conn: Connection) -> str:
    from alembic.runtime.migration import MigrationContext

    revision = MigrationContext.configure(conn).get_current_revision()
    if revision is None:
        raise SnapshotError("the metadata database has no schema: run `offloader db upgrade`")
    return revision


def _upload(store: ObjectStore, key: str, path: Path, metadata: dict[str, str]) -> None:
    size = path.stat().st_size
    if size <= PART_SIZE or not store.capabilities.multipart:
        store.put(key, path.read_bytes(), metadata=metadata, if_none_match=True)
        return
    upload = store.create_multipart(key, metadata=metadata)
    try:
        parts = []
        with path.open("rb") as handle:
            while chunk := handle.read(PART_SIZE):
                parts.append(store.upload_part(upload, len(parts) + 1, chunk))
        store.complete_multipart(upload, parts, if_none_match=True)
    except BaseException:
        store.abort_multipart(upload)
        raise


# --- import --------------------------------------------------------------------------------
def import_snapshot(engine: Engine, store: ObjectStore, key: str | None) -> SnapshotInfo:
    """Restore snapshot ``key`` (None: the latest) into the empty database ``engine``.

    The whole snapshot is checked (gzip, SHA-256, row counts, revision, columns) before
    the one transaction that loads it; any refusal changes nothing.
    """
    chosen = latest_snapshot(store) if key in (None, "latest") else None
    key = chosen.key if chosen else str(key)
    with tempfile.TemporaryDirectory(prefix="offloader-snapshot-") as tmp:
        path = Path(tmp) / "snapshot.jsonl.gz"
        size = _download(store, key, path)
        header, trailer = _verify(path, key, chosen.sha256 if chosen else None)
        with engine.begin() as conn:
            _require_empty(conn, "import a snapshot")
            for table in schema.metadata.sorted_tables:
                if list(header["tables"].get(table.name, [])) != [c.name for c in table.columns]:
                    raise SnapshotError(
                        f"snapshot {key}: the columns of table {table.name!r} differ from this "
                        "database's; nothing was imported"
                    )
            _load(conn, path)
            _reset_sequences(conn)
    return SnapshotInfo(
        key, header["created_ms"], header["revision"], trailer["sha256"], size, trailer["rows"]
    )


def _download(store: ObjectStore, key: str, path: Path) -> int:
    """Copy the snapshot to ``path`` in ranged reads; its size."""
    try:
        size = store.stat(key).size
    except ObjectNotFoundError:
        raise SnapshotError(f"snapshot {key} is not in {store.url}") from None
    with path.open("wb") as out:
        for offset in range(0, size, PART_SIZE):
            out.write(store.read_range(key, offset, PART_SIZE))
    return size


def _lines(path: Path) -> Iterator[bytes]:
    with gzip.open(path, "rb") as handle:
        yield from handle


def _verify(path: Path, key: str, expected: str | None) -> tuple[dict, dict]:
    """(header, trailer) of a sound snapshot at this schema revision; SnapshotError else."""
    digest = hashlib.sha256()
    header: dict | None = None
    trailer: dict | None = None
    counts: dict[str, int] = {}
    try:
        for data in _lines(path):
            if trailer is not None:
                raise SnapshotError(f"snapshot {key} is damaged: data after its end line")
            item = json.loads(data)
            if header is None:
                header = item
                if header.get("format") != FORMAT or header.get("format_version") != FORMAT_VERSION:
                    raise SnapshotError(
                        f"snapshot {key} is not a version {FORMAT_VERSION} metadata snapshot"
                    )
            elif item.get("end"):
                trailer = item
                continue
            else:
                table = item["t"]
                width = len(header.get("tables", {}).get(table, ()))
                if len(item["r"]) != width:
                    raise SnapshotError(
                        f"snapshot {key} is damaged: a row of table {table!r} has "
                        f"{len(item['r'])} values, its header names {width} columns"
                    )
                counts[table] = counts.get(table, 0) + 1
            digest.update(data)
    except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"snapshot {key} is damaged: {type(exc).__name__}: {exc}") from None
    if header is None or trailer is None:
        raise SnapshotError(f"snapshot {key} is damaged: it is truncated (no end line)")
    actual = digest.hexdigest()
    if actual != trailer.get("sha256") or (expected and actual != expected):
        raise SnapshotError(
            f"snapshot {key} is damaged: checksum mismatch (sha256 {actual}, recorded "
            f"{expected or trailer.get('sha256')}); nothing was imported"
        )
    if {k: v for k, v in trailer.get("rows", {}).items() if v} != counts:
        raise SnapshotError(f"snapshot {key} is damaged: row counts differ from its end line")
    head = head_revision()
    if header["revision"] != head:
        raise SnapshotError(
            f"snapshot {key} is at schema revision {header['revision']}, this database at "
            f"{head}: restore it with the release that wrote it, then `offloader db upgrade`"
        )
    return header, trailer


def _load(conn: Connection, path: Path) -> None:
    tables = schema.metadata.tables
    batch: list[dict[str, Any]] = []
    current: sa.Table | None = None
    columns: list[str] = []
    for data in _lines(path):
        item = json.loads(data)
        if "t" not in item:
            continue  # header, end line
        table = tables[item["t"]]
        if table is not current or len(batch) >= ROWS_PER_INSERT:
            if batch and current is not None:
                conn.execute(current.insert(), batch)
            batch, current, columns = [], table, [c.name for c in table.columns]
        batch.append(dict(zip(columns, item["r"], strict=True)))
    if batch and current is not None:
        conn.execute(current.insert(), batch)


def _reset_sequences(conn: Connection) -> None:
    """PostgreSQL's serial counters continue after the restored ids (SQLite's do by
    themselves)."""
    if conn.dialect.name != "postgresql":
        return
    for table in schema.metadata.sorted_tables:
        column = table.autoincrement_column
        if column is None:
            continue
        conn.execute(
            sa.text(
                f"SELECT setval(pg_get_serial_sequence(:t, :c), "
                f"COALESCE(MAX({column.name}), 1), MAX({column.name}) IS NOT NULL) "
                f"FROM {table.name}"
            ),
            {"t": table.name, "c": column.name},
        )


def _require_empty(conn: Connection, what: str) -> None:
    filled = {}
    for table in schema.metadata.sorted_tables:
        count = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
        if count:
            filled[table.name] = count
    if filled:
        listed = ", ".join(f"{name} ({n} rows)" for name, n in filled.items())
        raise SnapshotError(
            f"cannot {what}: the metadata database is not empty ({listed}); use a fresh "
            "database (`offloader db upgrade` on an empty one)"
        )


def _is_postgres(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


# --- rebuild -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Found:
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


@dataclass(frozen=True)
class _Piece:
    """One ledger's entries in a segment, as the segment's index states them."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    length: int  # payload bytes
    created_ms: int  # -1: the ledger was open when the segment was closed
    sealed_ms: int


@dataclass(frozen=True)
class _FoundSegment:
    topic: str
    segment_id: str
    data_key: str
    index_key: str
    data_len: int
    pieces: tuple[_Piece, ...]  # ledger ids rising
    offloaded_ms: int

    @property
    def begin(self) -> tuple[int, int]:
        return self.pieces[0].ledger_id, self.pieces[0].first_entry_id

    @property
    def end(self) -> tuple[int, int]:
        return self.pieces[-1].ledger_id, self.pieces[-1].last_entry_id


def rebuild_from_objects(engine: Engine, store: ObjectStore, location: Any) -> RebuildResult:
    """Topics, their offloaded ledgers and streaming segments from the objects of ``store``.

    Each index object (``<uuid>-ledger-<id>-index``) is read; its metadata record gives the
    topic, ledger id, entry count, length and times, and must agree with the object's user
    metadata; its data object must exist with the length the index states. Of several
    complete copies of one ledger the newest is used; the others stay unreferenced, for
    the sweep. Topics get the default policy (policies live only in the metadata).

    Each segment index (``<uuid>-index``, v2) is read the same way and becomes an offloaded
    segment with its ledger ranges (:func:`_stream_rows`). Copies of the same entries are
    resolved as for ledger objects, the newest wins: a segment overlapping a newer one (the
    sources of a rewrite still waiting out their grace, a zombie's copy) is skipped, and a
    ledger whose pieces in the segments tile entries 0..N with no gap becomes a sealed
    ledger offloaded in stream mode with N + 1 entries, unless its own ledger objects are
    newer than those segments (then they are its offload). A segment that no ledger needs
    any more, every ledger it holds having newer objects of its own (released by a
    migration back to v1 and still waiting out its grace), is skipped too. Every copy not
    taken stays unreferenced, for the sweep. Segments are rebuilt with the origin 'stream'
    (the objects do not say who wrote them): the stream then continues after the last of
    them, or at the topic's start without one, and takes only ledgers not yet offloaded.
    Parts are not rebuilt: only open segments need them, and the objects hold only
    completed ones.
    """
    from offloader.gc.sweep import list_objects

    with engine.connect() as conn:
        _require_empty(conn, "rebuild the metadata")
    found: dict[tuple[str, int], _Found] = {}
    segments: list[_FoundSegment] = []
    skipped: list[str] = []
    for page in list_objects(store):
        for info in page:
            modified = int(info.last_modified.timestamp() * 1000) if info.last_modified else 0
            if (segment := _SEGMENT_INDEX_KEY.match(info.key)) is not None:
                try:
                    segments.append(_read_segment(store, info.key, segment.group(1), modified))
                except (FormatError, ObjectNotFoundError, SnapshotError, ValueError) as exc:
                    skipped.append(f"{info.key}: {exc}")
                continue
            match = _INDEX_KEY.match(info.key)
            if match is None:
                continue
            try:
                item = _read_ledger(store, info.key, match.group(1), int(match.group(2)))
            except (FormatError, ObjectNotFoundError, SnapshotError, ValueError) as exc:
                skipped.append(f"{info.key}: {exc}")
                continue
            item = _Found(**{**asdict(item), "offloaded_ms": modified})
            known = found.get((item.topic, item.ledger_id))
            if known is None or known.offloaded_ms < item.offloaded_ms:
                found[(item.topic, item.ledger_id)] = item
    segments = _without_overlaps(segments, skipped)
    with engine.begin() as conn:
        _require_empty(conn, "rebuild the metadata")
        store_id = record_location(conn, location)
        now = db_now_ms(conn)
        streamed = _stream_rows(segments, found, store_id, now, skipped)
        topics = sorted({t for t, _ in found} | {s.topic for s in segments})
        policy = OffloadPolicy().model_dump_json()
        for topic in topics:
            ledgers = [(f.ledger_id, f.created_ms) for (t, _), f in found.items() if t == topic]
            ledgers += [
                (r["ledger_id"], r["created_ms"]) for r in streamed.ledgers if r["topic"] == topic
            ]
            ledgers += [
                (p.ledger_id, s.offloaded_ms)
                for s in segments
                if s.topic == topic
                for p in s.pieces
            ]
            conn.execute(
                schema.topics.insert().values(
                    name=topic,
                    version=1,
                    policy=policy,
                    created_ms=min(created for _, created in ledgers),
                    next_ledger_id=max(ledger_id for ledger_id, _ in ledgers) + 1,
                    writer_epoch=0,
                )
            )
        items = sorted(found.values(), key=lambda f: (f.topic, f.ledger_id))
        for start in range(0, len(items), ROWS_PER_INSERT):
            chunk = items[start : start + ROWS_PER_INSERT]
            conn.execute(schema.ledgers.insert(), [_ledger_row(f, store_id, now) for f in chunk])
            conn.execute(
                schema.offload_attempts.insert(), [_attempt_row(f, store_id) for f in chunk]
            )
        for table, rows in (
            (schema.ledgers, streamed.ledgers),
            (schema.segments, streamed.segments),
            (schema.pieces, streamed.pieces),
        ):
            for start in range(0, len(rows), ROWS_PER_INSERT):
                conn.execute(table.insert(), rows[start : start + ROWS_PER_INSERT])
    return RebuildResult(
        topics,
        len(found) + len(streamed.ledgers),
        skipped,
        segments=len(streamed.segments),
        streamed_ledgers=len(streamed.ledgers),
    )


def _read_segment(
    store: ObjectStore, index_key: str, segment_id: str, modified: int
) -> _FoundSegment:
    """A segment from its v2 index, checked against its user metadata and data object."""
    user = store.stat(index_key).metadata
    index = decode_segment_index(store.get(index_key))
    version = user.get("format-version", str(SEGMENT_FORMAT_VERSION))
    if version != str(SEGMENT_FORMAT_VERSION):
        raise SnapshotError(f"unknown segment object format-version {version!r}")
    from_user = (
        unquote(user.get("managed-ledger", index.topic)),
        user.get("segment-id", segment_id),
    )
    if from_user != (index.topic, segment_id):
        raise SnapshotError(
            f"the index is of topic {index.topic!r}, segment {segment_id} by its key; its user "
            f"metadata says topic {from_user[0]!r}, segment {from_user[1]}"
        )
    data_key = index_key.removesuffix("-index")
    data_len = store.stat(data_key).size
    if data_len != index.data_object_len:
        raise SnapshotError(
            f"data object {data_key} is {data_len} bytes, the index says {index.data_object_len}"
        )
    pieces = []
    for ledger in index.ledgers:
        meta = ledger.metadata
        assert meta is not None  # decode_segment_index always sets it
        pieces.append(
            _Piece(
                meta.ledger_id,
                meta.first_entry_id,
                meta.last_entry_id,
                meta.length,
                meta.created_ms,
                meta.sealed_ms,
            )
        )
    return _FoundSegment(
        index.topic, segment_id, data_key, index_key, data_len, tuple(pieces), modified
    )


def _without_overlaps(segments: list[_FoundSegment], skipped: list[str]) -> list[_FoundSegment]:
    """Per topic, newest first, the segments that overlap no segment already kept (an entry
    has one committed copy); the others are reported as skipped. The kept ones come back
    in stream order."""
    kept: dict[str, list[_FoundSegment]] = {}  # per topic, by begin: disjoint ranges
    for segment in sorted(segments, key=lambda s: (-s.offloaded_ms, s.topic, s.begin)):
        taken = kept.setdefault(segment.topic, [])
        at = bisect.bisect_left([k.begin for k in taken], segment.begin)
        neighbours = taken[max(at - 1, 0) : at + 1]
        clash = next(
            (k for k in neighbours if k.begin <= segment.end and segment.begin <= k.end), None
        )
        if clash is not None:
            skipped.append(
                f"{segment.index_key}: segment of {segment.topic!r} from "
                f"{segment.begin[0]}:{segment.begin[1]} overlaps newer segment "
                f"{clash.segment_id} ({clash.begin[0]}:{clash.begin[1]} to "
                f"{clash.end[0]}:{clash.end[1]})"
            )
            continue
        taken.insert(at, segment)
    return [s for topic in sorted(kept) for s in kept[topic]]


@dataclass
class _StreamRows:
    segments: list[dict[str, Any]]
    pieces: list[dict[str, Any]]  # segment_ledgers
    ledgers: list[dict[str, Any]]  # the ledgers offloaded in stream mode


def _stream_rows(
    segments: list[_FoundSegment],
    found: dict[tuple[str, int], _Found],
    store_id: int,
    now: int,
    skipped: list[str],
) -> _StreamRows:
    """Rows of the segments still needed (in stream order: ``seq`` 1, 2, ... per topic),
    their ledger ranges, and the ledgers they hold whole (entries 0..N, no gap) that have
    no newer ledger objects of their own. A ledger held only in part is reported: the
    stream began after a trim inside it, or a segment is missing; its ranges are kept but
    it gets no row (and the release rules then never release its segments:
    ``SegmentStore._release``).

    A segment is needed while one of its pieces serves a ledger recorded in stream mode or
    a ledger held only in part without objects of its own (never lose data). One whose
    every ledger has newer objects of its own (a migration back to v1 released it and the
    rebuild came before the GC deleted it) is reported and not recorded: recorded, it
    would be referenced forever and its objects never swept. Dropping it cannot move the
    stream back onto data: the next pass starts after the last recorded segment (or at the
    topic's start) but streams only ledgers not offloaded, and every ledger it held is."""
    rows = _StreamRows([], [], [])
    by_ledger: dict[tuple[str, int], list[tuple[_Piece, _FoundSegment]]] = {}
    for s in segments:
        for p in s.pieces:
            by_ledger.setdefault((s.topic, p.ledger_id), []).append((p, s))
    needs: set[tuple[str, int]] = set()  # ledgers whose entries the segments must serve
    for (topic, ledger_id), held in sorted(by_ledger.items()):
        expected = 0
        for piece, _ in held:
            if piece.first_entry_id != expected:
                break
            expected = piece.last_entry_id + 1
        else:
            own = found.get((topic, ledger_id))
            newest = max(s.offloaded_ms for _, s in held)
            if own is not None and own.offloaded_ms >= newest:
                continue  # its newer objects are its offload; kept segments keep its ranges
            if own is not None:  # an older copy: the segments are its offload now
                del found[(topic, ledger_id)]
                skipped.append(
                    f"{own.index_key}: ledger {ledger_id} of {topic!r} is in newer segment(s) "
                    f"{', '.join(sorted({s.segment_id for _, s in held}))}"
                )
            rows.ledgers.append(_streamed_ledger_row(topic, ledger_id, held, now))
            needs.add((topic, ledger_id))
            continue
        if (topic, ledger_id) in found:
            continue  # its ledger objects are its offload; kept segments keep its ranges
        needs.add((topic, ledger_id))  # no other copy is known: keep what there is
        ranges = ", ".join(f"{p.first_entry_id}..{p.last_entry_id}" for p, _ in held)
        skipped.append(
            f"ledger {ledger_id} of {topic!r}: its segments hold entries {ranges}, not 0..N "
            "without a gap: not recorded as offloaded"
        )
    seq: dict[str, int] = {}
    for s in segments:
        if not any((s.topic, p.ledger_id) in needs for p in s.pieces):
            ids = ", ".join(str(p.ledger_id) for p in s.pieces)
            skipped.append(
                f"{s.index_key}: segment {s.segment_id} of {s.topic!r} is needed by no "
                f"ledger: each it holds ({ids}) has newer objects of its own; not recorded, "
                "left for the sweep"
            )
            continue
        seq[s.topic] = seq.get(s.topic, 0) + 1
        rows.segments.append(_segment_row(s, seq[s.topic], store_id))
        rows.pieces += [
            dict(
                segment_id=s.segment_id,
                ledger_id=p.ledger_id,
                topic=s.topic,
                first_entry_id=p.first_entry_id,
                last_entry_id=p.last_entry_id,
            )
            for p in s.pieces
        ]
    return rows


def _segment_row(s: _FoundSegment, seq: int, store_id: int) -> dict[str, Any]:
    return dict(
        segment_id=s.segment_id,
        topic=s.topic,
        seq=seq,
        version=1,
        state=SegmentState.OFFLOADED,
        epoch=0,  # no pass holds the stream yet: the next claim starts at epoch 1
        assigned_ms=s.offloaded_ms,
        offloaded_ms=s.offloaded_ms,
        finished_ms=None,
        detail="rebuilt from the objects",
        begin_ledger_id=s.begin[0],
        begin_entry_id=s.begin[1],
        end_ledger_id=s.end[0],
        end_entry_id=s.end[1],
        planned_end_ledger_id=None,
        planned_end_entry_id=None,
        data_key=s.data_key,
        index_key=s.index_key,
        store_id=store_id,
        upload_id=None,
        data_len=s.data_len,
        replaces=None,
    )


def _streamed_ledger_row(
    topic: str, ledger_id: int, held: list[tuple[_Piece, _FoundSegment]], now: int
) -> dict[str, Any]:
    offloaded = max(s.offloaded_ms for _, s in held)
    created = next((p.created_ms for p, _ in held if p.created_ms >= 0), offloaded)
    sealed = next((p.sealed_ms for p, _ in reversed(held) if p.sealed_ms >= 0), offloaded)
    return dict(
        topic=topic,
        ledger_id=ledger_id,
        version=1,
        state=LedgerState.SEALED,
        entry_count=held[-1][0].last_entry_id + 1,
        size_bytes=sum(p.length for p, _ in held),
        created_ms=created,
        sealed_ms=sealed,
        offload_state=OffloadState.OFFLOADED,
        offload_mode=OffloadMode.STREAM,
        offload_epoch=0,
        attempt_id=None,
        attempt_lease_ms=None,
        offload_uuid=None,  # stream mode: its entries are in segment_ledgers
        data_key=None,
        index_key=None,
        data_len=None,
        offloaded_ms=offloaded,
        hot_state=HotState.DELETED,  # unknown to the objects; reads go to the store
        hot_deleted_ms=now,
        store_id=None,
    )


def _read_ledger(store: ObjectStore, index_key: str, attempt_id: str, ledger_id: int) -> _Found:
    user = store.stat(index_key).metadata
    index = decode_index(store.get(index_key))
    meta = index.metadata
    if meta is None:
        raise SnapshotError("the index holds no ledger metadata (a foreign index)")
    if user.get("format-version", OBJECT_FORMAT_VERSION) != OBJECT_FORMAT_VERSION:
        raise SnapshotError(f"unknown object format-version {user.get('format-version')!r}")
    from_user = (unquote(user.get("managed-ledger", meta.topic)), user.get("ledger-id"))
    if from_user != (meta.topic, str(meta.ledger_id)) or meta.ledger_id != ledger_id:
        raise SnapshotError(
            f"the index says {meta.topic}/{meta.ledger_id}, the key and user metadata say "
            f"{from_user[0]}/{from_user[1] or ledger_id}"
        )
    data_key = index_key.removesuffix("-index")
    data_len = store.stat(data_key).size
    if data_len != index.data_object_len:
        raise SnapshotError(
            f"data object {data_key} is {data_len} bytes, the index says {index.data_object_len}"
        )
    return _Found(
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


def _ledger_row(f: _Found, store_id: int, now: int) -> dict[str, Any]:
    return dict(
        topic=f.topic,
        ledger_id=f.ledger_id,
        version=1,
        state=LedgerState.SEALED,
        entry_count=f.entry_count,
        size_bytes=f.size_bytes,
        created_ms=f.created_ms,
        sealed_ms=f.sealed_ms,
        offload_state=OffloadState.OFFLOADED,
        offload_epoch=1,
        attempt_id=None,
        attempt_lease_ms=None,
        offload_uuid=f.attempt_id,
        data_key=f.data_key,
        index_key=f.index_key,
        data_len=f.data_len,
        offloaded_ms=f.offloaded_ms,
        hot_state=HotState.DELETED,  # unknown to the objects; reads go to the store
        hot_deleted_ms=now,
        store_id=store_id,
    )


def _attempt_row(f: _Found, store_id: int) -> dict[str, Any]:
    return dict(
        attempt_id=f.attempt_id,
        topic=f.topic,
        ledger_id=f.ledger_id,
        epoch=1,
        data_key=f.data_key,
        index_key=f.index_key,
        state=AttemptState.COMMITTED,
        owner="metadata rebuild",
        created_ms=f.offloaded_ms,
        finished_ms=f.offloaded_ms,
        detail="rebuilt from the objects",
        store_id=store_id,
    )


__all__ = [
    "MANIFEST_KEY",
    "SNAPSHOT_PREFIX",
    "ExportResult",
    "RebuildResult",
    "SnapshotError",
    "SnapshotInfo",
    "export_from",
    "export_snapshot",
    "import_snapshot",
    "latest_snapshot",
    "read_manifest",
    "rebuild_from_objects",
]

"""Metadata snapshots (PDP-34's metadata export): export to the object store, restore.

``export_snapshot`` writes every table of ``schema.metadata`` (generically: tables other
releases add are included) as one gzip'd JSON-lines object under ``_metadata/snapshots/``,
with the format version, the Alembic revision and a SHA-256 over its lines; docs/FORMAT.md
describes it. A snapshot becomes visible only when the manifest (``_metadata/snapshots/
manifest.json``) names it, and the manifest is written after the snapshot is complete, so
an export killed half-way never turns into the "latest". The manifest keeps the last
``metadata_snapshots_keep``; older snapshots go through the deletion queue (invariant 5).
The manifest, not a LIST, is how a restore finds snapshots: only the sweep lists.

``import_snapshot`` restores one into an empty database at the same revision, checking the
checksum before it writes anything, all in one transaction. The last resort without a
snapshot, rebuilding from the objects themselves, is ``offloader/recovery/``.

Tables are exported generically, so the streaming tables (``streams``, ``segments``,
``segment_parts``, ``segment_ledgers``) and ``ledgers.offload_mode`` round-trip like the rest.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import tempfile
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from offloader import failpoints
from offloader.exceptions import ObjectNotFoundError, OffloaderError
from offloader.keys import MANIFEST_KEY, snapshot_key
from offloader.metadata import schema
from offloader.metadata.clock import db_now_ms
from offloader.metadata.migrate import head_revision
from offloader.objectstore import ObjectStore, PartInfo
from offloader.results import fields_json

log = logging.getLogger(__name__)

FORMAT = "offloader-metadata-snapshot"
FORMAT_VERSION = 1
ROWS_PER_INSERT = 1000
PART_SIZE = 16 * 1024 * 1024  # multipart above this (S3's minimum part is 5 MiB)


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

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        """What `offloader metadata import` says it imported."""
        rows = sum(self.rows.values())
        return f"{self.key} ({rows} rows, revision {self.revision}, sha256 {self.sha256})"


@dataclass(frozen=True)
class ExportResult:
    """The snapshot written, and the older ones kept or retired by the export."""

    snapshot: SnapshotInfo
    kept: list[str]
    retired: list[str]  # queued for deletion

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        s = self.snapshot
        text = f"wrote {s.key} ({s.bytes} bytes, sha256 {s.sha256}, revision {s.revision})"
        if self.retired:
            text += f"; queued {len(self.retired)} older snapshot(s) for deletion"
        return text


# --- the manifest --------------------------------------------------------------------------
def read_manifest(store: ObjectStore) -> list[SnapshotInfo]:
    """The snapshots the manifest names, oldest first; ObjectNotFoundError without one."""
    data = store.get(MANIFEST_KEY)
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8 (both ValueErrors)
        raise SnapshotError(f"{MANIFEST_KEY} is damaged: not JSON ({exc})") from None
    if (
        not isinstance(raw, dict)
        or raw.get("format") != FORMAT
        or raw.get("format_version") != FORMAT_VERSION
    ):
        raise SnapshotError(f"{MANIFEST_KEY}: not a version {FORMAT_VERSION} snapshot manifest")
    items = raw.get("snapshots")
    if not isinstance(items, list):
        raise SnapshotError(f"{MANIFEST_KEY} is damaged: 'snapshots' is not a list")
    return [_manifest_entry(item, n) for n, item in enumerate(items)]


_ENTRY_TYPES: dict[str, type] = {
    "key": str,
    "created_ms": int,
    "revision": str,
    "sha256": str,
    "bytes": int,
    "rows": dict,
}


def _manifest_entry(item: object, n: int) -> SnapshotInfo:
    """Manifest entry ``n`` as written by :func:`_write_manifest`; SnapshotError naming
    what is wrong else."""
    where = f"{MANIFEST_KEY} is damaged: snapshot entry {n}"
    if not isinstance(item, dict) or set(item) != set(_ENTRY_TYPES):
        raise SnapshotError(f"{where} does not have exactly the fields {sorted(_ENTRY_TYPES)}")
    for name, kind in _ENTRY_TYPES.items():
        value = item[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise SnapshotError(f"{where}: {name} is not a {kind.__name__}")
    if not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in item["rows"].items()
    ):
        raise SnapshotError(f"{where}: rows is not a table name -> count object")
    return SnapshotInfo(**item)


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
        key = snapshot_key(created_ms, str(uuid.uuid4()))
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
        parts: list[PartInfo] = []
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
            require_empty(conn, "import a snapshot")
            unknown = sorted(set(header["tables"]) - set(schema.metadata.tables))
            if unknown:
                raise SnapshotError(
                    f"snapshot {key}: tables {unknown} are not in this database's schema; "
                    "nothing was imported"
                )
            for table in schema.metadata.sorted_tables:
                if list(header["tables"].get(table.name, [])) != [c.name for c in table.columns]:
                    raise SnapshotError(
                        f"snapshot {key}: the columns of table {table.name!r} differ from this "
                        "database's; nothing was imported"
                    )
            _load(conn, path)
            _reset_sequences(conn)
    return SnapshotInfo(
        key,
        header["created_ms"],
        header["revision"],
        trailer["sha256"],
        size,
        trailer.get("rows", {}),
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
                if table not in header.get("tables", {}):
                    raise SnapshotError(
                        f"snapshot {key} is damaged: a row of table {table!r}, which its "
                        "header does not name"
                    )
                width = len(header["tables"][table])
                if len(item["r"]) != width:
                    raise SnapshotError(
                        f"snapshot {key} is damaged: a row of table {table!r} has "
                        f"{len(item['r'])} values, its header names {width} columns"
                    )
                counts[table] = counts.get(table, 0) + 1
            digest.update(data)
    except (
        OSError,
        EOFError,
        zlib.error,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        RecursionError,
    ) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"snapshot {key} is damaged: {type(exc).__name__}: {exc}") from None
    if header is None or trailer is None:
        raise SnapshotError(f"snapshot {key} is damaged: it is truncated (no end line)")
    _check_ends(header, trailer, key)
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


def _check_ends(header: dict, trailer: dict, key: str) -> None:
    """The fields an import reads from the header and end lines have the types the export
    writes (a checksum proves the lines arrived whole, not that they were written by us)."""
    wrong = [
        name
        for name, ok in (
            ("revision", isinstance(header.get("revision"), str)),
            ("created_ms", type(header.get("created_ms")) is int),
            ("tables", _is_table_columns(header.get("tables"))),
            ("sha256", isinstance(trailer.get("sha256"), str)),
            ("rows", _is_row_counts(trailer.get("rows", {}))),
        )
        if not ok
    ]
    if wrong:
        raise SnapshotError(f"snapshot {key} is damaged: bad {', '.join(wrong)} in its ends")


def _is_table_columns(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(cols, list) and all(isinstance(c, str) for c in cols) for cols in value.values()
    )


def _is_row_counts(value: object) -> bool:
    return isinstance(value, dict) and all(type(n) is int for n in value.values())


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


def require_empty(conn: Connection, what: str) -> None:
    """SnapshotError naming every table with rows unless the database is empty: a restore
    (or a rebuild, recovery/) only ever fills a fresh one."""
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


__all__ = [
    "ExportResult",
    "SnapshotError",
    "SnapshotInfo",
    "export_snapshot",
    "import_snapshot",
    "latest_snapshot",
    "read_manifest",
    "require_empty",
]

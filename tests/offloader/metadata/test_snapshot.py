"""Metadata snapshots on both pairings: export, wipe the database, import, every ledger reads
back identical; refusals (damaged or foreign snapshot) change nothing; an export killed
before its manifest never becomes the latest."""

from __future__ import annotations

import gzip
import hashlib
import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from fixtures.backends import Fresh, produce_ledgers, tiered_digests
from fixtures.cli import spawn_cli
from fixtures.databases import sqlite_url
from fixtures.inspect import table_rows
from fixtures.metadata import pending_deletions
from fixtures.metadata_backup import populate_ledgers
from offloader.exceptions import ObjectStoreError
from offloader.gc.deletion_queue import process_deletions
from offloader.keys import MANIFEST_KEY
from offloader.metadata import schema, snapshot
from offloader.metadata.migrate import head_revision
from offloader.metadata.snapshot import (
    SnapshotError,
    export_snapshot,
    import_snapshot,
    latest_snapshot,
    read_manifest,
)
from offloader.objectstore import MultipartUpload, PartInfo
from offloader.read.topic_reader import TopicReader
from offloader.runtime import Runtime, export_metadata
from offloader.settings import Settings


@pytest.fixture
def populated(runtime: Runtime) -> Runtime:
    """Two topics: offloaded ledgers (some hot copies deleted), a hot one, a queued key."""
    return populate_ledgers(runtime)


def test_export_wipe_import_reads_back_identical(populated: Runtime, fresh: Fresh) -> None:
    rt = populated
    checksums = {t: TopicReader(rt).checksum(t) for t in ("orders", "päyments/eu")}
    digests = tiered_digests(rt)
    rows = table_rows(rt.metadata)
    exported = export_metadata(rt)
    assert latest_snapshot(rt.objects) == exported.snapshot
    assert exported.snapshot.rows["ledgers"] == 5

    restored = fresh()
    info = import_snapshot(restored.metadata.engine, restored.objects, None)
    assert info == exported.snapshot
    assert table_rows(restored.metadata) == rows
    assert tiered_digests(restored) == digests
    for topic, checksum in checksums.items():
        assert TopicReader(restored).checksum(topic) == checksum
    # the restored database goes on working: new ids continue after the restored ones
    restored.metadata.deletions.enqueue(["after-restore"], "t", store_id=1)
    ids = [d.id for d in pending_deletions(restored.metadata)]
    assert len(set(ids)) == len(ids) == 2
    produce_ledgers(restored, "orders", [(3, 10)])
    assert max(x.ledger_id for x in restored.metadata.list_ledgers("orders")) == 4


def _rewrite(rt: Runtime, key: str, edit: Callable[[list[bytes]], list[bytes]]) -> str:
    """A copy of snapshot ``key`` with its lines edited (checksum recomputed when the edit
    keeps the end line's sha256 field out of its hands)."""
    lines = gzip.decompress(rt.objects.get(key)).splitlines(keepends=True)
    new_key = f"_metadata/snapshots/edited-{uuid.uuid4()}.jsonl.gz"
    rt.objects.put(new_key, gzip.compress(b"".join(edit(lines))))
    return new_key


def _resealed(lines: list[bytes]) -> list[bytes]:
    body = lines[:-1]
    end = json.loads(lines[-1])
    end["sha256"] = hashlib.sha256(b"".join(body)).hexdigest()
    return [*body, json.dumps(end).encode() + b"\n"]


def test_damaged_or_foreign_snapshots_are_refused(populated: Runtime, fresh: Fresh) -> None:
    rt = populated
    key = export_metadata(rt).snapshot.key
    raw = rt.objects.get(key)
    flipped = f"_metadata/snapshots/flipped-{uuid.uuid4()}.jsonl.gz"
    rt.objects.put(flipped, raw[:40] + bytes([raw[40] ^ 0xFF]) + raw[41:])

    def tamper(lines: list[bytes]) -> list[bytes]:
        at = next(n for n, line in enumerate(lines) if b'"t":"ledgers"' in line)
        return [*lines[:at], lines[at].replace(b"orders", b"orderz"), *lines[at + 1 :]]

    def other_revision(lines: list[bytes]) -> list[bytes]:
        header = json.loads(lines[0])
        header["revision"] = "0001"
        return _resealed([json.dumps(header).encode() + b"\n", *lines[1:]])

    def fewer_columns(lines: list[bytes]) -> list[bytes]:
        """A hand-made snapshot at this revision whose ledgers lack their last column."""
        header, *rows = (json.loads(line) for line in lines[:-1])
        header["tables"]["ledgers"].pop()
        for row in rows:
            if row["t"] == "ledgers":
                row["r"].pop()
        return _resealed([*(json.dumps(x).encode() + b"\n" for x in (header, *rows)), lines[-1]])

    cases = {
        _rewrite(rt, key, fewer_columns): (
            "the columns of table 'ledgers' differ from this database's; nothing was imported$"
        ),
        flipped: "is damaged",
        _rewrite(rt, key, tamper): "checksum mismatch",
        _rewrite(rt, key, lambda lines: lines[:-1]): "truncated",
        _rewrite(rt, key, other_revision): "schema revision 0001",
        "_metadata/snapshots/nothing-here.jsonl.gz": "is not in",
    }
    target = fresh()
    for bad, message in cases.items():
        with pytest.raises(SnapshotError, match=message):
            import_snapshot(target.metadata.engine, target.objects, bad)
        assert all(not rows for rows in table_rows(target.metadata).values())
    assert import_snapshot(target.metadata.engine, target.objects, key).key == key


def test_the_cli_names_a_damaged_snapshot_in_one_line(populated: Runtime, fresh: Fresh) -> None:
    rt = populated
    raw = rt.objects.get(export_metadata(rt).snapshot.key)
    flipped = f"_metadata/snapshots/flipped-{uuid.uuid4()}.jsonl.gz"
    rt.objects.put(flipped, raw[:40] + bytes([raw[40] ^ 0xFF]) + raw[41:])
    target = fresh()
    proc = spawn_cli(target.settings, "metadata", "import", "--snapshot", flipped)
    _, err = proc.communicate(timeout=120)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "is damaged" in lines[0]
    assert all(not rows for rows in table_rows(target.metadata).values())


def test_an_export_killed_before_its_manifest_never_becomes_the_latest(
    populated: Runtime, fresh: Fresh
) -> None:
    rt = populated
    first = export_metadata(rt).snapshot
    rt.metadata.deletions.enqueue(["after-first"], "t", store_id=rt.stores.default_id())
    proc = spawn_cli(rt.settings, "metadata", "export", failpoints="after-snapshot-upload")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert [s.key for s in read_manifest(rt.objects)] == [first.key]
    written = {o.key for o in rt.objects.list("_metadata/snapshots/")}
    assert len(written) == 3  # manifest, first, the killed export's complete object

    target = fresh()
    assert import_snapshot(target.metadata.engine, target.objects, "latest").key == first.key
    queued = {d.object_key for d in pending_deletions(target.metadata)}
    assert "after-first" not in queued  # the state of the first snapshot, not the killed one

    # a rerun converges: a new latest; the killed one is left for the sweep (unreferenced)
    proc = spawn_cli(rt.settings, "metadata", "export", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["kept"][0] == first.key
    assert latest_snapshot(rt.objects).key == json.loads(out)["snapshot"]["key"]


def test_only_the_newest_snapshots_are_kept(backend_settings: Settings) -> None:
    settings = backend_settings.model_copy(update={"metadata_snapshots_keep": 2})
    with Runtime.open(settings) as rt:
        results = [export_metadata(rt) for _ in range(4)]
        keys = [r.snapshot.key for r in results]
        assert [(r.kept, r.retired) for r in results] == [
            (keys[:1], []),
            (keys[:2], []),
            (keys[1:3], keys[:1]),
            (keys[2:4], keys[1:2]),
        ]
        assert [s.key for s in read_manifest(rt.objects)] == keys[2:]
        assert sorted(
            (d.object_key, d.reason, d.store_id) for d in pending_deletions(rt.metadata)
        ) == sorted(
            (key, "metadata snapshot beyond the kept ones", rt.stores.default_id())
            for key in keys[:2]
        )
        process_deletions(rt.metadata, rt.stores, rt.settings)
        assert {o.key for o in rt.objects.list("_metadata/snapshots/2")} == set(keys[2:])


def test_each_snapshot_refusal_word_for_word(populated: Runtime, fresh: Fresh) -> None:
    """The message of every refusal, and that each one imports nothing."""
    rt = populated
    target = fresh()
    with pytest.raises(SnapshotError) as no_manifest:
        import_snapshot(target.metadata.engine, target.objects, None)
    assert str(no_manifest.value) == (
        f"no metadata snapshot in {rt.objects.url} (_metadata/snapshots/manifest.json names "
        "none): run `offloader metadata export`, or `offloader metadata rebuild` without one"
    )
    key = export_metadata(rt).snapshot.key
    lines = gzip.decompress(rt.objects.get(key)).splitlines(keepends=True)
    body_sha = hashlib.sha256(b"".join(lines[:-1])).hexdigest()

    def header(edit: Callable[[dict], object]) -> Callable[[list[bytes]], list[bytes]]:
        def rewrite(lines: list[bytes]) -> list[bytes]:
            item = json.loads(lines[0])
            edit(item)
            return _resealed([json.dumps(item).encode() + b"\n", *lines[1:]])

        return rewrite

    def end(edit: Callable[[dict], object]) -> Callable[[list[bytes]], list[bytes]]:
        def rewrite(lines: list[bytes]) -> list[bytes]:
            item = json.loads(lines[-1])
            edit(item)
            return [*lines[:-1], json.dumps(item).encode() + b"\n"]

        return rewrite

    def tamper(lines: list[bytes]) -> list[bytes]:
        return [lines[0], lines[1].replace(b"[", b"[ ", 1), *lines[2:]]

    tampered = _rewrite(rt, key, tamper)
    tampered_sha = hashlib.sha256(b"".join(tamper(lines)[:-1])).hexdigest()
    damaged = "snapshot {} is damaged: "
    cases = {
        _rewrite(rt, key, lambda ls: [*ls, ls[1]]): damaged + "data after its end line",
        _rewrite(rt, key, header(lambda h: h.update(format="other"))): (
            "snapshot {} is not a version 1 metadata snapshot"
        ),
        _rewrite(rt, key, lambda ls: _resealed([ls[0], b"not json\n", *ls[1:]])): (
            damaged + "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
        ),
        _rewrite(rt, key, lambda ls: ls[:-1]): damaged + "it is truncated (no end line)",
        tampered: damaged + f"checksum mismatch (sha256 {tampered_sha}, recorded {body_sha}); "
        "nothing was imported",
        _rewrite(rt, key, end(lambda e: e.pop("rows"))): (
            damaged + "row counts differ from its end line"
        ),
        _rewrite(rt, key, header(lambda h: h.update(revision="0001"))): (
            f"snapshot {{}} is at schema revision 0001, this database at {head_revision()}: "
            "restore it with the release that wrote it, then `offloader db upgrade`"
        ),
        _rewrite(rt, key, header(lambda h: h["tables"].pop("stream_cuts"))): (
            "snapshot {}: the columns of table 'stream_cuts' differ from this database's; "
            "nothing was imported"
        ),
        "_metadata/snapshots/nothing-here.jsonl.gz": f"snapshot {{}} is not in {rt.objects.url}",
    }
    for bad, message in cases.items():
        with pytest.raises(SnapshotError) as refused:
            import_snapshot(target.metadata.engine, target.objects, bad)
        assert str(refused.value) == message.format(bad)
        assert all(not rows for rows in table_rows(target.metadata).values())

    # the manifest's checksum is checked too when the latest is imported
    manifest = json.loads(rt.objects.get(MANIFEST_KEY))
    manifest["snapshots"][-1]["sha256"] = "0" * 64
    rt.objects.put(MANIFEST_KEY, json.dumps(manifest).encode())
    with pytest.raises(SnapshotError) as refused:
        import_snapshot(target.metadata.engine, target.objects, "latest")
    assert str(refused.value) == (
        f"snapshot {key} is damaged: checksum mismatch (sha256 {body_sha}, recorded "
        f"{'0' * 64}); nothing was imported"
    )
    assert all(not rows for rows in table_rows(target.metadata).values())


def test_a_row_of_the_wrong_width_is_refused(populated: Runtime, fresh: Fresh) -> None:
    """A sealed snapshot whose row has a value too few (a writer's bug: its checksum is
    right) is refused before anything is loaded, naming the table."""
    rt = populated
    key = export_metadata(rt).snapshot.key

    def narrow(lines: list[bytes]) -> list[bytes]:
        at = next(n for n, line in enumerate(lines) if b'"t":"ledgers"' in line)
        item = json.loads(lines[at])
        item["r"] = item["r"][:-1]
        return _resealed([*lines[:at], json.dumps(item).encode() + b"\n", *lines[at + 1 :]])

    target = fresh()
    message = r"is damaged: a row of table 'ledgers' has \d+ values, its header names \d+ columns$"
    with pytest.raises(SnapshotError, match=message):
        import_snapshot(target.metadata.engine, target.objects, _rewrite(rt, key, narrow))
    assert all(not rows for rows in table_rows(target.metadata).values())


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode() + b"\n"


@pytest.fixture
def away_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone 3.5 hours behind UTC: UTC stamps must not follow it."""
    monkeypatch.setenv("TZ", "America/St_Johns")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_an_export_writes_the_documented_snapshot(
    populated: Runtime, away_from_utc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FORMAT.md's snapshot byte for byte: key (in UTC), gzip header, lines, end line,
    user metadata, manifest; a snapshot below the part size goes up in one PUT."""
    rt = populated
    rows = table_rows(rt.metadata)
    parts: list[int] = []
    upload_part = rt.objects.upload_part
    monkeypatch.setattr(
        rt.objects, "upload_part", lambda u, n, data: parts.append(n) or upload_part(u, n, data)
    )
    before = rt.metadata.db_now_ms()
    exported = export_metadata(rt)
    after = rt.metadata.db_now_ms()
    assert parts == []
    info = exported.snapshot
    assert (exported.kept, exported.retired) == ([info.key], [])
    assert before <= info.created_ms <= after
    stamp = datetime.fromtimestamp(info.created_ms / 1000, UTC)
    prefix = f"_metadata/snapshots/{stamp:%Y%m%dT%H%M%S}{info.created_ms % 1000:03d}Z-"
    assert info.key.startswith(prefix) and info.key.endswith(".jsonl.gz")
    assert str(uuid.UUID(info.key[len(prefix) : -len(".jsonl.gz")])) in info.key
    assert info.revision == head_revision()
    assert info.rows == {name: len(r) for name, r in rows.items()}

    raw = rt.objects.get(info.key)
    assert info.bytes == len(raw)
    assert raw[4:8] == b"\0\0\0\0"  # gzip mtime 0: the same rows give the same bytes
    assert dict(rt.objects.stat(info.key).metadata) == {
        "sha256": info.sha256,
        "revision": info.revision,
    }
    lines = gzip.decompress(raw).splitlines(keepends=True)
    tables = schema.metadata.sorted_tables
    assert lines[0] == _compact(
        {
            "format": "offloader-metadata-snapshot",
            "format_version": 1,
            "revision": info.revision,
            "created_ms": info.created_ms,
            "tables": {t.name: [c.name for c in t.columns] for t in tables},
        }
    )
    body = [json.loads(line) for line in lines[1:-1]]
    assert [_compact(item) for item in body] == lines[1:-1]
    # tables parents first, each in primary-key order
    expected = []
    for t in tables:
        key = [list(t.columns).index(c) for c in t.primary_key.columns]
        expected += sorted(
            ({"t": t.name, "r": list(r)} for r in rows[t.name]),
            key=lambda item: [item["r"][k] for k in key],
        )
    assert body == json.loads(json.dumps(expected))
    assert info.sha256 == hashlib.sha256(b"".join(lines[:-1])).hexdigest()
    assert (
        lines[-1]
        == json.dumps({"end": True, "rows": info.rows, "sha256": info.sha256}).encode() + b"\n"
    )

    manifest = {
        "format": "offloader-metadata-snapshot",
        "format_version": 1,
        "snapshots": [asdict(info)],
    }
    assert rt.objects.get(MANIFEST_KEY) == json.dumps(manifest, indent=1, sort_keys=True).encode()
    assert read_manifest(rt.objects) == [info]


def test_a_foreign_manifest_is_refused(runtime: Runtime) -> None:
    rt = runtime
    for body in (
        {"format": "other", "format_version": 1, "snapshots": []},
        {"format": "offloader-metadata-snapshot", "format_version": 2, "snapshots": []},
    ):
        rt.objects.put(MANIFEST_KEY, json.dumps(body).encode())
        with pytest.raises(SnapshotError) as refused:
            latest_snapshot(rt.objects)
        assert str(refused.value) == (
            "_metadata/snapshots/manifest.json: not a version 1 snapshot manifest"
        )


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_a_snapshot_above_the_part_size_goes_in_parts(
    populated: Runtime, fresh: Fresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fs only: parts of 500 bytes (S3's smallest part is 5 MiB, a snapshot that big
    takes minutes to make). Uploaded in parts, read back in ranges, restored identical; a
    failed part leaves no upload behind and no snapshot."""
    rt = populated
    monkeypatch.setattr(snapshot, "PART_SIZE", 500)
    uploaded: list[int] = []
    upload_part = rt.objects.upload_part

    def counting(upload: MultipartUpload, number: int, data: bytes) -> PartInfo:
        uploaded.append(len(data))
        return upload_part(upload, number, data)

    monkeypatch.setattr(rt.objects, "upload_part", counting)
    info = export_metadata(rt).snapshot
    assert (
        info.bytes > 1000
        and uploaded == [500] * (info.bytes // 500) + [info.bytes % 500][: info.bytes % 500]
    )
    assert dict(rt.objects.stat(info.key).metadata) == {
        "sha256": info.sha256,
        "revision": info.revision,
    }
    rows = table_rows(rt.metadata)
    target = fresh()
    assert import_snapshot(target.metadata.engine, target.objects, None) == info
    assert table_rows(target.metadata) == rows

    def failing(upload: MultipartUpload, number: int, data: bytes) -> PartInfo:
        if number == 2:
            raise ObjectStoreError("part 2 lost")
        return upload_part(upload, number, data)

    monkeypatch.setattr(rt.objects, "upload_part", failing)
    with pytest.raises(ObjectStoreError, match="part 2 lost"):
        export_metadata(rt)
    assert list(rt.objects.list_multipart_uploads()) == []
    assert read_manifest(rt.objects) == [info]


def test_an_export_of_a_database_without_schema_is_refused(
    runtime: Runtime, tmp_path: Path
) -> None:
    (tmp_path / "bare").mkdir()
    engine = sa.create_engine(sqlite_url(tmp_path / "bare"))
    try:
        with pytest.raises(SnapshotError) as refused:
            export_snapshot(engine, runtime.objects, 1, 1)
    finally:
        engine.dispose()
    assert str(refused.value) == "the metadata database has no schema: run `offloader db upgrade`"
    assert [o.key for o in runtime.objects.list("_metadata/")] == []

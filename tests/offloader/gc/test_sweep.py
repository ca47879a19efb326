"""The orphan sweep on both pairings: planted objects are found by ``scan`` and queued by the
sweep only past the grace period (database clock), live attempts' objects and parts are
never touched, snapshots survive, and a sweep killed after queueing converges on rerun."""

from __future__ import annotations

import json
import logging
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest

from fixtures.backends import make_topic, produce_ledgers, tiered_digests, unaccounted_objects
from fixtures.cli import spawn_cli
from fixtures.clock import HOUR, skew_worker_clock, stopped_sqlite_clock
from fixtures.inspect import queued, stored_keys
from fixtures.metadata import pending_deletions
from offloader.exceptions import StoreUnavailableError
from offloader.gc.deletion_queue import process_deletions
from offloader.gc.sweep import (
    ORPHAN_REASON,
    Orphan,
    StaleUpload,
    StoreSweep,
    SweepResult,
    sweep,
)
from offloader.keys import MANIFEST_KEY, ledger_object_keys, segment_object_keys
from offloader.metadata import Attempt, Ledger, Position
from offloader.metadata.snapshot import read_manifest
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import TopicReader
from offloader.runtime import Runtime, export_metadata
from offloader.settings import Settings

GRACE = 2.0


def _open(settings: Settings, **changes: object) -> Runtime:
    return Runtime.open(settings.model_copy(update=changes))


@pytest.fixture
def swept(backend_settings: Settings) -> Iterator[Runtime]:
    """A runtime with a short grace period and upload age, and an offloaded topic."""
    with _open(backend_settings, sweep_grace_seconds=GRACE, multipart_max_age_seconds=GRACE) as rt:
        make_topic(rt)
        produce_ledgers(rt, "orders", [(20, 3000), (5, 100), (30, 2000), (8, 500)])
        LedgerOffloader(rt).offload_topic("orders", up_to=3)
        yield rt


def plant(rt: Runtime, count: int) -> dict[str, int]:
    """Objects written straight into the store, as a crash or a stray tool leaves them."""
    planted = {}
    for n in range(count):
        data_key, _ = ledger_object_keys(str(uuid.uuid4()), 100 + n)
        body = b"x" * (10 + n)
        rt.objects.put(data_key, body)
        planted[data_key] = len(body)
    return planted


def begin(rt: Runtime, ledger: Ledger, lease_ms: int, attempt_id: str | None = None) -> Attempt:
    """An attempt on ``ledger`` as a worker records it, its lease ``lease_ms`` from now."""
    attempt_id = attempt_id or str(uuid.uuid4())
    data_key, index_key = ledger_object_keys(attempt_id, ledger.ledger_id)
    _, attempt = rt.metadata.attempts.begin(
        ledger, attempt_id, data_key, index_key, "test", lease_ms, store_id=rt.stores.default_id()
    )
    return attempt


def test_planted_objects_are_swept_only_after_the_grace_period(
    swept: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = swept
    before = TopicReader(rt).checksum("orders")
    offloaded = tiered_digests(rt)
    assert len(offloaded) == 3
    planted = plant(rt, 3)
    # a worker clock a day ahead changes nothing: ages are on the database's clock
    skew_worker_clock(monkeypatch, 24 * HOUR)
    young = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    (store,) = young.stores
    assert (store.orphans, store.young) == (0, 3)
    assert sweep(rt.metadata, rt.stores, rt.settings).orphans == 0
    assert queued(rt.metadata) == {}

    time.sleep(GRACE + 1.5)
    scan = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    (store,) = scan.stores
    assert {o.key: o.size for o in store.objects} == planted
    assert all(o.age_seconds >= GRACE for o in store.objects)
    assert store.orphan_bytes == sum(planted.values())
    assert store.referenced == store.listed - 3
    assert queued(rt.metadata) == {} and planted.keys() <= stored_keys(
        rt.objects
    )  # a scan changes nothing

    done = sweep(rt.metadata, rt.stores, rt.settings)
    assert done.stores[0].queued == 3
    assert queued(rt.metadata) == dict.fromkeys(planted, ORPHAN_REASON)
    again = sweep(rt.metadata, rt.stores, rt.settings)  # queued once is enough
    assert again.orphans == 0 and len(pending_deletions(rt.metadata)) == 3

    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert not planted.keys() & stored_keys(rt.objects)
    assert unaccounted_objects(rt) == set()
    assert TopicReader(rt).checksum("orders") == before
    assert tiered_digests(rt) == offloaded


def test_keys_the_offloader_does_not_write_are_never_touched(swept: Runtime) -> None:
    """A shared bucket, or a store recorded inside another (``s3://b`` and
    ``s3://b/tiered``): listing the outer one shows the inner one's keys under its prefix,
    unreferenced by bare key. Old as they are, the sweep leaves them and their uploads."""
    rt = swept
    nested, _ = ledger_object_keys(str(uuid.uuid4()), 5)
    foreign = [f"tiered/{nested}", "other-tool/report.csv", "_metadata/notes.txt"]
    for key in foreign:
        rt.objects.put(key, b"not ours to delete")
    upload = rt.objects.create_multipart(f"tiered/{nested}-index")
    rt.objects.upload_part(upload, 1, b"the nested store's part")
    planted = plant(rt, 1)  # one real orphan beside them
    time.sleep(GRACE + 1.5)

    scan = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    (store,) = scan.stores
    assert store.foreign == 3 and [o.key for o in store.objects] == list(planted)
    assert store.uploads == []
    assert "foreign 3" in str(scan)

    done = sweep(rt.metadata, rt.stores, rt.settings)
    assert (done.stores[0].queued, done.stores[0].aborted_uploads) == (1, 0)
    assert queued(rt.metadata) == dict.fromkeys(planted, ORPHAN_REASON)
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert set(foreign) <= stored_keys(rt.objects) and not planted.keys() & stored_keys(rt.objects)
    assert upload.upload_id in {u.upload_id for u in rt.objects.list_multipart_uploads()}
    rt.objects.abort_multipart(upload)


def test_a_live_attempts_objects_and_parts_are_never_touched(swept: Runtime) -> None:
    rt = swept
    sealed = [x for x in rt.metadata.list_ledgers("orders") if not x.is_offloaded]
    ledger = sealed[0]
    live = begin(rt, ledger, lease_ms=3_600_000)
    rt.objects.put(live.index_key, b"index of a live attempt")
    live_upload = rt.objects.create_multipart(live.data_key)
    rt.objects.upload_part(live_upload, 1, b"first part")
    stray_upload = rt.objects.create_multipart(f"{uuid.uuid4()}-ledger-77")
    rt.objects.upload_part(stray_upload, 1, b"nobody's part")
    time.sleep(GRACE + 1.5)

    scan = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    (store,) = scan.stores
    assert [u.key for u in store.uploads] == [stray_upload.key]
    assert live.index_key not in {o.key for o in store.objects}

    done = sweep(rt.metadata, rt.stores, rt.settings)
    assert done.stores[0].aborted_uploads == 1
    uploads = {u.upload_id for u in rt.objects.list_multipart_uploads()}
    assert uploads == {live_upload.upload_id}
    assert live.index_key in stored_keys(rt.objects) and live.index_key not in queued(rt.metadata)
    # the live attempt can still finish its upload
    part = rt.objects.upload_part(live_upload, 2, b"second part")
    assert part.part_number == 2


def test_a_late_write_of_a_retired_attempt_is_swept(swept: Runtime) -> None:
    """A superseded attempt queued its keys; an object of it written after the queue ran
    (a zombie) is referenced by nothing alive, so the sweep queues it again."""
    rt = swept
    ledger = next(x for x in rt.metadata.list_ledgers("orders") if not x.is_offloaded)
    store_id = rt.stores.default_id()
    old_id = str(uuid.uuid4())
    old_keys = ledger_object_keys(old_id, ledger.ledger_id)
    ledger, _ = rt.metadata.attempts.begin(
        ledger, old_id, *old_keys, "zombie", 1, store_id=store_id
    )
    time.sleep(0.05)
    new_id = str(uuid.uuid4())
    rt.metadata.attempts.begin(
        ledger, new_id, *ledger_object_keys(new_id, ledger.ledger_id), "t", 60_000,
        store_id=store_id,
    )  # fmt: skip
    process_deletions(rt.metadata, rt.stores, rt.settings)
    for key in old_keys:
        rt.objects.put(key, b"written by the zombie after its keys were deleted")
    time.sleep(GRACE + 1.5)
    sweep(rt.metadata, rt.stores, rt.settings)
    assert queued(rt.metadata) == dict.fromkeys(old_keys, ORPHAN_REASON)


def test_snapshots_survive_the_sweep_and_a_stray_one_does_not(swept: Runtime) -> None:
    rt = swept
    first = export_metadata(rt).snapshot
    second = export_metadata(rt).snapshot
    stray = "_metadata/snapshots/20000101T000000000Z-stray.jsonl.gz"
    rt.objects.put(stray, b"left by an export killed before its manifest")
    time.sleep(GRACE + 1.5)
    sweep(rt.metadata, rt.stores, rt.settings)
    assert queued(rt.metadata) == {stray: ORPHAN_REASON}
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert {first.key, second.key, MANIFEST_KEY} <= stored_keys(rt.objects)
    assert stray not in stored_keys(rt.objects)
    assert [s.key for s in read_manifest(rt.objects)] == [first.key, second.key]


def test_a_lookup_answers_for_the_keys_asked_and_only_those(swept: Runtime) -> None:
    """One page's lookup finds each kind of reference (an offloaded ledger's keys, an attempt
    in flight, an assigned segment, a pending deletion) and returns nothing it was not
    asked about: a page's answer stays a page long, however much the metadata holds."""
    rt = swept
    store_id = rt.stores.default_id()
    ledger = next(x for x in rt.metadata.list_ledgers("orders") if not x.is_offloaded)
    started = begin(rt, ledger, lease_ms=3_600_000)
    make_topic(rt, "stream", streaming=True)
    claim = rt.metadata.segments.claim("stream", "test", 60_000)
    data, index = segment_object_keys(segment_id := str(uuid.uuid4()))
    rt.metadata.segments.assign(
        claim,
        segment_id=segment_id,
        data_key=data,
        index_key=index,
        store_id=store_id,
        begin=Position(ledger_id=0, entry_id=0),
    )
    (queued,) = plant(rt, 1)
    rt.metadata.deletions.enqueue([queued], "test", store_id=store_id)
    offloaded = [x for x in rt.metadata.list_ledgers("orders") if x.is_offloaded]
    every = {k for x in offloaded for k in (x.data_key, x.index_key)}
    every |= {started.data_key, started.index_key, data, index, queued}
    assert len(every) == 2 * len(offloaded) + 5
    stranger, _ = ledger_object_keys(str(uuid.uuid4()), 1)
    assert rt.metadata.referenced_keys([*every, stranger]) == every
    # every branch of the union has rows here, and none of them is what was asked
    assert rt.metadata.referenced_keys([stranger]) == set()


def test_paging_looks_up_every_page(swept: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of two keys: every page is looked up and queued on its own."""
    from offloader.gc import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "PAGE", 2)
    rt = swept
    planted = plant(rt, 5)
    time.sleep(GRACE + 1.5)
    lookups: list[int] = []
    referenced_keys = rt.metadata.referenced_keys

    def counted(keys: list[str]) -> set[str]:
        lookups.append(len(keys))
        return referenced_keys(keys)

    monkeypatch.setattr(rt.metadata, "referenced_keys", counted)
    result = sweep(rt.metadata, rt.stores, rt.settings)
    assert result.stores[0].queued == 5
    assert queued(rt.metadata) == dict.fromkeys(planted, ORPHAN_REASON)
    (store,) = result.stores
    assert (store.listed, store.referenced) == (
        len(stored_keys(rt.objects)),
        len(stored_keys(rt.objects)) - 5,
    )
    assert (store.orphans, store.orphan_bytes) == (5, sum(planted.values()))
    listed = len(stored_keys(rt.objects))
    assert lookups == [2] * (listed // 2) + [listed % 2] * (listed % 2)


def test_a_sweep_killed_after_queueing_converges(swept: Runtime) -> None:
    rt = swept
    planted = plant(rt, 4)
    time.sleep(GRACE + 1.5)
    proc = spawn_cli(rt.settings, "sweep", failpoints="after-sweep-enqueue")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    # right after the kill: the page's orphans are queued (durably), nothing deleted yet
    assert queued(rt.metadata) == dict.fromkeys(planted, ORPHAN_REASON)
    assert planted.keys() <= stored_keys(rt.objects)
    proc = spawn_cli(rt.settings, "sweep", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["orphans"] == 0  # nothing queued twice
    assert len(pending_deletions(rt.metadata)) == 4
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert unaccounted_objects(rt) == set() and not planted.keys() & stored_keys(rt.objects)


def test_scan_cli_reports_and_changes_nothing(swept: Runtime) -> None:
    rt = swept
    planted = plant(rt, 2)
    time.sleep(GRACE + 1.5)
    proc = spawn_cli(rt.settings, "scan", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["dry_run"] is True and report["orphans"] == 2
    objects = report["stores"][0]["objects"]
    assert {o["key"]: o["size"] for o in objects} == planted
    assert queued(rt.metadata) == {}


def test_an_unreachable_recorded_store_is_skipped_and_named_after_the_others(
    swept: Runtime, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """A recorded store other than the configured one that cannot be reached is skipped
    with a warning (invariant 8): the others are swept, the result and scan name it."""
    from offloader.objectstore.location import StoreLocation

    rt = swept
    gone = StoreLocation("file", str(tmp_path / "gone"))
    rt.metadata.record_location(gone)
    planted = plant(rt, 1)
    time.sleep(GRACE + 1.5)
    result = sweep(rt.metadata, rt.stores, rt.settings)
    assert queued(rt.metadata) == dict.fromkeys(planted, ORPHAN_REASON)  # the default one was swept
    assert result.errors == []
    assert len(result.skipped) == 1 and str(gone) in result.skipped[0]
    proc = spawn_cli(rt.settings, "scan")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"{gone}: SKIPPED (unreachable)" in out.decode() and "does not exist" in out.decode()


def test_a_scan_records_nothing(runtime: Runtime) -> None:
    """Before any offload the configured store is not recorded; a scan covers it anyway
    and leaves the metadata exactly as it was."""
    from offloader.metadata import schema

    rt = runtime
    planted = plant(rt, 1)
    (store,) = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True).stores
    assert (store.store_id, store.listed, store.young) == (None, 1, 1)
    with rt.metadata.engine.connect() as conn:
        assert conn.execute(schema.object_stores.select()).all() == []
    sweep(rt.metadata, rt.stores, rt.settings)  # a sweep records it, as offloads do
    assert queued(rt.metadata) == {} and planted.keys() <= stored_keys(rt.objects)
    with rt.metadata.engine.connect() as conn:
        assert len(conn.execute(schema.object_stores.select()).all()) == 1


def test_every_recorded_store_is_swept(swept: Runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A store earlier offloads went to (invariant 7) is swept too, and its orphans are
    queued for, and deleted in, that store."""
    from offloader.objectstore.location import StoreLocation

    rt = swept
    (tmp_path / "older-store").mkdir()
    other_id = rt.metadata.record_location(StoreLocation("file", str(tmp_path / "older-store")))
    other = rt.stores.get(other_id, "the older store")
    key = ledger_object_keys(str(uuid.uuid4()), 5)[0]
    other.put(key, b"left in the older store")
    time.sleep(GRACE + 1.5)
    result = sweep(rt.metadata, rt.stores, rt.settings)
    assert {s.store_id for s in result.stores} == {rt.stores.default_id(), other_id}
    assert [(d.object_key, d.store_id) for d in pending_deletions(rt.metadata)] == [(key, other_id)]
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert not other.exists(key)


def test_a_result_with_unswept_stores_fails_naming_each_and_only_them() -> None:
    fine = StoreSweep(store_id=1, store="file:///a", orphans=2)
    result = SweepResult(
        dry_run=False, grace_seconds=1.0, multipart_max_age_seconds=1.0, stores=[fine]
    )
    result.raise_for_errors()  # every store was swept: nothing to raise
    result.stores += [
        StoreSweep(store_id=2, store="s3://b/x", error="not reachable"),
        StoreSweep(store_id=3, store="s3://c", error="cannot be opened"),
    ]
    message = r"^not swept: s3://b/x: not reachable; s3://c: cannot be opened$"
    with pytest.raises(StoreUnavailableError, match=message):
        result.raise_for_errors()


def _ms(when: datetime | None) -> int:
    """A store's time on the millisecond scale the sweep measures ages on."""
    assert when is not None
    return int(when.timestamp() * 1000)


def pin_db_clock(monkeypatch: pytest.MonkeyPatch, rt: Runtime, now_ms: int) -> None:
    """The database's clock reads ``now_ms`` (ages are measured on one reading of it)."""
    monkeypatch.setattr(rt.metadata, "db_now_ms", lambda: now_ms)


def test_ages_on_the_grace_and_the_upload_limit_are_old_enough(
    swept: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object exactly ``sweep_grace_seconds`` old is an orphan and an upload exactly
    ``multipart_max_age_seconds`` old is stale (the limits are inclusive); a moment
    younger, either is left alone. Ages are reported to the millisecond."""
    rt = swept
    (orphan,) = plant(rt, 1)
    stale = rt.objects.create_multipart(ledger_object_keys(str(uuid.uuid4()), 200)[0])
    time.sleep(1.1)  # S3 keeps LastModified to the second
    (young,) = plant(rt, 1)
    young_upload = rt.objects.create_multipart(ledger_object_keys(str(uuid.uuid4()), 201)[0])
    written = _ms(next(o.last_modified for o in rt.objects.list() if o.key == orphan))
    listed = {u.upload_id: u.initiated for u in rt.objects.list_multipart_uploads()}
    initiated = _ms(listed[stale.upload_id])  # the store's time, as the sweep reads it
    assert _ms(next(o.last_modified for o in rt.objects.list() if o.key == young)) > written
    assert _ms(listed[young_upload.upload_id]) > initiated

    def scan_at(now_ms: int) -> StoreSweep:
        pin_db_clock(monkeypatch, rt, now_ms)
        (store,) = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True).stores
        return store

    at_grace = scan_at(written + int(GRACE * 1000))
    assert [(o.key, o.age_seconds) for o in at_grace.objects] == [(orphan, GRACE)]
    assert at_grace.young == 1
    later = scan_at(written + 3456)
    assert [o.age_seconds for o in later.objects if o.key == orphan] == [3.456]
    at_limit = scan_at(initiated + int(GRACE * 1000))
    assert [(u.key, u.upload_id, u.age_seconds) for u in at_limit.uploads] == [
        (stale.key, stale.upload_id, GRACE)
    ]
    later = scan_at(initiated + 3456)
    assert [(u.upload_id, u.age_seconds) for u in later.uploads if u.key == stale.key] == [
        (stale.upload_id, 3.456)
    ]
    for upload in (stale, young_upload):
        rt.objects.abort_multipart(upload)


def test_uploads_of_attempts_that_are_not_live_are_aborted(
    swept: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Parts of either key of a live attempt stay; those of an attempt whose lease ran out
    (still named by its ledger: its worker died) and of nobody are aborted, each with a
    log line naming it. Keys sort the live attempt's uploads first. Objects of either
    attempt are referenced (started, whatever its lease): none is queued."""
    rt = swept
    produce_ledgers(rt, "orders", [(5, 100)])
    first, second = [x for x in rt.metadata.list_ledgers("orders") if not x.is_offloaded]
    live = begin(rt, first, 3_600_000, "00000000-0000-4000-8000-000000000001")
    dead = begin(rt, second, -1, "ffffffff-0000-4000-8000-000000000002")
    stray = ledger_object_keys("eeeeeeee-0000-4000-8000-000000000003", 9)[0]
    keys = [live.data_key, live.index_key, dead.data_key, dead.index_key, stray]
    uploads = {key: rt.objects.create_multipart(key) for key in keys}
    for key in keys[:4]:
        rt.objects.put(key, b"an object of a started attempt")
    pin_db_clock(monkeypatch, rt, rt.metadata.db_now_ms() + 3_600_000)  # every upload is old
    gone = [uploads[k] for k in (dead.data_key, dead.index_key, stray)]

    (scan,) = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True).stores
    assert [(u.key, u.upload_id) for u in scan.uploads] == sorted(
        (u.key, u.upload_id) for u in gone
    )
    assert (scan.stale_uploads, scan.aborted_uploads) == (3, 0)

    with caplog.at_level(logging.INFO, logger="offloader.gc.sweep"):
        (done,) = sweep(rt.metadata, rt.stores, rt.settings).stores
    assert (done.stale_uploads, done.aborted_uploads) == (3, 3)
    left = {u.upload_id for u in rt.objects.list_multipart_uploads()}
    assert left == {uploads[live.data_key].upload_id, uploads[live.index_key].upload_id}
    assert queued(rt.metadata) == {}
    aborted = [r.getMessage() for r in caplog.records if r.name == "offloader.gc.sweep"]
    assert sorted(aborted) == sorted(
        f"aborting stale multipart upload {u.upload_id} of {u.key}" for u in gone
    )


def test_a_store_that_cannot_be_opened_is_logged_and_reported(
    swept: Runtime, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """In-process: the warning names the store and why; the result names it skipped, by
    its location, with what went wrong, after sweeping the rest."""
    from offloader.objectstore.location import StoreLocation

    rt = swept
    gone = StoreLocation("file", str(tmp_path / "gone"))
    gone_id = rt.metadata.record_location(gone)
    with caplog.at_level(logging.WARNING, logger="offloader.gc.sweep"):
        result = sweep(rt.metadata, rt.stores, rt.settings)
    (record,) = [r for r in caplog.records if r.name == "offloader.gc.sweep"]
    assert record.getMessage().startswith(f"sweep skips {gone}: ")
    assert "does not exist" in record.getMessage()
    assert [(s.store_id, s.store, s.error, s.skipped) for s in result.stores] == [
        (rt.stores.default_id(), str(rt.stores.default_location), None, None),
        (gone_id, str(gone), None, record.getMessage().split(": ", 1)[1]),
    ]


def test_a_scan_reports_the_configured_store_first_and_its_settings(
    runtime: Runtime, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """The configured store, not yet recorded, comes first, before the recorded ones;
    the result says it is a scan and which limits it applied."""
    from offloader.objectstore.location import StoreLocation

    rt = runtime
    (tmp_path / "older-store").mkdir()
    older = StoreLocation("file", str(tmp_path / "older-store"))
    older_id = rt.metadata.record_location(older)
    settings = rt.settings.model_copy(
        update={"sweep_grace_seconds": 7.0, "multipart_max_age_seconds": 11.0}
    )
    result = sweep(rt.metadata, rt.stores, settings, dry_run=True)
    assert [(s.store_id, s.store) for s in result.stores] == [
        (None, str(rt.stores.default_location)),
        (older_id, str(older)),
    ]
    assert (result.dry_run, result.grace_seconds, result.multipart_max_age_seconds) == (
        True,
        7.0,
        11.0,
    )
    done = sweep(rt.metadata, rt.stores, settings)
    assert (done.dry_run, len(done.stores)) == (False, 2)


def test_the_summary_says_what_was_done_or_would_be_per_store() -> None:
    """What `offloader scan` and `sweep` print: per store its counts (a scan's "would"),
    each orphan and stale upload of a scan, and a store that was not swept, with why."""
    unswept = StoreSweep(store_id=2, store="s3://b/x", error="OSError: not reachable")
    scanned = StoreSweep(
        store_id=1, store="file:///a", listed=9, referenced=4, young=1, foreign=1, orphans=2,
        orphan_bytes=30, queued=0, stale_uploads=1, aborted_uploads=0,
        objects=[Orphan("k1", 10, 3.4), Orphan("k2", 20, 4.6)],
        uploads=[StaleUpload("k3", "u-1", 7.5)],
    )  # fmt: skip
    scan = SweepResult(True, 1.0, 1.0, [unswept, scanned])
    assert str(scan) == "\n".join(
        [
            "s3://b/x: NOT SWEPT: OSError: not reachable",
            "file:///a: listed 9, referenced 4, young 1, foreign 1, orphans 2 (30 bytes, "
            "would queue 2), stale uploads 1 (would abort 1)",
            "  k1  10 bytes  3 s old",
            "  k2  20 bytes  5 s old",
            "  upload k3 (u-1)  8 s old",
        ]
    )
    swept = StoreSweep(
        store_id=1, store="file:///a", listed=9, referenced=4, orphans=3, orphan_bytes=30,
        queued=2, stale_uploads=3, aborted_uploads=1,
    )  # fmt: skip
    assert str(SweepResult(False, 1.0, 1.0, [unswept, swept])) == "\n".join(
        [
            "s3://b/x: NOT SWEPT: OSError: not reachable",
            "file:///a: listed 9, referenced 4, young 0, foreign 0, orphans 3 (30 bytes, "
            "queued 2), stale uploads 3 (aborted 1)",
        ]
    )
    assert str(SweepResult(False, 1.0, 1.0, [])) == "(no stores recorded)"


def test_uploads_are_looked_up_a_page_at_a_time(
    swept: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of two uploads: each page's keys are looked up in one statement of at most a
    page's keys (the lookup's IN list stays bounded however many uploads there are)."""
    from offloader.gc import sweep as sweep_module

    rt = swept
    monkeypatch.setattr(sweep_module, "PAGE", 2)
    lookups: list[list[str]] = []
    live_attempt_keys = rt.metadata.live_attempt_keys

    def counted(keys: list[str]) -> set[str]:
        lookups.append(list(keys))
        return live_attempt_keys(keys)

    monkeypatch.setattr(rt.metadata, "live_attempt_keys", counted)
    uploads = [
        rt.objects.create_multipart(ledger_object_keys(str(uuid.uuid4()), 300 + n)[0])
        for n in range(5)
    ]
    pin_db_clock(monkeypatch, rt, rt.metadata.db_now_ms() + 3_600_000)
    (store,) = sweep(rt.metadata, rt.stores, rt.settings).stores
    assert store.aborted_uploads == 5 and list(rt.objects.list_multipart_uploads()) == []
    assert [len(keys) for keys in lookups] == [2, 2, 1]
    assert sorted(k for keys in lookups for k in keys) == sorted(u.key for u in uploads)


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_an_upload_of_an_attempt_whose_lease_ends_this_millisecond_is_aborted(
    swept: Runtime,
) -> None:
    """A lease ending exactly at the database's now is over (``attempt_lease_ms <= now``,
    the rule every lease check applies): that attempt's upload is stale. SQLite's clock is
    stopped to get there; on PostgreSQL the rule is the same SQL."""
    rt = swept
    ledger = next(x for x in rt.metadata.list_ledgers("orders") if not x.is_offloaded)
    now = rt.metadata.db_now_ms() + 3_600_000  # the upload, begun now, is an hour old
    with stopped_sqlite_clock(rt.metadata.engine, now):
        ending = begin(rt, ledger, lease_ms=0)
        assert rt.metadata.get_ledger("orders", ledger.ledger_id).attempt_lease_ms == now
        assert rt.metadata.db_now_ms() == now
        upload = rt.objects.create_multipart(ending.data_key)
        (store,) = sweep(rt.metadata, rt.stores, rt.settings).stores
    assert store.aborted_uploads == 1
    assert upload.upload_id not in {u.upload_id for u in rt.objects.list_multipart_uploads()}


def test_an_unreadable_manifest_leaves_every_snapshot_alone(
    swept: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a readable manifest the sweep cannot tell kept snapshots from strays: it
    leaves everything under _metadata/ alone, says so, and sweeps the rest."""
    rt = swept
    rt.objects.put(MANIFEST_KEY, b"not a manifest")
    stray = "_metadata/snapshots/20000101T000000000Z-stray.jsonl.gz"
    rt.objects.put(stray, b"left by an export killed before its manifest")
    planted = plant(rt, 1)
    pin_db_clock(monkeypatch, rt, rt.metadata.db_now_ms() + 3_600_000)
    with caplog.at_level(logging.WARNING, logger="offloader.gc.sweep"):
        sweep(rt.metadata, rt.stores, rt.settings)
    assert queued(rt.metadata) == dict.fromkeys(planted, ORPHAN_REASON)
    assert [r.getMessage() for r in caplog.records if r.name == "offloader.gc.sweep"] == [
        "snapshot manifest unreadable; the sweep leaves _metadata/ alone"
    ]

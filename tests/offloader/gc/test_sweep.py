"""The orphan sweep on both pairings: planted objects are found by ``scan`` and queued by the
sweep only past the grace period (database clock), live attempts' objects and parts are
never touched, snapshots survive, and a sweep killed after queueing converges on rerun."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from fixtures.backends import (
    make_topic,
    produce_ledgers,
    run_cli,
    tiered_digests,
    unaccounted_objects,
)
from fixtures.clock import HOUR, skew_worker_clock
from offloader.exceptions import StoreUnavailableError
from offloader.gc.deletion_queue import process_deletions
from offloader.gc.sweep import ORPHAN_REASON, StoreSweep, SweepResult, sweep
from offloader.metadata.backup import MANIFEST_KEY, export_from, read_manifest
from offloader.offload.keys import ledger_object_keys
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import TopicReader
from offloader.runtime import Runtime
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


def pending(rt: Runtime) -> dict[str, str]:
    return {d.object_key: d.reason for d in rt.metadata.pending_deletions()}


def present(rt: Runtime) -> set[str]:
    return {o.key for o in rt.objects.list()}


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
    assert pending(rt) == {}

    time.sleep(GRACE + 1.5)
    scan = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    (store,) = scan.stores
    assert {o.key: o.size for o in store.objects} == planted
    assert all(o.age_seconds >= GRACE for o in store.objects)
    assert store.orphan_bytes == sum(planted.values())
    assert store.referenced == store.listed - 3
    assert pending(rt) == {} and planted.keys() <= present(rt)  # a scan changes nothing

    done = sweep(rt.metadata, rt.stores, rt.settings)
    assert done.stores[0].queued == 3
    assert pending(rt) == dict.fromkeys(planted, ORPHAN_REASON)
    again = sweep(rt.metadata, rt.stores, rt.settings)  # queued once is enough
    assert again.orphans == 0 and len(rt.metadata.pending_deletions()) == 3

    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert not planted.keys() & present(rt)
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
    assert "foreign 3" in scan.summary()

    done = sweep(rt.metadata, rt.stores, rt.settings)
    assert (done.stores[0].queued, done.stores[0].aborted_uploads) == (1, 0)
    assert pending(rt) == dict.fromkeys(planted, ORPHAN_REASON)
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert set(foreign) <= present(rt) and not planted.keys() & present(rt)
    assert upload.upload_id in {u.upload_id for u in rt.objects.list_multipart_uploads()}
    rt.objects.abort_multipart(upload)


def test_a_live_attempts_objects_and_parts_are_never_touched(swept: Runtime) -> None:
    rt = swept
    sealed = [x for x in rt.metadata.list_ledgers("orders") if not x.is_offloaded]
    ledger = sealed[0]
    store_id = rt.stores.default_id()

    def begin(lease_ms: int, attempt_ledger=ledger):  # type: ignore[no-untyped-def]
        attempt_id = str(uuid.uuid4())
        data_key, index_key = ledger_object_keys(attempt_id, attempt_ledger.ledger_id)
        _, attempt = rt.metadata.begin_attempt(
            attempt_ledger, attempt_id, data_key, index_key, "test", lease_ms, store_id=store_id
        )
        return attempt

    live = begin(lease_ms=3_600_000)
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
    assert live.index_key in present(rt) and live.index_key not in pending(rt)
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
    ledger, _ = rt.metadata.begin_attempt(ledger, old_id, *old_keys, "zombie", 1, store_id=store_id)
    time.sleep(0.05)
    new_id = str(uuid.uuid4())
    rt.metadata.begin_attempt(
        ledger, new_id, *ledger_object_keys(new_id, ledger.ledger_id), "t", 60_000,
        store_id=store_id,
    )  # fmt: skip
    process_deletions(rt.metadata, rt.stores, rt.settings)
    rt.objects.put(old_keys[0], b"written by the zombie after its keys were deleted")
    time.sleep(GRACE + 1.5)
    sweep(rt.metadata, rt.stores, rt.settings)
    assert pending(rt) == {old_keys[0]: ORPHAN_REASON}


def test_snapshots_survive_the_sweep_and_a_stray_one_does_not(swept: Runtime) -> None:
    rt = swept
    first = export_from(rt).snapshot
    second = export_from(rt).snapshot
    stray = "_metadata/snapshots/20000101T000000000Z-stray.jsonl.gz"
    rt.objects.put(stray, b"left by an export killed before its manifest")
    time.sleep(GRACE + 1.5)
    sweep(rt.metadata, rt.stores, rt.settings)
    assert pending(rt) == {stray: ORPHAN_REASON}
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert {first.key, second.key, MANIFEST_KEY} <= present(rt)
    assert stray not in present(rt)
    assert [s.key for s in read_manifest(rt.objects)] == [first.key, second.key]


def test_paging_looks_up_every_page(swept: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages of two keys: every page is looked up and queued on its own."""
    from offloader.gc import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "PAGE", 2)
    rt = swept
    planted = plant(rt, 5)
    time.sleep(GRACE + 1.5)
    result = sweep(rt.metadata, rt.stores, rt.settings)
    assert result.stores[0].queued == 5
    assert pending(rt) == dict.fromkeys(planted, ORPHAN_REASON)
    assert result.stores[0].referenced == len(present(rt)) - 5


def test_a_sweep_killed_after_queueing_converges(swept: Runtime) -> None:
    rt = swept
    planted = plant(rt, 4)
    time.sleep(GRACE + 1.5)
    proc = run_cli(rt, "sweep", failpoints="after-sweep-enqueue")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    # right after the kill: the page's orphans are queued (durably), nothing deleted yet
    assert pending(rt) == dict.fromkeys(planted, ORPHAN_REASON)
    assert planted.keys() <= present(rt)
    proc = run_cli(rt, "sweep", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["orphans"] == 0  # nothing queued twice
    assert len(rt.metadata.pending_deletions()) == 4
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert unaccounted_objects(rt) == set() and not planted.keys() & present(rt)


def test_scan_cli_reports_and_changes_nothing(swept: Runtime) -> None:
    rt = swept
    planted = plant(rt, 2)
    time.sleep(GRACE + 1.5)
    proc = run_cli(rt, "scan", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["dry_run"] is True and report["orphans"] == 2
    objects = report["stores"][0]["objects"]
    assert {o["key"]: o["size"] for o in objects} == planted
    assert pending(rt) == {}


def test_an_unreachable_recorded_store_fails_the_sweep_after_the_others(
    swept: Runtime, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    from offloader.objectstore.location import StoreLocation

    rt = swept
    gone = StoreLocation("file", str(tmp_path / "gone"))
    rt.metadata.record_store(gone)
    planted = plant(rt, 1)
    time.sleep(GRACE + 1.5)
    result = sweep(rt.metadata, rt.stores, rt.settings)
    assert pending(rt) == dict.fromkeys(planted, ORPHAN_REASON)  # the default one was swept
    assert len(result.errors) == 1 and str(gone) in result.errors[0]
    proc = run_cli(rt, "scan")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "not swept" in lines[0] and "does not exist" in lines[0]


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
    assert pending(rt) == {} and planted.keys() <= present(rt)
    with rt.metadata.engine.connect() as conn:
        assert len(conn.execute(schema.object_stores.select()).all()) == 1


def test_every_recorded_store_is_swept(swept: Runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A store earlier offloads went to (invariant 7) is swept too, and its orphans are
    queued for, and deleted in, that store."""
    from offloader.objectstore.location import StoreLocation

    rt = swept
    (tmp_path / "older-store").mkdir()
    other_id = rt.metadata.record_store(StoreLocation("file", str(tmp_path / "older-store")))
    other = rt.stores.get(other_id, "the older store")
    key = ledger_object_keys(str(uuid.uuid4()), 5)[0]
    other.put(key, b"left in the older store")
    time.sleep(GRACE + 1.5)
    result = sweep(rt.metadata, rt.stores, rt.settings)
    assert {s.store_id for s in result.stores} == {rt.stores.default_id(), other_id}
    assert [(d.object_key, d.store_id) for d in rt.metadata.pending_deletions()] == [
        (key, other_id)
    ]
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

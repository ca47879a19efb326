"""Each planted fault is caught with its kind and a message naming the key or ledger; the
others stay silent. The faults one at a time run on files + SQLite (fast); all of them at
once run on both pairings."""

from __future__ import annotations

import uuid

import pytest

from fixtures.damage import flip, overwrite_object
from fixtures.verify import describe, healthy_topics, of_kind
from offloader.metadata import Ledger, schema
from offloader.metadata.clock import db_now
from offloader.objectstore.location import StoreLocation
from offloader.runtime import Runtime
from offloader.verify import VerifyReport, verify_promises

FS_ONLY = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)


@pytest.fixture
def healthy(runtime: Runtime) -> Runtime:
    healthy_topics(runtime)
    assert verify_promises(runtime).ok
    return runtime


def live(rt: Runtime) -> Ledger:
    """The first live offloaded ledger of ``orders``."""
    return next(x for x in rt.metadata.list_ledgers("orders", live=True) if x.is_offloaded)


def only(report: VerifyReport, kind: str) -> list[str]:
    """The messages of the breaches of ``kind``, asserting there is no other kind."""
    assert {b.kind for b in report.breaches} == {kind}, describe(report)
    return [b.message for b in report.breaches]


def plant_orphan(rt: Runtime) -> str:
    key = f"{uuid.uuid4()}-ledger-99"
    rt.objects.put(key, b"no row names me")
    return key


def plant_second_commit(rt: Runtime, ledger: Ledger) -> str:
    attempt = str(uuid.uuid4())
    with rt.metadata.transaction() as conn:
        conn.execute(
            schema.offload_attempts.insert().values(
                attempt_id=attempt,
                topic=ledger.topic,
                ledger_id=ledger.ledger_id,
                epoch=ledger.offload_epoch,
                data_key=f"{attempt}-ledger-{ledger.ledger_id}",
                index_key=f"{attempt}-ledger-{ledger.ledger_id}-index",
                state="committed",
                owner="planted",
                created_ms=db_now(),
                store_id=ledger.store_id,
            )
        )
    return attempt


def plant_live_below_start(rt: Runtime) -> int:
    """The first trimmed ledger of ``orders`` put back in a readable state."""
    first = rt.metadata.list_ledgers("orders")[0]
    L = schema.ledgers
    with rt.metadata.transaction() as conn:
        conn.execute(
            L.update()
            .where(L.c.topic == "orders", L.c.ledger_id == first.ledger_id)
            .values(deletion_state="none", deleted_ms=None, deleting_ms=None)
        )
    return first.ledger_id


@FS_ONLY
def test_an_orphan(healthy: Runtime) -> None:
    key = plant_orphan(healthy)
    report = verify_promises(healthy)
    (message,) = only(report, "orphan")
    assert key in message and report.breaches[0].key == key


@FS_ONLY
def test_an_object_queued_once_awaits_the_sweep(healthy: Runtime) -> None:
    """A key some row once named (a done deletion here) written again: the sweep's, not
    a breach."""
    ledger = live(healthy)
    key = f"{uuid.uuid4()}-ledger-{ledger.ledger_id}"
    healthy.metadata.deletions.enqueue([key], "planted", store_id=healthy.stores.default_id())
    D = schema.deletion_queue
    with healthy.metadata.transaction() as conn:
        conn.execute(D.update().where(D.c.object_key == key).values(state="done"))
    healthy.objects.put(key, b"late write")
    report = verify_promises(healthy)
    assert report.ok, describe(report)
    assert report.counts.awaiting_sweep == 1


@FS_ONLY
def test_a_foreign_object_is_counted_and_left_alone(healthy: Runtime) -> None:
    healthy.objects.put("notes/readme.txt", b"someone else's")
    report = verify_promises(healthy)
    assert report.ok and report.counts.foreign == 1


@FS_ONLY
def test_a_missing_object(healthy: Runtime) -> None:
    ledger = live(healthy)
    assert ledger.data_key is not None
    healthy.objects.delete_many([ledger.data_key])
    report = verify_promises(healthy)
    kinds = {b.kind for b in report.breaches}
    # its hot copy was deleted: the ledger is unreadable as well
    assert kinds == {"missing_object", "unreadable"}, describe(report)
    (missing,) = of_kind(report, "missing_object")
    assert ledger.data_key in missing.message and missing.key == ledger.data_key
    assert f"orders/{ledger.ledger_id}" in missing.message
    (unreadable,) = of_kind(report, "unreadable")
    assert unreadable.ledger_id == ledger.ledger_id and ledger.data_key in unreadable.message


@FS_ONLY
def test_a_missing_object_with_a_hot_copy_is_still_readable(healthy: Runtime) -> None:
    segment = healthy.metadata.segments.of_topic("s")[0]
    healthy.objects.delete_many([segment.index_key])
    (message,) = only(verify_promises(healthy), "missing_object")
    assert segment.index_key in message and segment.segment_id in message


@FS_ONLY
def test_a_truncated_object(healthy: Runtime) -> None:
    ledger = live(healthy)
    assert ledger.data_key is not None
    overwrite_object(healthy.objects, ledger.data_key, lambda data: data[:-10])
    (message,) = only(verify_promises(healthy), "size_mismatch")
    assert ledger.data_key in message and f"{ledger.data_len}" in message


@FS_ONLY
def test_a_flipped_byte_is_caught_only_deep(healthy: Runtime) -> None:
    ledger = live(healthy)
    assert ledger.data_key is not None and ledger.data_len is not None
    overwrite_object(healthy.objects, ledger.data_key, flip(ledger.data_len // 2))
    assert verify_promises(healthy).ok
    report = verify_promises(healthy, deep=True)
    messages = only(report, "corrupt")
    assert all(ledger.data_key in m for m in messages)
    assert report.breaches[0].ledger_id == ledger.ledger_id


@FS_ONLY
def test_a_second_committed_offload(healthy: Runtime) -> None:
    ledger = live(healthy)
    attempt = plant_second_commit(healthy, ledger)
    (message,) = only(verify_promises(healthy), "double_commit")
    assert f"orders/{ledger.ledger_id}" in message
    assert attempt in message and str(ledger.offload_attempt_id) in message


@FS_ONLY
def test_a_trimmed_ledger_put_back(healthy: Runtime) -> None:
    ledger_id = plant_live_below_start(healthy)
    (message,) = only(verify_promises(healthy), "readable_below_start")
    assert f"orders/{ledger_id}" in message


@FS_ONLY
def test_a_queued_deletion_of_a_referenced_object(healthy: Runtime) -> None:
    ledger = live(healthy)
    assert ledger.data_key is not None and ledger.store_id is not None
    healthy.metadata.deletions.enqueue([ledger.data_key], "planted", store_id=ledger.store_id)
    (message,) = only(verify_promises(healthy), "queued_but_referenced")
    assert ledger.data_key in message and f"orders/{ledger.ledger_id}" in message


@FS_ONLY
def test_an_unavailable_store_is_one_breach_and_the_rest_goes_on(
    healthy: Runtime, tmp_path: pytest.TempPathFactory
) -> None:
    not_a_directory = tmp_path / "plain-file"  # type: ignore[operator]
    not_a_directory.write_text("a file where a store's root should be")
    healthy.metadata.record_location(StoreLocation("file", str(not_a_directory)))
    key = plant_orphan(healthy)
    report = verify_promises(healthy)
    assert {b.kind for b in report.breaches} == {"store_unavailable", "orphan"}, describe(report)
    (unavailable,) = of_kind(report, "store_unavailable")
    assert str(not_a_directory) in unavailable.message
    assert of_kind(report, "orphan")[0].key == key


def test_every_fault_at_once(healthy: Runtime) -> None:
    """Both pairings: every kind of fault planted together, each caught once."""
    rt = healthy
    orders = [x for x in rt.metadata.list_ledgers("orders", live=True) if x.is_offloaded]
    missing, truncated = orders
    assert missing.data_key is not None and truncated.data_key is not None
    orphan = plant_orphan(rt)
    rt.objects.delete_many([missing.data_key])
    overwrite_object(rt.objects, truncated.data_key, lambda data: data[:-10])
    segment = rt.metadata.segments.of_topic("s")[0]
    plant_second_commit(rt, truncated)
    below = plant_live_below_start(rt)
    assert truncated.index_key is not None and truncated.store_id is not None
    rt.metadata.deletions.enqueue([truncated.index_key], "planted", store_id=truncated.store_id)
    overwrite_object(rt.objects, segment.data_key, flip(segment.data_len // 2))
    report = verify_promises(rt, deep=True)
    found = {(b.kind, b.key or b.ledger_id) for b in report.breaches}
    assert found >= {
        ("orphan", orphan),
        ("missing_object", missing.data_key),
        ("unreadable", missing.ledger_id),
        ("size_mismatch", truncated.data_key),
        ("double_commit", truncated.ledger_id),
        ("readable_below_start", below),
        ("queued_but_referenced", truncated.index_key),
        ("corrupt", segment.data_key),
    }, describe(report)
    kinds = [b.kind for b in report.breaches]
    assert all(kinds.count(k) == 1 for k in set(kinds) - {"corrupt"}), describe(report)

"""Invariant 7: an offload records where it went; reads and deletes use that store, so
changing the configured store (another directory, bucket or prefix) strands nothing.

Runs on both backend pairings: files + SQLite and SeaweedFS + PostgreSQL.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.cli import run_cli
from fixtures.metadata import pending_deletions
from offloader.exceptions import StoreUnavailableError
from offloader.gc.deletion_queue import process_deletions
from offloader.objectstore.registry import default_location
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime
from offloader.settings import Settings


def another_store(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    """``settings`` with the default store moved: another directory, or another bucket with
    a key prefix. Same metadata database and hot tier."""
    if settings.resolved_object_store_url.startswith("file:"):
        url = (settings.data_dir / "objects-b").as_uri()
    else:
        server = request.getfixturevalue("s3_server")
        moved = server.make_settings(f"b-{uuid.uuid4().hex[:12]}", prefix="moved/here")
        url = moved.object_store_url
    return settings.model_copy(update={"object_store_url": url})


def remove_store(request: pytest.FixtureRequest, rt: Runtime) -> None:
    """Make the runtime's default store disappear: the directory, or the bucket."""
    location = default_location(rt.settings)
    if location.kind == "file":
        shutil.rmtree(location.location)
        return
    rt.objects.delete_many([info.key for info in rt.objects.list()])
    request.getfixturevalue("s3_server").client().delete_bucket(Bucket=location.location)


def tiered(rt: Runtime, ledger_id: int) -> list[tuple[int, bytes]]:
    return list(TopicReader(rt).read("orders", ledger_id, source=Source.TIERED))


def test_switching_the_store_strands_nothing(
    request: pytest.FixtureRequest, backend_settings: Settings
) -> None:
    with Runtime.open(backend_settings) as a:
        make_topic(a)
        ids = produce_ledgers(a, "orders", [(20, 3000), (5, 100), (30, 500)])
        hot_digest = TopicReader(a).checksum("orders", Source.HOT).digest
        LedgerOffloader(a).offload_topic("orders", up_to=ids[1])
        before = {i: tiered(a, i) for i in ids[:2]}
        a.objects.put("stray", b"queued in A")
        a.metadata.deletions.enqueue(["stray"], "test", store_id=a.stores.default_id())
        store_a = a.metadata.get_ledger("orders", ids[0]).store_id
        keys_a = {info.key for info in a.objects.list()}

    settings_b = another_store(request, backend_settings)
    with Runtime.open(settings_b) as b:
        # every earlier ledger still reads, from where it went, byte for byte
        assert {i: tiered(b, i) for i in ids[:2]} == before
        # new offloads go to the new default
        (result,) = LedgerOffloader(b).offload_topic("orders", up_to=ids[2])
        assert result.outcome is Outcome.OFFLOADED
        newest = b.metadata.get_ledger("orders", ids[2])
        assert newest.store_id != store_a
        assert b.metadata.get_location(newest.store_id) == default_location(settings_b)
        assert {info.key for info in b.objects.list()} == {newest.data_key, newest.index_key}
        assert TopicReader(b).checksum("orders", Source.TIERED).digest == hot_digest
        # the GC deletes a queued key in the store it was queued for, not the default
        b.objects.put("stray", b"same key in B, not queued")
        assert process_deletions(b.metadata, b.stores, b.settings).remaining == 0
        assert b.objects.exists("stray")

    with Runtime.open(backend_settings) as a:
        assert {info.key for info in a.objects.list()} == keys_a - {"stray"}


def test_a_recorded_store_that_is_gone_is_named(
    request: pytest.FixtureRequest, backend_settings: Settings
) -> None:
    with Runtime.open(backend_settings) as a:
        make_topic(a)
        (ledger_id,) = produce_ledgers(a, "orders", [(10, 1000)])
        LedgerOffloader(a).offload_topic("orders", up_to=ledger_id)
        a.metadata.deletions.enqueue(["late"], "test", store_id=a.stores.default_id())
        remove_store(request, a)
    gone = str(default_location(backend_settings))
    with Runtime.open(another_store(request, backend_settings)) as b:
        with pytest.raises(StoreUnavailableError) as caught:
            tiered(b, ledger_id)
        message = str(caught.value)
        assert gone in message
        assert "cannot be opened" in message or "not reachable" in message
        for secret in (backend_settings.s3_access_key_id, backend_settings.s3_secret_access_key):
            assert secret is None or secret.get_secret_value() not in message
        # the hot copy is still there: a read that may fall back does
        assert len(list(TopicReader(b).read("orders", ledger_id))) == 10
        # the queued key stays queued, untried (skipped), its error naming the store
        result = process_deletions(b.metadata, b.stores, b.settings)
        assert (result.failed, result.skipped, result.remaining) == (0, 1, 1)
        assert len(result.skipped_stores) == 1 and gone in result.skipped_stores[0]
        (pending,) = pending_deletions(b.metadata)
        assert gone in (pending.last_error or "")
    if backend_settings.resolved_object_store_url.startswith("file:"):
        assert not Path(default_location(backend_settings).location).exists()  # not recreated


def test_a_crashed_attempt_is_finished_in_its_own_store(
    request: pytest.FixtureRequest, backend_settings: Settings
) -> None:
    with Runtime.open(backend_settings) as a:
        make_topic(a)
        (ledger_id,) = produce_ledgers(a, "orders", [(10, 1000)])
        digest = TopicReader(a).checksum("orders", Source.HOT).digest
    crashed = run_cli(
        backend_settings,
        "offload",
        "orders",
        "--up-to",
        str(ledger_id),
        failpoints="after-index-upload",
        ok=False,
    )
    assert crashed.returncode == -9, crashed.stderr
    time.sleep(backend_settings.attempt_lease_seconds + 0.2)  # its lease runs out
    with Runtime.open(another_store(request, backend_settings)) as b:
        (result,) = LedgerOffloader(b).offload_topic("orders", up_to=ledger_id)
        assert result.outcome is Outcome.RECOVERED
        ledger = b.metadata.get_ledger("orders", ledger_id)
        assert b.metadata.get_location(ledger.store_id) == default_location(backend_settings)
        assert list(b.objects.list()) == []
        assert TopicReader(b).checksum("orders", Source.TIERED).digest == digest

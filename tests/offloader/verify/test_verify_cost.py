"""What verify costs: one LIST of each recorded store, no object read or HEADed (without
--deep), and a bounded number of statements per listed page, whatever the store holds."""

from __future__ import annotations

import dataclasses

import pytest

from fixtures import counting
from fixtures.counting import CountingStore, counting_statements
from fixtures.verify import describe, healthy_topics
from offloader.gc import sweep
from offloader.keys import topic_start_key
from offloader.objectstore.registry import StoreRegistry
from offloader.runtime import Runtime
from offloader.verify import verify_promises

STATEMENTS_PER_PAGE = 3  # the sweep's referenced_keys, the key range's records, recorded_keys


def counted(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> tuple[Runtime, CountingStore]:
    """``rt`` whose every request to its store is counted (also the multipart listing)."""
    monkeypatch.setattr(counting, "REQUESTS", (*counting.REQUESTS, "list_multipart_uploads"))
    store = CountingStore(rt.objects)
    stores = StoreRegistry(rt.metadata, rt.settings, store)  # type: ignore[arg-type]
    return dataclasses.replace(rt, objects=store, stores=stores), store  # type: ignore[arg-type]


def test_one_list_pass_no_object_read(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    healthy_topics(runtime)
    rt, store = counted(runtime, monkeypatch)
    with counting_statements(rt.metadata.engine) as one_page:
        report = verify_promises(rt)
    assert report.ok, describe(report)
    listed = report.counts.objects_listed
    assert listed >= 6
    multipart = 1 if rt.objects.capabilities.multipart else 0
    # one LIST, the snapshot manifest's GET (the sweep's rule for _metadata/), one GET of
    # each topic's recorded start, no HEAD or ranged read of any object
    assert dict(store.requests) == {"list": 1, "get": 3, "list_multipart_uploads": multipart}
    assert sorted(store.keys("get")) == sorted(
        ["_metadata/snapshots/manifest.json", topic_start_key("orders"), topic_start_key("s")]
    )

    monkeypatch.setattr(sweep, "PAGE", 1)  # the same listing, one key a page
    store.requests.clear()
    with counting_statements(rt.metadata.engine) as many_pages:
        assert verify_promises(rt).to_json() == report.to_json()
    assert store.requests["list"] == 1
    extra = len(selects(many_pages)) - len(selects(one_page))
    assert 0 < extra <= STATEMENTS_PER_PAGE * (listed - 1)


def selects(statements: list[str]) -> list[str]:
    return [s for s in statements if s.lstrip().upper().startswith(("SELECT", "WITH"))]


def test_a_missing_object_between_pages(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Merging the listing with the recorded keys page by page misses nothing at a page's
    edges: every recorded object deleted in turn is reported, alone."""
    healthy_topics(runtime, streamed=False)
    monkeypatch.setattr(sweep, "PAGE", 1)
    keys = sorted(
        str(k)
        for x in runtime.metadata.list_ledgers("orders", live=True)
        for k in (x.data_key, x.index_key)
    )
    for key in keys:
        data = runtime.objects.get(key)
        metadata = runtime.objects.stat(key).metadata
        runtime.objects.delete_many([key])
        report = verify_promises(runtime)
        assert [b.key for b in report.breaches if b.kind == "missing_object"] == [key]
        runtime.objects.put(key, data, metadata=metadata)
    assert verify_promises(runtime).ok

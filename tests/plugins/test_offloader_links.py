"""The offloaded-objects link: its parts persisted at run time (the ledger's recorded
store, never a credential), the URL built from them, an empty link when they are missing.

On both backend pairings: an offload task run in place, and the offload DAG run by
dag.test() (Airflow builds the link when the task ends).
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from fixtures.airflow import DagFile, connection_env, task_states, xcom_values
from fixtures.backends import make_topic, produce_ledgers
from offloader.objectstore.location import StoreLocation
from offloader.objectstore.registry import default_location
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.runtime import Runtime
from offloader.settings import Settings
from offloader_airflow.links import (
    XCOM_KEY,
    OffloadedObjectsLink,
    link_parts,
    object_browser_url,
    url_from_parts,
)


def test_links_point_at_the_object() -> None:
    assert object_browser_url("file:///data/objects", None, "u-ledger-1") == (
        "file:///data/objects/u-ledger-1"
    )
    assert object_browser_url("s3://b/p", "http://127.0.0.1:8333", "u-ledger-1") == (
        "http://127.0.0.1:8333/b/p/u-ledger-1"
    )
    assert object_browser_url("s3://b", None, "u-ledger-1") == (
        "https://s3.console.aws.amazon.com/s3/buckets/b?prefix=u-ledger-1"
    )


def test_the_url_is_built_from_the_parts_and_malformed_parts_give_an_empty_link() -> None:
    s3 = StoreLocation("s3", "b", "p", "http://127.0.0.1:8333")
    assert url_from_parts(link_parts(s3, "u-ledger-1")) == "http://127.0.0.1:8333/b/p/u-ledger-1"
    files = StoreLocation("file", "/data/objects")
    assert url_from_parts(link_parts(files, "k")) == "file:///data/objects/k"
    good = link_parts(s3, "k")
    for bad in [
        None,
        "http://a/link/as/before",
        [],
        {},
        {**good, "kind": "ftp"},  # not a store kind
        {**good, "location": ""},
        {**good, "key": 3},
        {k: v for k, v in good.items() if k != "key"},
        {**good, "password": "x"},  # not a part
    ]:
        assert url_from_parts(bad) == "", bad


class TaskXComs:
    """One task instance's XComs: the operator pushes to it (as ``context["ti"]``), the
    link reads from it (in place of Airflow's XCom table)."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def xcom_push(self, key: str, value: object) -> None:
        self.values[key] = value

    def get_value(self, *, ti_key: object, key: str) -> object:
        return self.values.get(key)


@pytest.fixture
def xcoms(monkeypatch: pytest.MonkeyPatch) -> TaskXComs:
    task = TaskXComs()
    monkeypatch.setattr("offloader_airflow.links.BaseXCom", task)
    return task


def run_offload_task(xcoms: TaskXComs, topic: str, ledger_ids: list[int]) -> str:
    """Run one offload task over ``ledger_ids``; the link it shows."""
    from offloader_airflow.operators import OffloadLedgersOperator

    operator = OffloadLedgersOperator(
        task_id="offload", batch={"topic": topic, "ledger_ids": ledger_ids}
    )
    operator.execute({"ti": xcoms})  # type: ignore[typeddict-item]
    return OffloadedObjectsLink().get_link(operator, ti_key=None)


def use_connections(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    for key, value in connection_env(settings).items():
        monkeypatch.setenv(key, value)


def test_a_ledger_links_to_its_recorded_store_after_the_default_moved(
    monkeypatch: pytest.MonkeyPatch, backend_settings: Settings, runtime: Runtime, xcoms: TaskXComs
) -> None:
    make_topic(runtime)
    (ledger_id,) = produce_ledgers(runtime, "orders", [(5, 100)])
    LedgerOffloader(runtime).offload_topic("orders", up_to=ledger_id)  # into store A
    key = runtime.metadata.get_ledger("orders", ledger_id).data_key
    assert key is not None
    store_a = default_location(backend_settings)
    moved = backend_settings.model_copy(
        update={"object_store_url": backend_settings.resolved_object_store_url + "/moved"}
    )
    store_b = default_location(moved)
    assert store_b != store_a
    use_connections(monkeypatch, moved)  # the default is store B now

    link = run_offload_task(xcoms, "orders", [ledger_id])  # already offloaded, into A
    assert xcoms.values == {XCOM_KEY: link_parts(store_a, key)}
    assert link == object_browser_url(store_a.store_url, store_a.endpoint or None, key)
    assert link != object_browser_url(store_b.store_url, store_b.endpoint or None, key)


def test_a_task_that_persisted_no_parts_shows_an_empty_link(
    monkeypatch: pytest.MonkeyPatch, backend_settings: Settings, runtime: Runtime, xcoms: TaskXComs
) -> None:
    make_topic(runtime)
    use_connections(monkeypatch, backend_settings)
    assert run_offload_task(xcoms, "orders", []) == ""
    assert xcoms.values == {}
    # and outside a task, where Airflow's XCom cannot be read at all
    monkeypatch.undo()
    assert OffloadedObjectsLink().get_link(None, ti_key=None) == ""


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_the_persisted_parts_hold_no_credential(
    backend_settings: Settings, runtime: Runtime
) -> None:
    make_topic(runtime, offload_threshold_bytes=0)  # every sealed ledger is due
    produce_ledgers(runtime, "orders", [(5, 100)] * 2)
    run = DagFile("offload_ledgers").test(run_conf={"batch_size": 1})
    assert str(run.state) == "success", task_states(run)
    persisted = xcom_values(run, "offload", XCOM_KEY)
    shown = xcom_values(run, "offload", OffloadedObjectsLink().xcom_key, decode=False)
    assert len(persisted) == len(shown) == 2  # one a batch
    assert sorted(shown) == sorted(url_from_parts(p) for p in persisted)
    location = default_location(backend_settings)
    stored = json.dumps(persisted)
    for parts in persisted:
        assert {k: v for k, v in parts.items() if k != "key"} == asdict(location)
    for secret in (backend_settings.s3_access_key_id, backend_settings.s3_secret_access_key):
        if secret is not None:
            assert secret.get_secret_value() not in stored

"""SweepOrphansOperator and ExportMetadataOperator in a real Airflow run (dag.test()) of a
small DAG defined here, on both pairings. The integrator wires the same operators into
dags/garbage_collection.py."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from fixtures.airflow import connection_env, return_value
from fixtures.backends import make_topic, produce_ledgers
from fixtures.metadata import pending_deletions
from offloader.gc.sweep import ORPHAN_REASON
from offloader.metadata.snapshot import read_manifest
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.runtime import Runtime
from offloader.settings import Settings

GRACE = 2.0


def _dag(dag_id: str):  # type: ignore[no-untyped-def]
    from airflow.sdk import DAG, Param

    from offloader_airflow.maintenance_operators import (
        ExportMetadataOperator,
        SweepOrphansOperator,
    )

    with DAG(
        dag_id,
        schedule=None,
        params={"dry_run": Param(False, type=["boolean", "string"])},
        default_args={"retries": 0},
    ) as dag:
        scan = SweepOrphansOperator(task_id="scan", dry_run=True)
        sweep = SweepOrphansOperator(task_id="sweep", dry_run="{{ params.dry_run }}")
        export = ExportMetadataOperator(task_id="export")
        scan >> sweep >> export
    # dag.test() runs what the metadata DB holds: write this DAG there, as parsing would
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=os.devnull)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
    return dag


@pytest.mark.usefixtures("airflow_db")
def test_sweep_and_export_in_a_dag_run(
    backend_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = connection_env(
        backend_settings,
        sweep_grace_seconds=GRACE,
        multipart_max_age_seconds=GRACE,
        metadata_snapshots_keep=2,
    )
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with Runtime.open(backend_settings) as rt:
        make_topic(rt)
        produce_ledgers(rt, "orders", [(10, 1000), (5, 100)])
        LedgerOffloader(rt).offload_topic("orders", up_to=2)
        orphan = f"{uuid.uuid4()}-ledger-42"
        rt.objects.put(orphan, b"planted")
        time.sleep(GRACE + 1.5)

        bad = _dag(f"maintenance_bad_{uuid.uuid4().hex[:6]}").test(run_conf={"dry_run": "maybe"})
        states = {ti.task_id: str(ti.state) for ti in bad.get_task_instances()}
        assert states["scan"] == "success" and states["sweep"] == "failed"
        assert pending_deletions(rt.metadata) == []  # the bad param changed nothing

        run = _dag(f"maintenance_{uuid.uuid4().hex[:6]}").test(run_conf={"dry_run": False})
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        assert states == {"scan": "success", "sweep": "success", "export": "success"}
        assert (
            return_value(run, "scan")["orphans"] == 1
            and return_value(run, "scan")["dry_run"] is True
        )
        assert return_value(run, "sweep")["stores"][0]["queued"] == 1
        assert {d.object_key: d.reason for d in pending_deletions(rt.metadata)} == {
            orphan: ORPHAN_REASON
        }
        exported = return_value(run, "export")["snapshot"]
        assert [s.key for s in read_manifest(rt.objects)] == [exported["key"]]
        assert exported["rows"]["ledgers"] == 2

"""The metrics end to end: a real run of the offload_ledgers DAG moves ledgers, and the real
API server's ``/offloader/metrics`` (scraped as Prometheus does, with the scrape token)
then serves, per topic, exactly what ``offloader status --json`` (the CLI, in its own
process, on the same settings) reports: hot and tiered bytes and ledgers, pending
deletions; and the figures the ledger rows say."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fixtures.airflow import DagFile, connection_env, return_value, task_states
from fixtures.airflow_server import ROLES, AirflowServer, http_answer, running_server
from fixtures.backends import make_topic, produce_ledgers
from fixtures.cli import run_cli
from offloader.metadata.records import Position
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime
from offloader_airflow.ui.access import SCRAPE_CONN_ID

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("airflow_server")]

#: Prometheus family -> the field of ``offloader status --json``'s ``tiers`` it equals
STATUS_FIELDS = {
    "offloader_tiered_size_bytes": "offloaded_bytes",
    "offloader_tiered_ledgers": "offloaded_ledgers",
    "offloader_hot_size_bytes": "hot_bytes",
    "offloader_hot_ledgers": "hot_ledgers",
    "offloader_deletion_backlog_keys": "pending_deletions",
}


@pytest.fixture(scope="module")
def scraped_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowServer, str]]:
    """An API server of its own (its tiers are this module's alone) with a scrape token
    in the offloader_metrics connection; the server and the token."""
    token = secrets.token_urlsafe(24)

    def prepare(server: AirflowServer) -> None:
        server.airflow(
            "connections", "add", SCRAPE_CONN_ID, "--conn-type", "generic", "--conn-password", token
        )

    base = tmp_path_factory.mktemp("metrics-server")
    with running_server(base, ROLES, prepare) as server:
        yield server, token


def scrape(server: AirflowServer, token: str) -> dict[str, dict[str, float]]:
    """``/offloader/metrics`` parsed: family -> {topic (or "" unlabelled): value}."""
    status, headers, body = http_answer(server, "/offloader/metrics", token)
    assert status == 200, f"/offloader/metrics: {status} {body[:1000]}"
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        family.name: {s.labels.get("topic", ""): s.value for s in family.samples}
        for family in text_string_to_metric_families(body)
    }


@pytest.mark.usefixtures("airflow_db")
def test_a_dag_runs_metrics_at_the_route_equal_offloader_status(
    scraped_server: tuple[AirflowServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, token = scraped_server
    with Runtime.open(server.settings) as rt:
        make_topic(rt, "orders", offload_threshold_bytes=100_000)  # the newest stays hot
        make_topic(rt, "clicks")  # the default policy keeps these hot
        orders = produce_ledgers(rt, "orders", [(40, 5000)] * 5, seed=3)
        produce_ledgers(rt, "clicks", [(10, 100)] * 2, seed=4)
    before = scrape(server, token)
    assert before["offloader_tiered_size_bytes"] == {"orders": 0, "clicks": 0}
    assert before["offloader_offload_lag_ledgers"] == {"orders": 5, "clicks": 2}

    for name, value in connection_env(server.settings).items():
        monkeypatch.setenv(name, value)
    run = DagFile("offload_ledgers").test(run_conf={"batch_size": 2})
    assert str(run.state) == "success", task_states(run)
    assert return_value(run, "summary")["offloaded"] == 4
    with Runtime.open(server.settings) as rt:
        # the first ledger trimmed: its two objects wait in the deletion queue
        trim_topic(rt, "orders", Position(ledger_id=orders[1], entry_id=0))
        ledgers = rt.metadata.list_ledgers("orders")
    moved = [x for x in ledgers if x.is_offloaded]
    assert [x.ledger_id for x in moved] == orders[:4]

    metrics = scrape(server, token)
    status = json.loads(run_cli(server.settings, "status", "--json").stdout)
    tiers = {t["topic"]: t for t in status["tiers"]}
    assert sorted(tiers) == ["clicks", "orders"]
    for family, field in STATUS_FIELDS.items():
        assert metrics[family] == {t: float(v[field]) for t, v in tiers.items()}, family
    assert metrics["offloader_deletion_queue_keys"] == {"": status["deletion_backlog"]["pending"]}
    # and what the rows say, so the two cannot agree on a wrong figure
    data = sum(x.data_len or 0 for x in moved)
    assert metrics["offloader_tiered_size_bytes"]["orders"] == data > 0
    assert metrics["offloader_tiered_ledgers"]["orders"] == 4  # the trimmed one until GC
    assert metrics["offloader_deletion_backlog_keys"]["orders"] == 2
    assert metrics["offloader_hot_size_bytes"]["orders"] == ledgers[4].size_bytes
    assert metrics["offloader_offload_lag_ledgers"] == {"orders": 1, "clicks": 2}

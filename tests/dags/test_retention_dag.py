"""The retention DAG end to end through Airflow (dag.test()), on both pairings."""

from __future__ import annotations

import pytest

from fixtures.airflow import DagFile, return_value, task_states
from fixtures.backends import make_topic, produce_ledgers, unaccounted_objects
from fixtures.metadata import pending_deletions
from offloader.metadata import DeletionState
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import TopicReader
from offloader.retention.cuts import take_cut
from offloader.runtime import Runtime


@pytest.fixture
def retention_dag() -> DagFile:
    return DagFile("retention")


def deletion_queue_events(run) -> int:  # type: ignore[no-untyped-def]
    """Asset events of the deletion queue emitted by ``run``'s tasks."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    with create_session() as session:
        return (
            session.query(AssetEvent)
            .filter(AssetEvent.source_dag_id == run.dag_id, AssetEvent.source_run_id == run.run_id)
            .count()
        )


def two_topics(rt: Runtime) -> list[int]:
    """'orders': four ledgers, the first two offloaded with hot copies gone, a cut before
    each and at the end (what earlier runs would have taken); 'clicks': no retention.
    Returns the ids of 'orders'."""
    make_topic(rt, "orders")
    make_topic(rt, "clicks")
    ids = []
    for seed in range(4):
        take_cut(rt, "orders")
        ids += produce_ledgers(rt, "orders", [(10, 2000)], seed=seed)
    take_cut(rt, "orders")
    produce_ledgers(rt, "clicks", [(5, 100)])
    LedgerOffloader(rt).offload_topic("orders", up_to=ids[1])
    delete_hot_copies(rt.metadata, rt.hot, "orders")
    return ids


def state_of(rt: Runtime) -> tuple:
    """Everything a run that must change nothing could touch."""
    return (
        rt.metadata.list_topics(),
        {t: rt.metadata.list_ledgers(t) for t in ("orders", "clicks")},
        {t: rt.metadata.retention.list_cuts(t) for t in ("orders", "clicks")},
        pending_deletions(rt.metadata),
    )


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_scheduled_run_cuts_every_topic_and_applies_each_policy(
    runtime: Runtime, retention_dag
) -> None:
    rt = runtime
    ids = two_topics(rt)
    sizes = [x.size_bytes for x in rt.metadata.list_ledgers("orders")]
    orders = rt.metadata.get_topic("orders")
    # keep at least the newest ledger and one byte more: the two newest stay (LUB)
    rt.metadata.set_policy(orders, orders.policy.updated({"retention_size_bytes": sizes[-1] + 1}))
    before = TopicReader(rt).checksum("clicks")

    run = retention_dag.test(run_conf={})
    assert str(run.state) == "success", task_states(run)
    assert task_states(run)["apply_retention"] == ["success"] * 2
    summary = return_value(run, "summary")
    assert summary["trimmed"] == ["orders"] and summary["topics"] == 2
    assert summary["ledgers_deleting"] == 2 and summary["queued_keys"] == 4
    assert len(rt.metadata.retention.list_cuts("clicks")) == 1  # retention cut generation
    assert len(rt.metadata.retention.list_cuts("orders")) == 6
    ledgers = rt.metadata.list_ledgers("orders")
    assert [x.deletion_state for x in ledgers] == [DeletionState.DELETING] * 2 + [
        DeletionState.NONE
    ] * 2
    assert rt.metadata.get_topic("orders").start.ledger_id == ids[2]
    assert TopicReader(rt).checksum("clicks") == before
    assert unaccounted_objects(rt) == set()
    assert deletion_queue_events(run) == 2  # one per apply task: garbage_collection wakes

    again = retention_dag.test(run_conf={})
    assert str(again.state) == "success", task_states(again)
    assert return_value(again, "summary")["trimmed"] == []
    assert rt.metadata.list_ledgers("orders") == ledgers


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_manual_trim_at_a_cut_and_a_dry_run_at_a_position(runtime: Runtime, retention_dag) -> None:
    rt = runtime
    ids = two_topics(rt)
    before = state_of(rt)
    dry = retention_dag.test(
        run_conf={"topic": "orders", "position": f"{ids[3]}:0", "dry_run": True}
    )
    assert str(dry.state) == "success", task_states(dry)
    assert (
        return_value(dry, "summary")["ledgers_deleting"] == 3
        and return_value(dry, "summary")["dry_run"]
    )
    assert state_of(rt) == before

    cut = take_cut(rt, "orders")
    produce_ledgers(rt, "orders", [(3, 100)])  # the cut is no longer the end
    run = retention_dag.test(run_conf={"topic": "orders", "cut_id": cut.cut_id})
    assert str(run.state) == "success", task_states(run)
    assert return_value(run, "summary")["trimmed"] == ["orders"]
    assert rt.metadata.get_topic("orders").start == cut.position
    assert len(rt.metadata.retention.list_cuts("orders")) == 6  # a trim takes no cut
    assert all(
        x.deletion_state is DeletionState.DELETING for x in rt.metadata.list_ledgers("orders")[:4]
    )


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"retention_size_bytes": -1, "topic": "orders"}, "retention_size_bytes"),
        ({"topic": "orders", "position": "12-0"}, "position"),
        ({"dry_run": "maybe"}, "dry_run"),
        ({"cut_id": -3, "topic": "orders"}, "cut_id"),
    ],
)
@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_params_out_of_schema_are_refused_before_anything_changes(
    runtime: Runtime, retention_dag, conf, message
) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    two_topics(runtime)
    before = state_of(runtime)
    with pytest.raises(ParamValidationError, match=message):
        retention_dag.test(run_conf=conf)
    assert state_of(runtime) == before


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"topic": "nope"}, "topic 'nope' does not exist"),
        ({"topic": "orders", "cut_id": 999}, "cut 999 of topic 'orders' does not exist"),
        ({"topic": "orders", "position": "999:0"}, "beyond the end of topic 'orders'"),
        ({"position": "1:0"}, "needs a topic"),
        ({"topic": "orders", "cut_id": 1, "position": "1:0"}, "not both"),
        (
            {"topic": "orders", "retention_size_bytes": 50},
            "offload_threshold_bytes (100) must be below retention_size_bytes (50)",
        ),
    ],
)
@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_bad_params_fail_the_plan_with_a_clear_message_and_change_nothing(
    runtime: Runtime, retention_dag, capfd, conf, message
) -> None:
    two_topics(runtime)
    orders = runtime.metadata.get_topic("orders")
    runtime.metadata.set_policy(orders, orders.policy.updated({"offload_threshold_bytes": 100}))
    before = state_of(runtime)
    run = retention_dag.test(run_conf=conf, retries=False)
    assert str(run.state) == "failed"
    states = task_states(run)
    assert states["plan"] == ["failed"]
    assert states["retention_cut_generation"] == ["upstream_failed"]
    out, err = capfd.readouterr()
    assert message in out + err
    assert state_of(runtime) == before


def test_tasks_that_may_queue_deletions_list_the_deletion_queue(airflow_db: str) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from fixtures.airflow import DAGS
    from offloader_airflow.assets import DELETION_QUEUE

    bag = DagBag(dag_folder=str(DAGS))
    for dag_id, task_id in (
        ("retention", "apply_retention"),
        ("offload_ledgers", "offload"),
        ("offload_ledgers", "delete_hot_copies"),
    ):
        assert DELETION_QUEUE in bag.get_dag(dag_id).get_task(task_id).outlets, (dag_id, task_id)
    retention = bag.get_dag("retention")
    assert retention.max_active_runs == 1 and not retention.catchup
    for task_id in ("plan", "retention_cut_generation", "summary"):
        assert not retention.get_task(task_id).outlets


def test_the_plan_operator_templates_every_request_field() -> None:
    from offloader.retention.params import RetentionParams
    from offloader_airflow.retention_operators import PlanRetentionOperator

    assert tuple(PlanRetentionOperator.template_fields) == (
        "offloader_conn_id",
        "aws_conn_id",
        *RetentionParams.model_fields,
    )


def test_tasks_that_commit_offloads_list_the_offloaded_ledgers(airflow_db: str) -> None:
    """One asset per concern: both offload DAGs' offload tasks, and nothing else."""
    from airflow.dag_processing.dagbag import DagBag

    from fixtures.airflow import DAGS
    from offloader_airflow.assets import DELETION_QUEUE, OFFLOADED_LEDGERS

    bag = DagBag(dag_folder=str(DAGS))
    updating = {
        (dag.dag_id, task.task_id)
        for dag in bag.dags.values()
        for task in dag.tasks
        if OFFLOADED_LEDGERS in task.outlets
    }
    assert updating == {("offload_ledgers", "offload"), ("offload_historical", "offload")}
    assert DELETION_QUEUE in bag.get_dag("offload_historical").get_task("offload").outlets

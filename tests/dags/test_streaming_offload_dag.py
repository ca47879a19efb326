"""streaming_offload end to end through Airflow, on both backends (SeaweedFS + PostgreSQL too)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from fixtures.airflow import DagFile, return_value, task_states, xcom_values
from fixtures.backends import make_topic, produce_ledgers
from offloader.metadata.records import HotState, SegmentState
from offloader.metadata.schema import streams
from offloader.params import RunParamsError, form_schema
from offloader.read.topic_reader import TopicReader
from offloader.runtime import Runtime
from offloader.stream.params import StreamRunParams
from offloader_airflow.stream_operators import PlanStreamOperator, StreamPassOperator

AIRFLOW = pytest.mark.usefixtures("airflow_db", "airflow_connections")


@pytest.fixture
def stream_dag() -> DagFile:
    return DagFile("streaming_offload")


def part_size(runtime: Runtime) -> int:
    """The smallest part the store takes, at least 64 KiB (the streamer's smallest block)."""
    return max(64 * 1024, runtime.objects.capabilities.min_part_size)


def streaming_topic(runtime: Runtime, name: str = "events") -> None:
    make_topic(runtime, name, streaming=True, min_part_bytes=part_size(runtime))


def stream_rows(runtime: Runtime) -> list[dict]:
    with runtime.metadata.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(streams)).mappings()]


def result_of(run) -> list[dict]:  # type: ignore[no-untyped-def]
    """Every topic's result, from the mapped ``stream`` task (one list per map index)."""
    return [r for results in xcom_values(run, "stream", "return_value") for r in results]


def offloaded_ledgers_events(run) -> list[dict]:  # type: ignore[no-untyped-def]
    """The offloaded-ledgers asset's events ``run`` emitted (their extras)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .filter(
                AssetModel.name == "offloader_offloaded_ledgers",
                AssetEvent.source_run_id == run.run_id,
                AssetEvent.source_dag_id == run.dag_id,
            )
            .all()
        )
    return [extra for (extra,) in rows]


@AIRFLOW
def test_a_scheduled_run_streams_entries_into_segments_then_close_now_completes(
    runtime: Runtime, stream_dag
) -> None:
    streaming_topic(runtime, "events")
    make_topic(runtime, "orders")  # streaming off: not streamed unless named
    size = part_size(runtime)
    # about 2.5 parts: at least two full parts go, the tail waits in the hot tier
    ids = produce_ledgers(runtime, "events", [(30, size // 12)] * 2)
    produce_ledgers(runtime, "orders", [(10, 100)])
    before = TopicReader(runtime).checksum("events")

    run = stream_dag.test(run_conf={})
    assert str(run.state) == "success", task_states(run)
    assert return_value(run, "plan") == [{"topic": "events", "close_now": False}]
    [result] = result_of(run)
    assert result["topic"] == "events" and result["status"] == "done", result
    assert result["parts_uploaded"] >= 2 and result["committed"] == []
    assert result["waiting_bytes"] > 0 and result["settled_ledgers"] == []
    [segment] = runtime.metadata.segments.of_topic("events")
    assert segment.state is SegmentState.ASSIGNED and segment.end is not None
    assert result["open_segment"] == segment.segment_id
    assert result["offloaded_to"] == str(segment.end)
    assert segment.data_len == result["bytes_uploaded"]
    assert runtime.metadata.segments.of_topic("orders") == []
    # the owner names the try of the task instance (a retry is another owner)
    [row] = stream_rows(runtime)
    assert row["owner"] == f"airflow:streaming_offload/stream[0]/{run.run_id}/try-1"
    assert row["lease_until_ms"] is None  # released at the end of the pass
    assert offloaded_ledgers_events(run) == []  # nothing settled, no event

    closed = stream_dag.test(run_conf={"close_now": True})
    assert str(closed.state) == "success", task_states(closed)
    [result] = result_of(closed)
    assert result["committed"] == [segment.segment_id], result
    assert result["settled_ledgers"] == ids and result["hot_deleted"] == ids  # lag 0
    [segment] = runtime.metadata.segments.of_topic("events")
    assert segment.state is SegmentState.OFFLOADED
    ledgers = runtime.metadata.list_ledgers("events")
    assert all(x.is_offloaded and x.hot_state is HotState.DELETED for x in ledgers)
    assert TopicReader(runtime).checksum("events") == before  # read back from the segment
    [event] = offloaded_ledgers_events(closed)
    assert event["streamed"]["events"]["committed"] == [segment.segment_id]


@AIRFLOW
def test_close_now_completes_a_small_segment(runtime: Runtime, stream_dag) -> None:
    streaming_topic(runtime, "events")
    make_topic(runtime, "orders")
    produce_ledgers(runtime, "events", [(10, 100)])

    waiting = stream_dag.test(run_conf={"topic": "events"})
    assert str(waiting.state) == "success", task_states(waiting)
    [result] = result_of(waiting)
    assert result["parts_uploaded"] == 0 and result["waiting_bytes"] > 0, result
    [segment] = runtime.metadata.segments.of_topic("events")
    assert segment.state is SegmentState.ASSIGNED and segment.end is None

    closed = stream_dag.test(run_conf={"topic": "events", "close_now": True})
    assert str(closed.state) == "success", task_states(closed)
    [result] = result_of(closed)
    assert result["committed"] == [segment.segment_id] and result["parts_uploaded"] == 1
    [segment] = runtime.metadata.segments.of_topic("events")
    assert segment.state is SegmentState.OFFLOADED

    # a topic with streaming off may be named: nothing open, so nothing to do
    named = stream_dag.test(run_conf={"topic": "orders", "close_now": True})
    assert str(named.state) == "success", task_states(named)
    assert [(r["topic"], r["status"]) for r in result_of(named)] == [("orders", "done")]
    assert runtime.metadata.segments.of_topic("orders") == []


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"nope": 1}, "unknown run parameter(s) ['nope']; known: topic, close_now"),
        ({"topic": "missing"}, "'missing'"),
    ],
)
@AIRFLOW
def test_bad_params_fail_the_task_and_change_nothing(
    runtime: Runtime, stream_dag, capfd, conf, message
) -> None:
    streaming_topic(runtime, "events")
    produce_ledgers(runtime, "events", [(10, 100)])
    run = stream_dag.test(run_conf=conf, retries=False)
    assert str(run.state) == "failed"
    assert task_states(run) == {
        "plan": ["failed"],
        "stream": ["upstream_failed"],
        "check_service_levels": ["failed"],  # runs whatever failed above, and fails with it
    }
    out, err = capfd.readouterr()
    assert message in out + err
    assert runtime.metadata.segments.of_topic("events") == []
    assert stream_rows(runtime) == []


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"close_now": "maybe"}, "close_now"),
        ({"topic": " events"}, "topic"),
        ({"topic": "t" * 513}, "topic"),
    ],
)
@AIRFLOW
def test_bad_param_values_are_refused_before_the_run(
    runtime: Runtime, stream_dag, conf, message
) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    streaming_topic(runtime, "events")
    produce_ledgers(runtime, "events", [(10, 100)])
    with pytest.raises(ParamValidationError, match=message):
        stream_dag.test(run_conf=conf)
    assert runtime.metadata.segments.of_topic("events") == []
    assert stream_rows(runtime) == []


@AIRFLOW
def test_a_topic_held_by_another_pass_is_busy_not_failed(runtime: Runtime, stream_dag) -> None:
    streaming_topic(runtime, "events")
    produce_ledgers(runtime, "events", [(10, 100)])
    runtime.metadata.segments.claim("events", "other", 600_000)

    run = stream_dag.test(run_conf={"close_now": True})
    assert str(run.state) == "success", task_states(run)
    [result] = result_of(run)
    assert result["status"] == "busy" and "other" in result["detail"], result
    assert runtime.metadata.segments.of_topic("events") == []
    [row] = stream_rows(runtime)
    assert row["owner"] == "other" and row["epoch"] == 1


@AIRFLOW
def test_without_streaming_topics_a_run_has_nothing_to_do(runtime: Runtime, stream_dag) -> None:
    make_topic(runtime, "orders")
    produce_ledgers(runtime, "orders", [(10, 100)])
    run = stream_dag.test(run_conf={})
    assert str(run.state) == "success", task_states(run)
    assert task_states(run) == {
        "plan": ["success"],
        "stream": ["skipped"],
        "check_service_levels": ["success"],
    }
    assert runtime.metadata.segments.of_topic("orders") == [] and stream_rows(runtime) == []


def test_the_form_is_generated_from_the_model(stream_dag) -> None:
    params = stream_dag.parse().params
    assert set(params.keys()) == {"topic", "close_now"}
    for name, schema in form_schema(StreamRunParams).items():
        param = params.get_param(name)
        assert param.value == schema.pop("default")
        assert param.description == schema.pop("description")
        assert param.schema == schema
    params.validate()  # the defaults are a valid run


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"close_now": "maybe"}, "close_now: 'maybe' is not of type 'boolean'"),
        ({"topic": 7}, "topic: 7 is not of type 'null', 'string'"),
        ({"topic": "orders "}, "topic: 'orders ' does not match"),
        ({"every": True}, "unknown run parameter(s) ['every']; known: topic, close_now"),
    ],
)
def test_bad_params_get_one_line_naming_the_field(values, message) -> None:
    with pytest.raises(RunParamsError) as raised:
        StreamRunParams.parse(values)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
    # the tasks refuse them before they open the connection: as arguments (rendered from
    # Params), or as a key of the run's conf that no Param declares
    known = {k: v for k, v in values.items() if k in StreamRunParams.model_fields}
    context = {"dag_run": SimpleNamespace(conf=values)}
    for operator in (PlanStreamOperator, StreamPassOperator):
        with pytest.raises(RunParamsError, match=re.escape(message)):
            operator(task_id="t", **known).execute(context)  # type: ignore[arg-type]


def test_empty_topic_means_every_streaming_topic() -> None:
    assert StreamRunParams.parse({"topic": ""}) == StreamRunParams()
    assert StreamRunParams.parse({"topic": None, "close_now": True}).close_now is True

"""offload_historical in-process (dag.test() for one logical date) on both backends, and
the plan's window refusing what it cannot use before anything is read. The backfill
through a real scheduler is tests/dags/test_offload_historical_backfill.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fixtures.airflow import DagFile, return_value, task_states
from fixtures.backends import make_topic, produce_ledgers
from fixtures.metadata import created_at
from offloader.runtime import Runtime
from offloader_airflow.operators import PlanOffloadOperator

MARCH_2 = datetime(2026, 3, 2, tzinfo=UTC)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_a_run_offloads_the_ledgers_created_in_its_data_interval(runtime: Runtime) -> None:
    """A manual run at MARCH_2 covers the last complete day before it: March 1 (a
    backfill's runs cover the days it names; see the scheduler test)."""
    make_topic(runtime, "orders", offload_threshold_bytes=10**12)  # the policy says no
    ids = produce_ledgers(runtime, "orders", [(5, 200)] * 4)
    day, one_ms = timedelta(days=1), timedelta(milliseconds=1)
    march_1 = MARCH_2 - day
    created_at(
        runtime.metadata,
        "orders",
        {
            ids[0]: ms(march_1 - one_ms),
            ids[1]: ms(march_1),
            ids[2]: ms(MARCH_2 - one_ms),
            ids[3]: ms(MARCH_2),
        },
    )
    run = DagFile("offload_historical").test(run_conf={}, logical_date=MARCH_2)
    assert str(run.state) == "success", task_states(run)
    assert (run.data_interval_start, run.data_interval_end) == (march_1, MARCH_2)
    offloaded = [x.is_offloaded for x in runtime.metadata.list_ledgers("orders")]
    assert offloaded == [False, True, True, False]
    assert return_value(run, "summary")["offloaded"] == 2


@pytest.mark.parametrize(
    ("window", "interval", "error", "message"),
    [
        ("yesterday", (MARCH_2, MARCH_2), ValueError, "window must be None or 'data_interval'"),
        ("data_interval", (None, None), ValueError, "this run has no data interval"),
        ("data_interval", (MARCH_2, MARCH_2), ValueError, "is empty"),
        (
            "data_interval",
            (datetime(2026, 3, 2), datetime(2026, 3, 3)),
            ValueError,
            "has no timezone",
        ),
    ],
)
def test_a_window_it_cannot_use_fails_the_plan_before_anything_is_read(
    window: str, interval: tuple, error: type[Exception], message: str
) -> None:
    """No connection is defined here: the error comes before the hook is touched."""
    plan = PlanOffloadOperator(task_id="plan", window=window)
    context = {"data_interval_start": interval[0], "data_interval_end": interval[1]}
    with pytest.raises(error, match=message):
        plan.execute(context)  # type: ignore[arg-type]

"""offload_historical through Airflow's own backfill: `airflow backfill create` run by a real
scheduler (LocalExecutor), API server and dag-processor (Airflow on PostgreSQL), and the
offloader on files + SQLite.

Ledgers get known creation times across several days; a backfill of a date range must
offload exactly those created in it, a second backfill of the same range (reprocessing the
completed runs) must change nothing, and a date without ledgers must succeed doing nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fixtures.airflow import connection_env
from fixtures.airflow_scheduler import AirflowServices, airflow_services
from fixtures.backends import make_topic, produce_ledgers
from fixtures.databases import sqlite_url, upgraded
from fixtures.metadata import created_at, list_attempts
from offloader.metadata import AttemptState, Ledger
from offloader.runtime import Runtime
from offloader.settings import Settings

DAG = "offload_historical"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def at(day: int, hour: int = 0, ms: int = 0) -> int:
    """Epoch milliseconds of 2026-03-<day> <hour>:00 UTC, plus ``ms``."""
    moment = datetime(2026, 3, day, hour, tzinfo=UTC) + timedelta(milliseconds=ms)
    return int(moment.timestamp() * 1000)


def backfill(af: AirflowServices, first: str, last: str, *options: str) -> dict[str, str]:
    """Run ``airflow backfill create`` and wait for its runs to finish: the run id of each,
    by logical date, all successful."""
    # one backfill per DAG at a time: the scheduler marks the last one complete (every 30 s)
    af.wait_for(
        "the previous backfill to be marked complete",
        lambda: not af.query("SELECT 1 FROM backfill WHERE completed_at IS NULL"),
        timeout=120,
    )
    before = af.query("SELECT COALESCE(MAX(id), 0) FROM backfill")[0][0]
    af.cli("backfill", "create", "--dag-id", DAG, "--from-date", first, "--to-date", last, *options)
    (backfill_id,) = af.query("SELECT id FROM backfill WHERE id > :before", before=before)[0]
    # the CLI created (or cleared, to reprocess) every run before it returned
    runs = af.wait_for(
        f"the runs of backfill {first}..{last} to finish",
        lambda: _finished_runs(af, backfill_id),
        timeout=240,
    )
    failed = [r for r in runs if r[2] != "success"]
    assert not failed, f"runs not successful: {failed}\n{af.task_log_tail()}"
    return {str(logical)[:10]: run_id for logical, run_id, _ in runs}


def _finished_runs(af: AirflowServices, backfill_id: int) -> list[tuple] | None:
    runs = af.query(
        "SELECT logical_date, run_id, state FROM dag_run WHERE backfill_id = :id", id=backfill_id
    )
    return runs if runs and all(r[2] in ("success", "failed") for r in runs) else None


def snapshot(settings: Settings) -> dict[tuple[str, int], Ledger]:
    with Runtime.open(settings) as rt:
        return {
            (t.name, x.ledger_id): x
            for t in rt.metadata.list_topics()
            for x in rt.metadata.list_ledgers(t.name)
        }


def committed_attempts(settings: Settings) -> dict[tuple[str, int], list[str]]:
    with Runtime.open(settings) as rt:
        found: dict[tuple[str, int], list[str]] = {}
        for topic in rt.metadata.list_topics():
            for a in list_attempts(rt.metadata, topic.name):
                if a.state is AttemptState.COMMITTED:
                    found.setdefault((a.topic, a.ledger_id), []).append(a.attempt_id)
        return found


def test_backfill_offloads_exactly_its_range_and_again_changes_nothing(tmp_path: Path) -> None:
    settings = upgraded(Settings(metadata_url=sqlite_url(tmp_path), data_dir=tmp_path / "data"))
    with Runtime.open(settings) as rt:
        make_topic(rt, "orders")  # no thresholds: the policy alone would offload nothing
        make_topic(rt, "clicks")
        orders = produce_ledgers(rt, "orders", [(5, 200)] * 7)
        clicks = produce_ledgers(rt, "clicks", [(5, 200)] * 3)
        created_at(
            rt.metadata,
            "orders",
            {
                orders[0]: at(1, ms=-1),  # the last instant before the range
                orders[1]: at(1),  # the first instant of the range
                orders[2]: at(1, 12),
                orders[3]: at(3),  # 2026-03-02 has no ledgers
                orders[4]: at(4, ms=-1),  # the last instant of the range
                orders[5]: at(4),  # the first instant after it
                orders[6]: at(6, 1),
            },
        )
        created_at(
            rt.metadata, "clicks", {clicks[0]: at(1, 6), clicks[1]: at(3, 7), clicks[2]: at(5)}
        )
    in_range = {("orders", i) for i in orders[1:5]} | {("clicks", i) for i in clicks[:2]}

    home = tmp_path / "airflow"
    with airflow_services(home, [f"{DAG}.py"], connection_env(settings)) as af:
        af.wait_for(
            "the dag-processor to parse the DAG",
            lambda: af.query("SELECT 1 FROM serialized_dag WHERE dag_id = :dag", dag=DAG),
            timeout=180,
        )
        af.cli("dags", "unpause", DAG)  # runs of a paused DAG, backfills too, never start

        runs = backfill(af, "2026-03-01", "2026-03-03")
        assert sorted(runs) == ["2026-03-01", "2026-03-02", "2026-03-03"]
        ledgers = snapshot(settings)
        assert {k for k, x in ledgers.items() if x.is_offloaded} == in_range
        summaries = {day: af.xcom(run, "summary") for day, run in runs.items()}
        assert {d: (s["planned_ledgers"], s["offloaded"]) for d, s in summaries.items()} == {
            "2026-03-01": (3, 3),
            "2026-03-02": (0, 0),  # a date without ledgers succeeds doing nothing
            "2026-03-03": (3, 3),
        }
        attempts = committed_attempts(settings)
        assert {k: len(v) for k, v in attempts.items()} == dict.fromkeys(in_range, 1)
        assert {k: [ledgers[k].offload_attempt_id] for k in in_range} == attempts
        objects = sorted(p.name for p in (tmp_path / "data").rglob("*") if p.is_file())

        # the same range again, its completed runs reprocessed: nothing changes
        again = backfill(af, "2026-03-01", "2026-03-03", "--reprocess-behavior", "completed")
        assert again == runs  # Airflow clears and re-runs the same runs...
        for run in again.values():  # ...so their plan ran a second time
            assert af.query(
                "SELECT try_number FROM task_instance WHERE run_id = :run AND task_id = 'plan'",
                run=run,
            ) == [(2,)]
            summary = af.xcom(run, "summary")
            assert (summary["planned_ledgers"], summary["offloaded"]) == (0, 0)
        assert snapshot(settings) == ledgers
        assert committed_attempts(settings) == attempts
        assert sorted(p.name for p in (tmp_path / "data").rglob("*") if p.is_file()) == objects

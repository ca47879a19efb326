"""The last runs of each DAG, read from Airflow's own metadata database (read-only)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from sqlalchemy import select
from sqlalchemy.orm import Session

RUNS_PER_DAG = 5


def last_runs(
    session: Session, dag_ids: set[str], per_dag: int = RUNS_PER_DAG
) -> list[dict[str, Any]]:
    """Per DAG among ``dag_ids`` that is not stale: paused or not, its newest runs first."""
    dags = session.execute(
        select(DagModel.dag_id, DagModel.is_paused)
        .where(DagModel.dag_id.in_(dag_ids), DagModel.is_stale.is_(False))
        .order_by(DagModel.dag_id)
    ).all()
    result = []
    for dag_id, is_paused in dags:
        runs = session.scalars(
            select(DagRun)
            .where(DagRun.dag_id == dag_id)
            .order_by(DagRun.run_after.desc(), DagRun.id.desc())
            .limit(per_dag)
        )
        result.append(
            {
                "dag_id": dag_id,
                "is_paused": bool(is_paused),
                "runs": [
                    {
                        "run_id": run.run_id,
                        "run_type": str(run.run_type),
                        "state": str(run.state),
                        "run_after": _iso(run.run_after),
                        "start_date": _iso(run.start_date),
                        "end_date": _iso(run.end_date),
                    }
                    for run in runs
                ],
            }
        )
    return result


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()

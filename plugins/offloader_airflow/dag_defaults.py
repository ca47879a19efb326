"""What every offloader DAG shares, so a DAG file holds only its schedule, Params and
wiring: owner, retries with exponential backoff, no catchup, one run at a time, Params
rendered as native objects, the offloader tags; and Params made from a pydantic model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param
from pydantic import BaseModel

START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
TAGS = ("offloader", "tiered-storage")


def offloader_dag(
    dag_id: str,
    *,
    description: str,
    schedule: Any,
    doc_md: str | None,
    params: dict[str, Any],
    max_retry_delay: timedelta = timedelta(minutes=10),
    execution_timeout: timedelta = timedelta(hours=2),
    tags: tuple[str, ...] = (),
) -> DAG:
    """A DAG with the offloader's defaults; use it as ``with offloader_dag(...) as dag:``."""
    return DAG(
        dag_id=dag_id,
        description=description,
        schedule=schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args={
            "owner": "storage",
            "retries": 3,
            "retry_delay": timedelta(seconds=20),
            "retry_exponential_backoff": True,
            "max_retry_delay": max_retry_delay,
            "execution_timeout": execution_timeout,
        },
        render_template_as_native_obj=True,
        tags=[*TAGS, *tags],
        doc_md=doc_md,
        params=params,
    )


def model_params(model: type[BaseModel]) -> dict[str, Param]:
    """One Param per field of ``model``, its schema generated from the model's (optional
    fields typed ``["null", T]``), so the form checks exactly what the model checks."""
    from offloader.params import form_schema

    params = {}
    for name, schema in form_schema(model).items():
        params[name] = Param(schema.pop("default"), **schema)
    return params

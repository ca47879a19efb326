"""Thin operators over the offloader library: constructors only assign, ``execute`` calls.

Every operator is idempotent, because every library call it makes is: re-running, clearing
or retrying a task after a crash converges on the same state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.params import OffloadRunParams
from offloader.offload.planner import CreationWindow
from offloader.offload.runs import offload_batch, plan_batches, stores_written, summarize
from offloader.results import jsonable
from offloader_airflow.assets import DELETION_QUEUE, OFFLOADED_LEDGERS
from offloader_airflow.base import OffloaderBaseOperator, offloader_template_fields
from offloader_airflow.lineage import LineageMixin, from_hot_tier
from offloader_airflow.links import OffloadedObjectsLink


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{name} must be true or false, got {value!r}")


_DEFAULTS = OffloadRunParams()


class PlanOffloadOperator(OffloaderBaseOperator):
    """Validate the run's params (:class:`OffloadRunParams`, as the trigger form and
    `offloader plan` do) and cut the due ledgers into batches (the return value).

    Nothing changes here. XComs ``plan`` (every batch), ``topics`` and ``dry_run`` feed the
    later tasks; in a dry run the return value is empty, so the mapped offload has nothing
    to do. Pass a DAG's ``dag.param(...)`` (or a literal) for each argument.
    ``window="data_interval"`` plans the ledgers created inside the run's data interval,
    whatever the policy (backfills); a run without a data interval then fails saying so.
    """

    template_fields: Sequence[str] = offloader_template_fields(*OffloadRunParams.model_fields)

    def __init__(
        self,
        *,
        topic: str | None = _DEFAULTS.topic,
        up_to_ledger: int | None = _DEFAULTS.up_to_ledger,
        batch_size: int = _DEFAULTS.batch_size,
        batch_bytes: int | None = _DEFAULTS.batch_bytes,
        dry_run: bool = _DEFAULTS.dry_run,
        window: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.up_to_ledger = up_to_ledger
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.dry_run = dry_run
        self.window = window

    def execute(self, context: Context) -> list[dict[str, Any]]:
        params = OffloadRunParams.parse(
            {name: getattr(self, name) for name in OffloadRunParams.model_fields}
        )
        window = self._window(context)  # a bad window fails before anything is read
        with self.hook.get_runtime() as runtime:
            batches = plan_batches(
                runtime.metadata,
                params.topic,
                params.up_to_ledger,
                params.batch_size,
                params.batch_bytes,
                window,
            )
            topics = (
                [params.topic] if params.topic else [t.name for t in runtime.metadata.list_topics()]
            )
        plan = [b.to_json() for b in batches]
        ledgers = sum(len(b.ledger_ids) for b in batches)
        self.log.info(
            "%d ledgers due (%d bytes) in %d batches%s",
            ledgers,
            sum(b.bytes for b in batches),
            len(batches),
            " [dry run]" if params.dry_run else "",
        )
        for batch in batches:
            self.log.info("  %s: ledgers %s", batch.topic, batch.ledger_ids)
        context["ti"].xcom_push(key="plan", value=plan)
        context["ti"].xcom_push(key="topics", value=topics)
        context["ti"].xcom_push(key="dry_run", value=params.dry_run)
        return [] if params.dry_run else plan

    def _window(self, context: Context) -> CreationWindow | None:
        """The creation window the plan selects by: none, or the run's data interval."""
        if self.window is None:
            return None
        if self.window != "data_interval":
            raise ValueError(f"window must be None or 'data_interval', got {self.window!r}")
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        if start is None or end is None:
            raise ValueError(
                "this run has no data interval to offload: backfill a date range "
                "(airflow backfill create) or trigger the run with a logical date"
            )
        self.log.info("planning ledgers created in [%s, %s)", start.isoformat(), end.isoformat())
        return CreationWindow.between(start, end)


class OffloadLedgersOperator(LineageMixin, OffloaderBaseOperator):
    """Offload one batch of ledgers (map it over the plan). Returns one result per ledger.
    OpenLineage: the batch's hot topic into the stores its moved ledgers went to."""

    template_fields: Sequence[str] = offloader_template_fields("batch")
    operator_extra_links = (OffloadedObjectsLink(),)

    def __init__(self, *, batch: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch = batch

    def execute(self, context: Context) -> list[dict[str, Any]]:
        self.moved = None
        batch = self.batch
        if not isinstance(batch, dict) or "topic" not in batch or "ledger_ids" not in batch:
            raise TypeError(f"batch must be a dict with topic and ledger_ids, got {batch!r}")
        with self.hook.get_runtime() as runtime:
            results = offload_batch(runtime, batch["topic"], batch["ledger_ids"])
            self.record_moved(
                lambda: from_hot_tier(
                    self.hook,
                    runtime.settings,
                    [batch["topic"]],
                    stores_written(runtime.metadata, results),
                )
            )
            first = next((r for r in results if r.attempt_id), None)
            if first is not None:
                ledger = runtime.metadata.get_ledger(first.topic, first.ledger_id)
                if ledger.store_id is not None:  # where its offload went, not the default
                    location = runtime.metadata.get_location(ledger.store_id)
                    OffloadedObjectsLink.persist(context, location, ledger.data_key or "")
        for r in results:
            self.log.info(
                "ledger %s/%s: %s (%d bytes, %.3fs)",
                r.topic,
                r.ledger_id,
                r.outcome,
                r.bytes,
                r.seconds,
            )
        return [r.to_json() for r in results]


def offload_each_batch(plan: PlanOffloadOperator) -> Any:
    """The mapped ``offload`` task over ``plan``'s batches, as every offload DAG wires it:
    uploads bounded by the ``offload_uploads`` pool and 4 at a time per run; what it
    commits updates the offloaded-ledgers asset, a losing or stale attempt the queue."""
    return OffloadLedgersOperator.partial(
        task_id="offload",
        pool="offload_uploads",
        max_active_tis_per_dagrun=4,
        outlets=[OFFLOADED_LEDGERS, DELETION_QUEUE],
    ).expand(batch=plan.output)


class DeleteHotCopiesOperator(OffloaderBaseOperator):
    """Delete hot copies of offloaded ledgers whose deletion lag has passed (mark first).

    ``topics`` and ``dry_run`` come from the plan: ``plan.output["topics"]`` and
    ``plan.output["dry_run"]``, so the run's params are validated once, by the plan.
    """

    template_fields: Sequence[str] = offloader_template_fields("topics", "dry_run")

    def __init__(self, *, topics: list[str], dry_run: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topics = topics
        self.dry_run = dry_run

    def execute(self, context: Context) -> list[dict[str, Any]]:
        topics = list(self.topics or [])
        dry_run = _bool(self.dry_run, "dry_run")
        with self.hook.get_runtime() as runtime:
            done = [
                jsonable(d)
                for topic in topics
                for d in delete_hot_copies(runtime.metadata, runtime.hot, topic, dry_run=dry_run)
            ]
        self.log.info(
            "hot copies %s: %s",
            "due (dry run)" if dry_run else "deleted",
            [(d["topic"], d["ledger_id"]) for d in done],
        )
        return done


class OffloadSummaryOperator(BaseOperator):
    """Summarise the run from the offload tasks' results; fail the run if any batch failed."""

    def __init__(
        self,
        *,
        offload_task_id: str = "offload",
        plan_task_id: str = "plan",
        hot_task_id: str | None = "delete_hot_copies",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.offload_task_id = offload_task_id
        self.plan_task_id = plan_task_id
        self.hot_task_id = hot_task_id

    def execute(self, context: Context) -> dict[str, Any]:
        ti = context["ti"]
        plan = ti.xcom_pull(task_ids=self.plan_task_id, key="plan") or []
        dry_run = bool(ti.xcom_pull(task_ids=self.plan_task_id, key="dry_run"))
        # one map index per batch this run planned: after a clear, map indexes of an earlier
        # try that planned more batches are REMOVED but keep their XComs; they are not ours
        batches = ti.xcom_pull(task_ids=self.plan_task_id) or []
        pulled = (
            ti.xcom_pull(task_ids=self.offload_task_id, map_indexes=range(len(batches))) or []
            if batches
            else []
        )
        results = [r for batch in _as_batches(pulled) for r in batch]
        hot = (ti.xcom_pull(task_ids=self.hot_task_id) if self.hot_task_id else None) or []
        started = context["dag_run"].start_date
        elapsed = time.time() - started.timestamp() if started else None
        summary = {
            **summarize(results, elapsed),
            "planned_ledgers": sum(len(b["ledger_ids"]) for b in plan),
            "hot_copies_deleted": 0 if dry_run else len(hot),
            "dry_run": dry_run,
        }
        self.log.info("offload run summary: %s", summary)
        upstream = [self.plan_task_id, self.offload_task_id, self.hot_task_id]
        raise_if_failed(context, [t for t in upstream if t])
        return summary


def raise_if_failed(context: Context, upstream: list[str]) -> None:
    """Fail a summary task (and so its run) if any of ``upstream`` failed in this run."""
    ti = context["ti"]
    failed = ti.get_ti_count(
        dag_id=ti.dag_id,
        run_ids=[ti.run_id],
        task_ids=upstream,
        states=["failed", "upstream_failed"],
    )
    if failed:
        raise RuntimeError(
            f"{failed} task(s) of this run failed ({', '.join(upstream)}): see their logs; "
            "every task is idempotent, so clear the failed ones to retry"
        )


def _as_batches(pulled: Any) -> list[list[dict[str, Any]]]:
    """xcom_pull of a mapped task gives one list per map index (or one list if unmapped)."""
    items = list(pulled) if not isinstance(pulled, dict) else [pulled]
    if items and isinstance(items[0], dict):
        return [items]
    return [list(x) for x in items if x]

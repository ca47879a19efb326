"""Thin operators of the `retention` DAG: each validates its inputs through the library's
:class:`~offloader.retention.params.RetentionParams` (the DAG form's model) and calls one
library function.

Every call is idempotent (a cut is an observation; a trim at or below the start finishes
what a killed one left), so retrying or clearing a task converges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context

from offloader.results import jsonable
from offloader.retention.params import RetentionParams
from offloader_airflow.base import OffloaderBaseOperator, offloader_template_fields
from offloader_airflow.operators import raise_if_failed

# The rest of the library is imported in ``execute``: its metadata layer (SQLAlchemy,
# Alembic) would add to every DAG parse.
_DEFAULTS = RetentionParams()


class PlanRetentionOperator(OffloaderBaseOperator):
    """Validate the run's Params against the metadata; change nothing. Returns the request
    (normalised) and the topics it acts on."""

    template_fields: Sequence[str] = offloader_template_fields(*RetentionParams.model_fields)

    def __init__(
        self,
        *,
        topic: str | None = _DEFAULTS.topic,
        cut_id: int | None = _DEFAULTS.cut_id,
        position: str | None = _DEFAULTS.position,
        retention_time_seconds: float | None = _DEFAULTS.retention_time_seconds,
        retention_size_bytes: int | None = _DEFAULTS.retention_size_bytes,
        dry_run: bool = _DEFAULTS.dry_run,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.cut_id = cut_id
        self.position = position
        self.retention_time_seconds = retention_time_seconds
        self.retention_size_bytes = retention_size_bytes
        self.dry_run = dry_run

    def execute(self, context: Context) -> dict[str, Any]:
        from offloader.retention.request import check_request

        # the form's model: every bound the trigger form shows holds here too
        given = {name: getattr(self, name) for name in RetentionParams.model_fields}
        request = RetentionParams.parse({k: v for k, v in given.items() if v is not None})
        with self.hook.get_runtime() as runtime:
            topics = check_request(runtime, request)
        self.log.info("%s run over %d topic(s): %s", request.mode, len(topics), topics)
        return {"request": request.model_dump(mode="json"), "topics": topics}


class RetentionCutsOperator(OffloaderBaseOperator):
    """Retention cut generation: one cut at the end of each topic (PDP-19), so the policy
    has positions to truncate at. A trim or a dry run takes none. Returns one work item per
    topic for the mapped apply task."""

    template_fields: Sequence[str] = offloader_template_fields("plan")

    def __init__(self, *, plan: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan

    def execute(self, context: Context) -> list[dict[str, Any]]:
        from offloader.retention.cuts import take_cut

        request = RetentionParams.model_validate(self.plan["request"])
        topics = list(self.plan["topics"])
        cuts: dict[str, int | None] = dict.fromkeys(topics)
        if request.mode == "policy" and not request.dry_run:
            with self.hook.get_runtime() as runtime:
                for topic in topics:
                    cut = take_cut(runtime, topic)
                    cuts[topic] = cut.cut_id
                    self.log.info("cut %d of %s at %s", cut.cut_id, topic, cut.position)
        return [{"topic": t, "cut_id": c, "request": self.plan["request"]} for t, c in cuts.items()]


class ApplyRetentionOperator(OffloaderBaseOperator):
    """Apply one topic's policy at its cut, or trim it at the requested position (map it
    over the cut generation's work items). List the deletion queue asset in ``outlets``."""

    template_fields: Sequence[str] = offloader_template_fields("work")

    def __init__(self, *, work: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.work = work

    def execute(self, context: Context) -> dict[str, Any]:
        from offloader.retention.request import run_request
        from offloader.retention.run import RetentionResult

        work = self.work
        if not isinstance(work, dict) or not {"topic", "cut_id", "request"} <= set(work):
            raise TypeError(f"work must be a dict with topic, cut_id and request, got {work!r}")
        request = RetentionParams.model_validate(work["request"])
        with self.hook.get_runtime() as runtime:
            end = None
            if work["cut_id"] is not None:
                end = runtime.metadata.retention.get_cut(work["topic"], work["cut_id"])
            result = run_request(runtime, request, work["topic"], end)
        if isinstance(result, RetentionResult):
            self.log.info("%s: %s", work["topic"], result)
            trim = result.trim
        else:
            self.log.info("%s: trim %r", work["topic"], result)
            trim = result
        return {
            "topic": work["topic"],
            "mode": request.mode,
            "dry_run": request.dry_run,
            "changed": bool(trim and trim.changed),
            "result": jsonable(result),
        }


class RetentionSummaryOperator(BaseOperator):
    """Summarise the run from the apply tasks' results; fail it if any task failed."""

    def __init__(
        self,
        *,
        plan_task_id: str = "plan",
        cuts_task_id: str = "retention_cut_generation",
        apply_task_id: str = "apply_retention",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.plan_task_id = plan_task_id
        self.cuts_task_id = cuts_task_id
        self.apply_task_id = apply_task_id

    def execute(self, context: Context) -> dict[str, Any]:
        pulled = context["ti"].xcom_pull(task_ids=self.apply_task_id, default=[]) or []
        results = [pulled] if isinstance(pulled, dict) else [r for r in pulled if r]
        # a policy run's trim is inside its result (None: nothing chosen); a trim run's is it
        trims = [r["result"].get("trim", r["result"]) or {} for r in results]
        summary = {
            "topics": len(results),
            "trimmed": sorted(r["topic"] for r in results if r["changed"]),
            "ledgers_deleting": sum(len(t.get("ledgers_deleting") or []) for t in trims),
            "queued_keys": sum(t.get("queued_keys") or 0 for t in trims),
            "dry_run": any(r["dry_run"] for r in results),
        }
        self.log.info("retention run summary: %s", summary)
        raise_if_failed(context, [self.plan_task_id, self.cuts_task_id, self.apply_task_id])
        return summary

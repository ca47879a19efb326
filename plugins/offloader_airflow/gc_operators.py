"""Thin operators of the ``garbage_collection`` DAG: drain the deletion queue, summarise it.

The work is the library's (``offloader.gc.run``, ``offloader.gc.deletion_queue``); these
validate the run's params (:class:`~offloader.gc.params.GcParams`, the DAG form's model),
open a Runtime from the connection, call it and log what happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from offloader.gc.deletion_queue import drain_queue
from offloader.gc.params import GcParams
from offloader.gc.run import collect_garbage
from offloader.metadata import Deletion, DeletionBacklog
from offloader_airflow.base import OffloaderBaseOperator, offloader_template_fields
from offloader_airflow.operators import raise_if_failed

_DEFAULTS = GcParams()


class DrainDeletionQueueOperator(OffloaderBaseOperator):
    """Run deletion passes until nothing more is deleted, ``max_items`` keys were taken or
    ``time_budget_seconds`` is spent. Rewrites whose lease ran out are recovered first (their
    keys join the drain, their uploads are aborted). A dry run only reports the backlog.
    Idempotent: a key leaves the queue only once the store confirmed it gone."""

    template_fields: Sequence[str] = offloader_template_fields(*GcParams.model_fields)

    def __init__(
        self,
        *,
        max_items: int = _DEFAULTS.max_items,
        time_budget_seconds: int = _DEFAULTS.time_budget_seconds,
        dry_run: bool = _DEFAULTS.dry_run,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_items = max_items
        self.time_budget_seconds = time_budget_seconds
        self.dry_run = dry_run

    def execute(self, context: Context) -> dict[str, Any]:
        # the form's model: every bound the trigger form shows holds here too
        params = GcParams.parse({name: getattr(self, name) for name in GcParams.model_fields})
        drain = partial(
            drain_queue,
            max_items=params.max_items,
            time_budget_seconds=params.time_budget_seconds,
            dry_run=params.dry_run,
        )
        with self.hook.get_runtime() as rt:
            run = collect_garbage(rt, drain, dry_run=params.dry_run)
        self.log.info("%s", run.drained)
        return run.to_json()


class DeletionQueueSummaryOperator(OffloaderBaseOperator):
    """Report the queue after the drain: backlog, oldest item's age, items that keep
    failing. Items that failed ``gc_failing_tries`` times or more fail this task (no
    retries: retrying does not fix them), so a stuck deletion shows as a failed run; so
    do items left untried because their store does not answer, and a failure of any of
    ``fail_with_task_ids`` (the drain by default)."""

    template_fields: Sequence[str] = offloader_template_fields()

    def __init__(
        self,
        *,
        drain_task_id: str = "drain",
        fail_with_task_ids: Sequence[str] = ("drain",),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.drain_task_id = drain_task_id
        self.fail_with_task_ids = list(fail_with_task_ids)

    def execute(self, context: Context) -> dict[str, Any]:
        drained = context["ti"].xcom_pull(task_ids=self.drain_task_id) or {}
        with self.hook.get_runtime() as rt:
            backlog = rt.metadata.deletions.backlog(rt.settings.gc_failing_tries)
        summary = {
            "deleted": drained.get("deleted", 0),
            "failed": drained.get("failed", 0),
            "delete_requests": drained.get("delete_requests", 0),
            "stopped": drained.get("stopped", f"{self.drain_task_id} did not finish"),
            "dry_run": drained.get("dry_run", False),
            "backlog": backlog.pending,
            "due": backlog.due,
            "oldest_age_seconds": _seconds(backlog.oldest_age_ms),
            "failing_count": backlog.failing_count,
            "failing": [_failing(d) for d in backlog.failing],
            "skipped": drained.get("skipped", 0),
            "skipped_stores": drained.get("skipped_stores", []),
        }
        self.log.info("garbage collection summary: %s", summary)
        if backlog.failing_count:
            raise AirflowFailException(_failing_message(backlog))
        if summary["skipped"]:
            # the rest drained; these rows wait for a store that does not answer
            raise AirflowFailException(_skipped_message(summary))
        raise_if_failed(context, self.fail_with_task_ids)
        return summary


def _skipped_message(summary: dict[str, Any]) -> str:
    return (
        f"{summary['skipped']} queued deletion(s) stay queued, untried: their store does not "
        f"answer ({'; '.join(summary['skipped_stores'])}); fix its connection, or retire it "
        "with `offloader store retire` (OPERATIONS.md, a store that stops answering)"
    )


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else round(ms / 1000, 3)


def _failing(d: Deletion) -> dict[str, Any]:
    return {
        "object_key": d.object_key,
        "store_id": d.store_id,
        "tries": d.tries,
        "last_error": d.last_error,
        "reason": d.reason,
    }


def _failing_message(backlog: DeletionBacklog) -> str:
    shown = "; ".join(f"{d.object_key} ({d.tries} tries): {d.last_error}" for d in backlog.failing)
    more = backlog.failing_count - len(backlog.failing)
    return (
        f"{backlog.failing_count} queued deletion(s) failed >= {backlog.failing_tries} times "
        f"and stay queued: {shown}{f'; and {more} more' if more else ''}. See `offloader "
        "status` and OPERATIONS.md (garbage collection: failing deletions)"
    )

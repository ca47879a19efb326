"""The service-level check, the last task of the ``garbage_collection`` and
``streaming_offload`` DAGs: the library's check (``offloader.metrics.service_levels``),
failing the task with one line per breach so that the task's and the DAG's failure
callbacks, and e-mail on failure, fire (docs/OPERATIONS.md, "Service levels and alerts").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException

from offloader.metrics.service_levels import ServiceLevelBreach, read_service_levels
from offloader_airflow.base import OffloaderBaseOperator, offloader_template_fields
from offloader_airflow.operators import _bool, raise_if_failed


class CheckServiceLevelsOperator(OffloaderBaseOperator):
    """Check the service levels (the ``max_*`` fields of each topic's policy) of ``topic``,
    or of every topic (``streaming_only``: every streaming topic); returns the report.

    A breach raises ``AirflowFailException``: the task fails at once, without retries, and
    its failure callbacks fire. Retrying would not help: a lag is a state, not a fault of
    this try; a few seconds later it is the same or larger, and retries would only hold the
    alert back by their delays. A failure to read the metadata is an ordinary error,
    retried like any other task's.

    Meant to run last with ``trigger_rule=ALL_DONE``: when a run's work failed is when its
    lags grow, so the check still runs; then it fails too if any of
    ``fail_with_task_ids`` failed, so the run's state still shows their failure. Reads the
    metadata only: no object-store request.
    """

    template_fields: Sequence[str] = offloader_template_fields("topic", "streaming_only")

    def __init__(
        self,
        *,
        topic: str | None = None,
        streaming_only: bool = False,
        fail_with_task_ids: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.streaming_only = streaming_only
        self.fail_with_task_ids = list(fail_with_task_ids)

    def execute(self, context: Context) -> dict[str, Any]:
        streaming_only = _bool(self.streaming_only, "streaming_only")
        report = read_service_levels(
            self.hook.get_settings(), self.topic or None, streaming_only=streaming_only
        )
        self.log.info("%s", report)
        if not report.ok:
            raise AirflowFailException(_breach_message(report.breaches))
        raise_if_failed(context, self.fail_with_task_ids)
        return report.to_json()


def _breach_message(breaches: Sequence[ServiceLevelBreach]) -> str:
    """The lines the failure callbacks and e-mail carry: a count, then one per breach."""
    return "\n".join([f"{len(breaches)} service level(s) breached:", *map(str, breaches)])

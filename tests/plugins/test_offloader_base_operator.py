"""Every offloader operator templates both connection ids and builds one hook from the
rendered ones (the amazon provider's AwsBaseOperator pattern)."""

from __future__ import annotations

import pytest

from offloader_airflow.base import OffloaderBaseOperator
from offloader_airflow.gc_operators import DeletionQueueSummaryOperator, DrainDeletionQueueOperator
from offloader_airflow.maintenance_operators import ExportMetadataOperator, SweepOrphansOperator
from offloader_airflow.operators import (
    DeleteHotCopiesOperator,
    OffloadLedgersOperator,
    PlanOffloadOperator,
)
from offloader_airflow.retention_operators import (
    ApplyRetentionOperator,
    PlanRetentionOperator,
    RetentionCutsOperator,
)

HOOKED = (
    PlanOffloadOperator,
    OffloadLedgersOperator,
    DeleteHotCopiesOperator,
    DrainDeletionQueueOperator,
    DeletionQueueSummaryOperator,
    SweepOrphansOperator,
    ExportMetadataOperator,
    PlanRetentionOperator,
    RetentionCutsOperator,
    ApplyRetentionOperator,
)


@pytest.mark.parametrize("operator", HOOKED, ids=lambda c: c.__name__)
def test_every_operator_templates_the_connection_ids(operator: type) -> None:
    assert issubclass(operator, OffloaderBaseOperator)
    fields = list(operator.template_fields)
    assert fields[:2] == ["offloader_conn_id", "aws_conn_id"]
    assert len(fields) == len(set(fields))


def test_the_hook_is_built_once_from_the_rendered_ids() -> None:
    operator = SweepOrphansOperator(
        task_id="sweep",
        offloader_conn_id="{{ params.offloader }}",
        aws_conn_id="{{ params.aws }}",
        dry_run=True,
    )
    operator.render_template_fields({"params": {"offloader": "off_b", "aws": "aws_b"}})  # type: ignore[arg-type]
    hook = operator.hook
    assert hook is operator.hook
    assert hook.offloader_conn_id == "off_b"
    assert hook.aws_conn_id == "aws_b"  # overrides whatever the offloader connection names

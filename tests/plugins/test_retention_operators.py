"""The retention plan task checks its params with the retention form's model
(RetentionParams): what the form refuses, the task refuses too, with one line naming the
field, before it opens a runtime (so before anything is read or changed)."""

from __future__ import annotations

import pytest

from offloader.params import RunParamsError
from offloader.retention.params import RetentionParams
from offloader_airflow.retention_operators import PlanRetentionOperator


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"topic": "t", "position": "3 : 7"}, "position: '3 : 7' does not match "),
        ({"topic": "t", "cut_id": -1}, "cut_id: -1 is less than the minimum of 0"),
        ({"topic": "t" * 513}, "topic: '" + "t" * 513 + "' is too long"),
        ({"topic": "t", "retention_size_bytes": -1}, "retention_size_bytes: -1 is less than"),
        ({"position": "1:0"}, "a trim at a cut or a position needs a topic"),
    ],
)
def test_the_plan_refuses_what_the_form_refuses_before_anything_changes(
    given: dict[str, object], message: str
) -> None:
    operator = PlanRetentionOperator(task_id="plan", **given)  # type: ignore[arg-type]
    with pytest.raises(RunParamsError) as raised:
        operator.execute({})  # type: ignore[arg-type]  # refused before any context use
    assert message in str(raised.value)
    assert "hook" not in operator.__dict__  # no connection looked up, no runtime opened


def test_the_plan_takes_the_forms_defaults() -> None:
    operator = PlanRetentionOperator(task_id="plan")
    values = {name: getattr(operator, name) for name in RetentionParams.model_fields}
    assert RetentionParams.parse(values) == RetentionParams()

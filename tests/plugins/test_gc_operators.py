"""The drain task checks its params with the garbage_collection form's model (GcParams):
what the form refuses, the task refuses too, with one line naming the field, before it
opens a runtime (so before anything is read or changed)."""

from __future__ import annotations

import pytest

from offloader.gc.params import GcParams
from offloader.params import RunParamsError
from offloader_airflow.dag_defaults import model_params
from offloader_airflow.gc_operators import DrainDeletionQueueOperator


def form_error(name: str, value: object) -> str:
    """What the trigger form (Airflow's Param validation) says about ``value``."""
    from airflow.sdk.definitions.param import ParamValidationError

    with pytest.raises(ParamValidationError) as raised:
        model_params(GcParams)[name].resolve(value)
    return str(raised.value).splitlines()[0]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("max_items", 0, "0 is less than the minimum of 1"),
        ("max_items", 10_000_001, "10000001 is greater than the maximum of 10000000"),
        ("time_budget_seconds", 0, "0 is less than the minimum of 1"),
        ("time_budget_seconds", 3301, "3301 is greater than the maximum of 3300"),
        ("dry_run", "maybe", "'maybe' is not of type 'boolean'"),
    ],
)
def test_the_drain_refuses_what_the_form_refuses_before_anything_changes(
    name: str, value: object, message: str
) -> None:
    operator = DrainDeletionQueueOperator(task_id="drain", **{name: value})
    with pytest.raises(RunParamsError) as raised:
        operator.execute({})  # type: ignore[arg-type]  # refused before any context use
    assert str(raised.value) == f"{name}: {message}"
    assert "hook" not in operator.__dict__  # no connection looked up, no runtime opened
    assert form_error(name, value) == message


def test_the_drain_takes_the_forms_defaults() -> None:
    operator = DrainDeletionQueueOperator(task_id="drain")
    values = {name: getattr(operator, name) for name in GcParams.model_fields}
    assert GcParams.parse(values) == GcParams()
    assert tuple(operator.template_fields[2:]) == tuple(GcParams.model_fields)

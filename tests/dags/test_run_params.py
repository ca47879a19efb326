"""One source of truth for an offload run's parameters, and trigger forms that work.

`offloader plan`, the plan operator and the `offload_ledgers` trigger form all check run
params against the JSON schema generated from OffloadRunParams: the same bad value gets the
same message from all three. Every DAG's form accepts what its help text promises.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fixtures.cli import assert_one_line_error, run_cli, run_cli_json, upgraded_data_dir
from offloader.offload.params import OffloadRunParams
from offloader.params import RunParamsError, form_schema
from offloader_airflow.operators import PlanOffloadOperator

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dags() -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    return bag.dags


def form_error(dags: dict[str, Any], name: str, value: Any) -> str:
    """What the trigger form (Airflow's Param validation) says about ``value``."""
    from airflow.sdk.definitions.param import ParamValidationError

    param = dags["offload_ledgers"].params.get_param(name)
    with pytest.raises(ParamValidationError) as raised:
        param.resolve(value)
    return str(raised.value).splitlines()[0]


@pytest.mark.parametrize(
    ("name", "value", "flag", "message"),
    [
        ("batch_size", 0, "--batch-size", "0 is less than the minimum of 1"),
        ("batch_size", 10_001, "--batch-size", "10001 is greater than the maximum of 10000"),
        ("up_to_ledger", -1, "--up-to", "-1 is less than the minimum of 0"),
        ("batch_bytes", 0, "--batch-bytes", "0 is less than the minimum of 1"),
        ("topic", "t" * 513, "--topic", f"'{'t' * 513}' is too long"),
    ],
)
def test_the_cli_the_operator_and_the_form_say_the_same(
    tmp_path: Path, dags: dict[str, Any], name: str, value: Any, flag: str, message: str
) -> None:
    data_dir = upgraded_data_dir(tmp_path / "data")
    done = run_cli(data_dir, "plan", flag, str(value), ok=False)
    assert assert_one_line_error(done) == f"error: {name}: {message}"

    operator = PlanOffloadOperator(task_id="plan", **{name: value})
    with pytest.raises(RunParamsError) as raised:
        operator.execute({})  # type: ignore[arg-type]  # refused before any context use
    assert str(raised.value) == f"{name}: {message}"

    assert form_error(dags, name, value) == message


def test_the_form_is_generated_from_the_model(dags: dict[str, Any]) -> None:
    params = dags["offload_ledgers"].params
    assert set(params.keys()) == set(OffloadRunParams.model_fields)
    for name, schema in form_schema(OffloadRunParams).items():
        param = params.get_param(name)
        assert param.value == schema.pop("default")
        assert param.description == schema.pop("description")
        assert param.schema == schema


def test_the_cli_plans_with_the_models_defaults(tmp_path: Path) -> None:
    data_dir = upgraded_data_dir(tmp_path / "data")
    run_cli(data_dir, "topic", "create", "orders")
    planned = run_cli_json(data_dir, "plan")
    assert planned == {"params": OffloadRunParams().model_dump(), "batches": []}
    planned = run_cli_json(data_dir, "plan", "--topic", " orders ", "--no-byte-limit")
    assert planned["params"]["topic"] == "orders" and planned["params"]["batch_bytes"] is None
    done = run_cli(data_dir, "plan", "--topic", "nope", ok=False)
    assert_one_line_error(done, "'nope'")


def test_the_operator_takes_the_models_defaults() -> None:
    operator = PlanOffloadOperator(task_id="plan")
    values = {name: getattr(operator, name) for name in OffloadRunParams.model_fields}
    assert OffloadRunParams.parse(values) == OffloadRunParams()


@pytest.mark.parametrize(
    "dag_id",
    [
        "offload_ledgers",
        "offload_historical",
        "retention",
        "garbage_collection",
        "bulk_export",
        "scrub",
        "bulk_rewrite",
        "streaming_offload",
    ],
)
def test_every_form_accepts_what_its_help_promises(dags: dict[str, Any], dag_id: str) -> None:
    """The defaults are a valid run; a field whose help says it may stay empty takes None
    (the UI sends null for an empty field: an empty string counts as missing)."""
    params = dags[dag_id].params
    params.validate()  # the defaults as the form starts
    for name in params:
        param = params.get_param(name)
        assert param.value != "", f"{dag_id}.{name}: an empty string default reads as missing"
        if "empty" in (param.description or "").lower():
            assert "null" in param.schema["type"], f"{dag_id}.{name} promises empty"
            assert param.resolve(None) is None

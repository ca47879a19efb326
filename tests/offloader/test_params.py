"""The run parameters' JSON schema and their parsing, at the library level.

The DAG tests (tests/dags/test_run_params.py) check that Airflow's form, the CLI and the
operator agree; these pin the schema the three are built from and the messages of
``RunParams.parse`` without Airflow, so they run in the fast selection too.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import Field

from offloader import params
from offloader.bulk.params import ExportParams
from offloader.offload.params import OffloadRunParams
from offloader.params import RunParams, RunParamsError, form_schema
from offloader.rewrite.params import RewriteParams
from offloader.scrub.params import ScrubParams


@pytest.fixture(autouse=True)
def _generated_afresh() -> None:
    """Each test generates the schemas it reads: a schema cached by an earlier test (or
    by anything run before in this process) would keep the generator out of its sight."""
    params._field_schemas.cache_clear()


def test_optional_fields_are_typed_nullable_for_the_form() -> None:
    schema = form_schema(OffloadRunParams)
    assert schema == {
        "topic": {
            "default": None,
            "description": "Offload this topic only; leave empty for every topic.",
            "maxLength": 512,
            "title": "Topic",
            "type": ["null", "string"],
        },
        "up_to_ledger": {
            "default": None,
            "description": "Offload every sealed ledger with an id <= this, whatever the "
            "policy; leave empty to follow each topic's policy.",
            "minimum": 0,
            "title": "Offload up to ledger",
            "type": ["null", "integer"],
        },
        "dry_run": {
            "default": False,
            "description": "Plan and log what would move and what would be deleted; change "
            "nothing.",
            "title": "Dry run",
            "type": "boolean",
        },
        "batch_size": {
            "default": 500,
            "description": "Due ledgers are offloaded in mapped tasks of at most this many.",
            "maximum": 10000,
            "minimum": 1,
            "title": "Ledgers per task",
            "type": "integer",
        },
        "batch_bytes": {
            "default": 1 << 30,
            "description": "A task takes ledgers up to this many bytes (a larger ledger "
            "alone); empty: no byte limit.",
            "minimum": 1,
            "title": "Bytes per task",
            "type": ["null", "integer"],
        },
    }


class _UnionParams(RunParams):
    either: int | str | None = Field(default=None, description="a union has no single type")


def test_a_nullable_union_keeps_pydantics_any_of() -> None:
    """Only a single inner type can become ``["null", T]``; a union stays ``anyOf``."""
    (schema,) = form_schema(_UnionParams).values()
    assert schema["anyOf"] == [{"type": "integer"}, {"type": "string"}, {"type": "null"}]
    assert "type" not in schema
    assert _UnionParams.parse({"either": "x"}).either == "x"


def test_form_schema_hands_out_copies() -> None:
    form_schema(OffloadRunParams)["topic"]["default"] = "changed"
    form_schema(OffloadRunParams)["batch_size"].pop("maximum")
    assert form_schema(OffloadRunParams)["topic"]["default"] is None
    assert form_schema(OffloadRunParams)["batch_size"]["maximum"] == 10000


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"batch_size": 0}, "batch_size: 0 is less than the minimum of 1"),
        ({"batch_size": 10_001}, "batch_size: 10001 is greater than the maximum of 10000"),
        ({"up_to_ledger": -1}, "up_to_ledger: -1 is less than the minimum of 0"),
        ({"batch_bytes": 0}, "batch_bytes: 0 is less than the minimum of 1"),
        ({"dry_run": "yes"}, "dry_run: 'yes' is not of type 'boolean'"),
        ({"topic": 5}, "topic: 5 is not of type 'null', 'string'"),
        (
            {"colour": 1, "batch_size": 3, "aardvark": 2},
            "unknown run parameter(s) ['aardvark', 'colour']; known: topic, up_to_ledger, "
            "dry_run, batch_size, batch_bytes",
        ),
    ],
)
def test_parse_names_the_bad_parameter(values: dict[str, Any], message: str) -> None:
    with pytest.raises(RunParamsError) as raised:
        OffloadRunParams.parse(values)
    assert str(raised.value) == message


def test_parse_takes_defaults_and_normalises() -> None:
    assert OffloadRunParams.parse({}) == OffloadRunParams()
    parsed = OffloadRunParams.parse({"topic": "  orders ", "batch_bytes": None, "dry_run": True})
    assert (parsed.topic, parsed.batch_bytes, parsed.dry_run) == ("orders", None, True)
    assert OffloadRunParams.parse({"topic": "   "}).topic is None  # blank means every topic
    assert OffloadRunParams.parse({"batch_size": 10_000}).batch_size == 10_000


def test_topic_names_are_stripped_1_to_512_characters_and_deduplicated() -> None:
    """The ``topics`` rule the scrub, export and rewrite runs share."""
    longest = "t" * 512
    assert params.topic_names([f" {longest} ", "a", "a "]) == [longest, "a"]
    assert params.topic_names([]) is None and params.topic_names(None) is None
    for bad in (["a", "  "], ["t" * 513]):
        with pytest.raises(ValueError) as raised:
            params.topic_names(bad)
        assert str(raised.value) == "topic names must be 1 to 512 characters, not blank"


@pytest.mark.parametrize(
    ("model", "verb"),
    [(ExportParams, "Export"), (ScrubParams, "Scrub"), (RewriteParams, "Rewrite")],
)
def test_a_runs_topics_field_says_what_it_does_to_them(model: type[RunParams], verb: str) -> None:
    """``topics_field`` is the one place the form's Topics field is written; each run that
    re-declares it keeps the type, the default and the validation, and names its verb."""
    assert form_schema(model)["topics"] == {
        "default": None,
        "description": f"{verb} these topics; leave empty for every topic.",
        "items": {"type": "string"},
        "title": "Topics",
        "type": ["null", "array"],
    }
    assert model.parse({}).topics is None
    assert model.parse({"topics": [" a ", "a"]}).topics == ["a"]

"""Run parameters: one pydantic model per kind of run, for its CLI command, its operator and
its DAG's trigger form, so the three can never disagree.

A DAG's form is generated from the model (:func:`form_schema`, ``model_params`` in the
Airflow plugin); :meth:`RunParams.parse` checks values against that same JSON schema before
building the model, so a bad value gets the same message (``jsonschema``'s) from the CLI,
the operator and the form. Runs that choose topics share :class:`TopicSelection`; runs that
choose a ledger id range too share :class:`LedgerSelection`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from offloader.policy import describe_validation_error


class RunParamsError(ValueError):
    """A run parameter is invalid; the message names it and says why."""


class FormJsonSchema(GenerateJsonSchema):
    """Optional fields as ``"type": ["null", T]`` rather than ``anyOf``: Airflow's trigger
    form renders a typed field it may leave empty (an empty string field counts as missing
    and keeps the Trigger button disabled)."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        inner = self.generate_inner(schema["schema"])
        if isinstance(inner.get("type"), str):
            return {**inner, "type": ["null", inner["type"]]}
        return super().nullable_schema(schema)


class RunParams(BaseModel):
    """A run's parameters: one model for a CLI command, an operator and a DAG's trigger
    form. :meth:`parse` checks values against the form's JSON schema first, so all three
    give the same message for the same bad value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> Self:
        """Check ``values`` against :func:`form_schema`, then build the model; missing keys
        take their defaults. RunParamsError names the first bad field."""
        from jsonschema import Draft202012Validator

        schemas = _field_schemas(cls)
        unknown = sorted(set(values) - set(schemas))
        if unknown:
            raise RunParamsError(f"unknown run parameter(s) {unknown}; known: {', '.join(schemas)}")
        for name, value in values.items():
            error = next(Draft202012Validator(schemas[name]).iter_errors(value), None)
            if error is not None:
                raise RunParamsError(f"{name}: {error.message}")
        try:
            return cls.model_validate(dict(values))
        except ValidationError as exc:  # a rule the JSON schema cannot say
            raise RunParamsError(describe_validation_error(exc)) from None

    @model_validator(mode="after")
    def _fits_the_metadata(self) -> Self:
        """Every number fits the metadata's int64 columns (a float as milliseconds): a form
        or an XCom can carry any JSON number, and one past int64 would fail later, in the
        database, with an OverflowError instead of a message naming the field."""
        for name in type(self).model_fields:
            for value in _numbers(getattr(self, name)):
                if isinstance(value, float) and not math.isfinite(value):
                    raise ValueError(f"{name}: {value} is not a finite number")
                limit = INT64_MAX / 1000 if isinstance(value, float) else INT64_MAX
                if abs(value) > limit:
                    raise ValueError(f"{name}: {value} is beyond the largest value {limit:.0f}")
        return self


INT64_MAX = 2**63 - 1


def _numbers(value: object) -> list[int | float]:
    """The numbers in a field's value (lists included; booleans are not numbers)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, list | tuple):
        return [n for item in value for n in _numbers(item)]
    return []


def topics_field(verb: str) -> Any:
    """The ``topics`` field of a run that does ``verb`` to them, as its form describes it."""
    return Field(
        default=None,
        title="Topics",
        description=f"{verb} these topics; leave empty for every topic.",
    )


class TopicSelection(RunParams):
    """A run over chosen topics: ``topics`` as :func:`topic_names` makes them, empty (None)
    for every topic. A subclass re-declares ``topics = topics_field(...)`` to say in its
    form what it does with them; the field keeps its place and its validation."""

    topics: list[str] | None = topics_field("Act on")

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, value: list[str] | None) -> list[str] | None:
        return topic_names(value)


class LedgerSelection(TopicSelection):
    """A run over chosen topics and the ledgers with ids in ``first_ledger..last_ledger``
    (both included; empty: no bound), an empty range refused."""

    #: what the run does, for the error of an empty range ("...: nothing to export")
    action: ClassVar[str] = "select"

    first_ledger: int | None = Field(
        default=None, ge=0, title="First ledger", description="Lowest ledger id; empty: 0."
    )
    last_ledger: int | None = Field(
        default=None, ge=0, title="Last ledger", description="Highest ledger id; empty: no limit."
    )

    @model_validator(mode="after")
    def _ledger_range(self) -> Self:
        first, last = self.first_ledger, self.last_ledger
        if first is not None and last is not None and first > last:
            raise ValueError(
                f"first_ledger {first} is above last_ledger {last}: nothing to {self.action}"
            )
        return self

    def in_range(self, ledger_id: int) -> bool:
        """Whether ``ledger_id`` is inside the run's ledger range."""
        low = self.first_ledger if self.first_ledger is not None else 0
        return low <= ledger_id and (self.last_ledger is None or ledger_id <= self.last_ledger)


def topic_names(value: list[str] | None) -> list[str] | None:
    """A run's ``topics`` as a form or a command line gives them: each name stripped and 1
    to 512 characters, repeats dropped; empty means every topic (None)."""
    if not value:
        return None
    names = [t.strip() for t in value]
    if any(not t or len(t) > 512 for t in names):
        raise ValueError("topic names must be 1 to 512 characters, not blank")
    return list(dict.fromkeys(names))


def parse_ledger_range(text: str) -> tuple[int, int]:
    """``"FIRST:LAST"`` -> (first, last), both ids >= 0; ValueError naming the text."""
    first, sep, last = text.strip().partition(":")
    try:
        if not sep:
            raise ValueError(text)
        low, high = int(first), int(last)
        if low < 0 or high < 0:
            raise ValueError(text)
    except ValueError:
        raise ValueError(
            f"ledgers {text!r}: expected FIRST:LAST, two ledger ids >= 0 (e.g. 10:200)"
        ) from None
    return low, high


def form_schema(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """Each field's JSON schema with its default (a copy): what a DAG's Params are made of."""
    return {name: dict(schema) for name, schema in _field_schemas(model).items()}


@cache
def _field_schemas(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    schema = model.model_json_schema(schema_generator=FormJsonSchema)
    return schema["properties"]

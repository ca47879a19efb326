"""One offload run's parameters: one model for `offloader plan`, the plan operator and the
`offload_ledgers` DAG's trigger form, so the three can never disagree.

The form's schema is generated from :class:`OffloadRunParams`; :meth:`OffloadRunParams.parse`
checks values against that same JSON schema before building the model, so a bad value gets
the same message (``jsonschema``'s) from the CLI, the operator and the form.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
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


class OffloadRunParams(RunParams):
    """What one run of `offload_ledgers` is asked to do. Empty means 'no limit'."""

    topic: str | None = Field(
        default=None,
        max_length=512,
        title="Topic",
        description="Offload this topic only; leave empty for every topic.",
    )
    up_to_ledger: int | None = Field(
        default=None,
        ge=0,
        title="Offload up to ledger",
        description="Offload every sealed ledger with an id <= this, whatever the policy; "
        "leave empty to follow each topic's policy.",
    )
    dry_run: bool = Field(
        default=False,
        title="Dry run",
        description="Plan and log what would move and what would be deleted; change nothing.",
    )
    batch_size: int = Field(
        default=500,
        ge=1,
        le=10_000,
        title="Ledgers per task",
        description="Due ledgers are offloaded in mapped tasks of at most this many.",
    )
    batch_bytes: int | None = Field(
        default=1 << 30,
        ge=1,
        title="Bytes per task",
        description="A task takes ledgers up to this many bytes (a larger ledger alone); "
        "empty: no byte limit.",
    )

    @field_validator("topic")
    @classmethod
    def _blank_is_every_topic(cls, value: str | None) -> str | None:
        return (value or "").strip() or None


def topic_names(value: list[str] | None) -> list[str] | None:
    """A run's ``topics`` as a form or a command line gives them: each name stripped and 1
    to 512 characters, repeats dropped; empty means every topic (None)."""
    if not value:
        return None
    names = [t.strip() for t in value]
    if any(not t or len(t) > 512 for t in names):
        raise ValueError("topic names must be 1 to 512 characters, not blank")
    return list(dict.fromkeys(names))


def form_schema(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """Each field's JSON schema with its default (a copy): what a DAG's Params are made of."""
    return {name: dict(schema) for name, schema in _field_schemas(model).items()}


@cache
def _field_schemas(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    schema = model.model_json_schema(schema_generator=FormJsonSchema)
    return schema["properties"]

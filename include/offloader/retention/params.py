"""One retention run's parameters: one model for the `retention` DAG's trigger form and its
operators, so the two can never disagree (built like
:class:`offloader.offload.params.OffloadRunParams`: the form is generated from
:class:`RetentionParams` and :meth:`RetentionParams.parse` checks values against it first).

A run either applies each topic's retention policy (the scheduled run; from the UI, one
topic, optionally with a policy override for this run), or trims one topic at a cut or a
position ``L:E`` (PDP-19's manual truncation). The checks that need the metadata (the topic
and the cut exist, the position is within the topic, the override keeps offload below
retention) are :func:`offloader.retention.request.check_request`'s.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from offloader.params import RunParams

OVERRIDES = ("retention_time_seconds", "retention_size_bytes")
#: a position as the form may take it (the model checks the rest)
POSITION_PATTERN = r"^(\s*|\s*\d+:\d+\s*)$"


class RetentionParams(RunParams):
    """What a run of `retention` is asked to do. Empty form fields arrive as '' or None."""

    topic: str | None = Field(
        default=None,
        max_length=512,
        title="Topic",
        description="Act on this topic only; leave empty for every topic (policy run).",
    )
    cut_id: int | None = Field(
        default=None,
        ge=0,
        title="Trim at cut",
        description="Trim the topic at this stream cut (`offloader cut list TOPIC`).",
    )
    position: str | None = Field(
        default=None,
        title="Trim at position",
        description="Trim the topic at LEDGER:ENTRY (e.g. 12:0) instead of a cut.",
        # in the form's schema only (parse checks it): the model's own check names the
        # position and the expected form
        json_schema_extra={"pattern": POSITION_PATTERN},
    )
    retention_time_seconds: float | None = Field(
        default=None,
        ge=0,
        title="Keep at least (seconds)",
        description="Override the topic's retention time for this run.",
    )
    retention_size_bytes: int | None = Field(
        default=None,
        ge=0,
        title="Keep at least (bytes)",
        description="Override the topic's retention size for this run.",
    )
    dry_run: bool = Field(
        default=False,
        title="Dry run",
        description="Log where each topic would be trimmed and what would go; change nothing.",
    )

    @field_validator("topic", "position", "cut_id", *OVERRIDES, mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("position")
    @classmethod
    def _position_parses(cls, value: str | None) -> str | None:
        # the metadata layer (SQLAlchemy) is imported when a position is checked, not when
        # a DAG file builds its form from this model
        from offloader.metadata import Position

        return None if value is None else str(Position.parse(value))

    @model_validator(mode="after")
    def _one_mode(self) -> RetentionParams:
        if self.cut_id is not None and self.position is not None:
            raise ValueError("give a cut_id or a position, not both")
        if self.mode == "trim" and self.topic is None:
            raise ValueError("a trim at a cut or a position needs a topic")
        if self.overrides and self.topic is None:
            raise ValueError("a retention override for one run needs a topic")
        if self.overrides and self.mode == "trim":
            raise ValueError("a trim at a cut or position takes no retention override")
        return self

    @property
    def mode(self) -> Literal["trim", "policy"]:
        return "trim" if self.cut_id is not None or self.position is not None else "policy"

    @property
    def overrides(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in OVERRIDES if getattr(self, k) is not None}

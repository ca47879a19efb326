"""One offload run's parameters: one model for `offloader plan`, the plan operator and the
`offload_ledgers` DAG's trigger form, so the three can never disagree.

The form's schema is generated from :class:`OffloadRunParams`; :meth:`OffloadRunParams.parse`
checks values against that same JSON schema before building the model, so a bad value gets
the same message (``jsonschema``'s) from the CLI, the operator and the form
(:mod:`offloader.params`).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from offloader.params import RunParams


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

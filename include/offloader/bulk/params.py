"""One export's parameters: one model for the `bulk_export` DAG's form, its operator and the
Spark application (which gets them as JSON on its command line: they hold no secret)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from offloader.keys import EXPORTS_DIR
from offloader.objectstore.location import FILE, StoreLocation
from offloader.params import LedgerSelection, topics_field

MiB = 1024 * 1024
EXPORT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,199}")


class ExportParams(LedgerSelection):
    """What one run of `bulk_export` exports and where. Empty means 'no limit'."""

    action: ClassVar[str] = "export"

    topics: list[str] | None = topics_field("Export")
    created_from: datetime | None = Field(
        default=None,
        title="Created from",
        description="Only ledgers created at or after this instant (with a time zone).",
    )
    created_to: datetime | None = Field(
        default=None,
        title="Created before",
        description="Only ledgers created before this instant (with a time zone).",
    )
    output: str | None = Field(
        default=None,
        max_length=1024,
        title="Output",
        description="file:///abs/dir, /abs/dir or s3://bucket/prefix; empty: exports/ "
        "under the offloader's object store.",
    )
    export_id: str | None = Field(
        default=None,
        max_length=200,
        title="Export id",
        description="The export's name under the output; empty: the DAG run's id. A run "
        "with the id of an earlier export replaces it atomically.",
    )
    slice_bytes: int = Field(
        default=64 * MiB,
        ge=1,
        le=1024 * MiB,
        title="Bytes per Spark task",
        description="Ledgers are cut into entry ranges of about this many bytes, one "
        "Spark task (and one Parquet file) each.",
    )
    dry_run: bool = Field(
        default=False,
        title="Dry run",
        description="Plan and log what would be exported; write nothing.",
    )

    @field_validator("created_from", "created_to")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.utcoffset() is None:
            raise ValueError(
                f"{value.isoformat()} has no time zone (the same wall time is a different "
                "instant in every zone): add one, e.g. +00:00"
            )
        return value

    @field_validator("output")
    @classmethod
    def _output_url(cls, value: str | None) -> str | None:
        value = (value or "").strip()
        if not value:
            return None
        if value.startswith("/"):
            value = Path(value).as_uri()
        location = StoreLocation.from_url(value)  # ValueError naming the URL
        if location.kind == FILE and ".." in Path(location.location).parts:
            raise ValueError(f"output {value!r} must not contain '..'")
        return location.store_url

    @field_validator("export_id")
    @classmethod
    def _export_id(cls, value: str | None) -> str | None:
        value = (value or "").strip() or None
        if value is not None:
            check_export_id(value)
        return value

    @model_validator(mode="after")
    def _created_range(self) -> ExportParams:
        start, end = self.created_from, self.created_to
        if start is not None and end is not None and start >= end:
            raise ValueError(
                f"created_from {start.isoformat()} is not before created_to {end.isoformat()}"
            )
        return self

    def with_defaults(self, export_id: str, store_url: str) -> ExportParams:
        """The params with ``export_id`` (the run's id) and the output under ``store_url``
        filled in where they were left empty."""
        output = self.output or f"{store_url.rstrip('/')}/{EXPORTS_DIR}"
        return self.model_copy(
            update={"export_id": check_export_id(self.export_id or export_id), "output": output}
        )


def check_export_id(value: str) -> str:
    """``value`` if it can name an export (a folder or key part); ValueError otherwise."""
    if EXPORT_ID.fullmatch(value) is None:
        raise ValueError(
            f"export id {value!r}: 1 to 200 of A-Z a-z 0-9 . _ : + -, starting with a "
            "letter or digit"
        )
    return value

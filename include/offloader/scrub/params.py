"""One scrub run's parameters: one model for the `scrub` DAG's form, its operator and the
Spark application (which gets them as JSON on its command line: they hold no secret)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator

from offloader.keys import scrub_report_key
from offloader.objectstore.location import FILE, StoreLocation
from offloader.params import TopicSelection, topics_field

#: a report location as the form may take it (the model checks the rest)
REPORT_PATTERN = r"^(\s*|\s*/\S.*|\s*file:///\S.*|\s*s3://\S.*)$"
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._:+-]")


class ScrubParams(TopicSelection):
    """What one run of `scrub` reads, whether it repairs, and where its report goes."""

    topics: list[str] | None = topics_field("Scrub")
    repair: bool = Field(
        default=True,
        title="Repair",
        description="Offload a damaged ledger again from its hot copy; off: report only.",
    )
    dry_run: bool = Field(
        default=False,
        title="Dry run",
        description="Plan and log which ledgers (and how many bytes) would be read; read "
        "nothing, write no report.",
    )
    report: str | None = Field(
        default=None,
        max_length=1024,
        pattern=REPORT_PATTERN,
        title="Report",
        description="Where the JSON report goes: /abs/file.json, file:///abs/file.json or "
        "s3://bucket/key.json; empty: scrub-reports/<run id>.json under the offloader's "
        "object store.",
    )

    @field_validator("report")
    @classmethod
    def _report_url(cls, value: str | None) -> str | None:
        value = (value or "").strip()
        if not value:
            return None
        if value.endswith("/"):
            raise ValueError(f"report {value!r} names a folder: end it with a file name")
        if value.startswith("/"):
            value = Path(value).as_uri()
        report_location(value)  # ValueError naming what is wrong
        return value

    def with_defaults(self, run_id: str, store_url: str) -> ScrubParams:
        """The params with the report under ``store_url`` (named after ``run_id``) when it
        was left empty."""
        if self.report is not None:
            return self
        name = _NAME_UNSAFE.sub("_", run_id)
        return self.model_copy(
            update={"report": f"{store_url.rstrip('/')}/{scrub_report_key(name)}"}
        )


def report_location(url: str) -> tuple[StoreLocation, str]:
    """The store holding the report ``url`` names and the report's key in it; ValueError
    if ``url`` names no file (``file:///abs/x.json``, ``s3://bucket/[prefix/]x.json``)."""
    head, _, name = url.rstrip().rpartition("/")
    if not name or url.endswith("/"):
        raise ValueError(f"report {url!r} names a folder: end it with a file name")
    if name in (".", ".."):
        raise ValueError(f"report {url!r}: {name!r} is not a file name")
    if head in ("file:", "s3:"):
        raise ValueError(f"report {url!r}: expected file:///abs/file.json or s3://bucket/key.json")
    if head == "s3:/":  # s3://NAME: a bucket, no key
        raise ValueError(f"report {url!r} names a bucket: add a key, s3://bucket/key.json")
    location = StoreLocation.from_url("file:///" if head == "file://" else head)
    if location.kind == FILE and ".." in Path(location.location).parts:
        raise ValueError(f"report {url!r} must not contain '..'")
    return location, name

"""ExportParams: one model for the DAG form, the operator and the Spark application; a bad
value is refused with a message naming it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from offloader.bulk.params import ExportParams, check_export_id
from offloader.params import RunParamsError


def test_defaults_export_every_topic_to_the_store() -> None:
    params = ExportParams.parse({})
    assert params.topics is None and params.output is None and not params.dry_run
    assert ExportParams.parse({"topics": []}).topics is None  # empty: every topic
    filled = params.with_defaults("manual__2026-11-23T20:19:20+00:00", "s3://b/tiered/")
    assert filled.output == "s3://b/tiered/exports"
    assert filled.export_id == "manual__2026-11-23T20:19:20+00:00"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"topics": "orders"}, "topics: 'orders' is not of type 'null', 'array'"),
        ({"topics": [""]}, "topic names must be 1 to 512 characters"),
        ({"first_ledger": -1}, "first_ledger: -1 is less than the minimum of 0"),
        ({"first_ledger": 5, "last_ledger": 4}, "first_ledger 5 is above last_ledger 4"),
        ({"created_from": "2026-01-01T00:00:00"}, "has no time zone"),
        (
            {"created_from": "2026-01-02T00:00:00Z", "created_to": "2026-01-01T00:00:00Z"},
            "is not before created_to",
        ),
        ({"output": "relative/dir"}, "scheme must be 'file' (file:///abs/dir)"),
        ({"output": "file://host/dir"}, "expected file:///absolute/dir"),
        ({"output": "s3://"}, "expected s3://bucket/prefix"),
        ({"output": "http://x/y"}, "scheme must be 'file'"),
        ({"output": "/data/../etc"}, "must not contain '..'"),
        ({"export_id": "../x"}, "export id '../x'"),
        ({"slice_bytes": 0}, "slice_bytes: 0 is less than the minimum of 1"),
        ({"dry_run": "yes"}, "dry_run: 'yes' is not of type 'boolean'"),
        ({"topic": "orders"}, "unknown run parameter(s) ['topic']"),
    ],
)
def test_bad_values_are_refused_naming_the_field(values: dict, message: str) -> None:
    with pytest.raises(RunParamsError) as raised:
        ExportParams.parse(values)
    assert message in str(raised.value)


def test_outputs_are_normalised_urls() -> None:
    assert ExportParams.parse({"output": "/tmp/x/"}).output == "file:///tmp/x"
    assert ExportParams.parse({"output": "s3://bucket/a/b/"}).output == "s3://bucket/a/b"
    assert ExportParams.parse({"topics": [" a ", "a", "b"]}).topics == ["a", "b"]
    window = ExportParams.parse({"created_from": "2026-01-01T00:00:00+02:00"})
    assert window.created_from == datetime(2025, 12, 31, 22, tzinfo=UTC)


def test_a_run_id_that_cannot_name_an_export_is_refused() -> None:
    with pytest.raises(ValueError, match="export id 'a/b'"):
        ExportParams().with_defaults("a/b", "file:///x")
    assert check_export_id("scheduled__2026-01-01T00:00:00+00:00")


@pytest.mark.parametrize(
    "store_url", ["s3://b/tiered", "s3://b/tiered/", "s3://b/BOX", "file:///srv/TIER-X/"]
)
def test_the_default_output_is_exports_under_the_store(store_url: str) -> None:
    """Whatever the store's path ends with (a slash or not, any letter), the default output
    is its ``exports`` folder."""
    filled = ExportParams().with_defaults("e1", store_url)
    assert filled.output == store_url.removesuffix("/") + "/exports"


@pytest.mark.parametrize("export_id", [".hidden", "-x", "_x"])
def test_an_export_id_must_start_with_a_letter_or_digit(export_id: str) -> None:
    with pytest.raises(ValueError, match="starting with a letter or digit") as raised:
        check_export_id(export_id)
    assert repr(export_id) in str(raised.value)

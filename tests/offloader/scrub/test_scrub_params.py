"""The Spark-free halves of the `scrub` DAG: ScrubParams (one model for the form, the
operator and the application), the report written where a URL says, and what an executor
runs (scrub_partition: the recorded stores opened from the targets, no database), on both
backends."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fixtures.scrub import DAMAGES, offloaded_topic
from offloader.objectstore.location import StoreLocation
from offloader.params import RunParamsError
from offloader.runtime import Runtime
from offloader.scrub import FindingKind, plan_scrub, run_scrub, scrub_targets
from offloader.scrub.output import read_report_at, write_report_at
from offloader.scrub.params import ScrubParams
from offloader.scrub.spread import scrub_partition


def test_defaults_scrub_every_topic_repair_and_report_into_the_store() -> None:
    params = ScrubParams.parse({})
    assert (params.topics, params.repair, params.dry_run, params.report) == (
        None,
        True,
        False,
        None,
    )
    filled = params.with_defaults("manual__2026-11-23T20:19:20+00:00", "s3://b/tiered/")
    assert filled.report == "s3://b/tiered/scrub-reports/manual__2026-11-23T20:19:20+00:00.json"
    odd = params.with_defaults("scheduled/2026 a", "file:///d")
    assert odd.report == "file:///d/scrub-reports/scheduled_2026_a.json"
    assert ScrubParams.parse({"topics": [" a ", "a", "b"]}).topics == ["a", "b"]
    assert ScrubParams.parse({"report": " /tmp/r.json "}).report == "file:///tmp/r.json"
    given = ScrubParams.parse({"report": "s3://b/x/r.json"})
    assert given.with_defaults("run", "file:///d") == given


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"topics": "orders"}, "topics: 'orders' is not of type 'null', 'array'"),
        ({"topics": [" "]}, "topic names must be 1 to 512 characters"),
        ({"repair": "no"}, "repair: 'no' is not of type 'boolean'"),
        ({"report": "reports/x.json"}, "report: 'reports/x.json' does not match"),
        ({"report": "http://x/r.json"}, "report: 'http://x/r.json' does not match"),
        ({"report": "/var/reports/"}, "names a folder: end it with a file name"),
        ({"report": "s3://bucket"}, "names a bucket: add a key"),
        ({"report": "s3://bucket/reports/"}, "names a folder"),
        ({"report": "/data/../etc/r.json"}, "must not contain '..'"),
        ({"report": "file://host/r.json"}, "report: 'file://host/r.json' does not match"),
        ({"topic": "orders"}, "unknown run parameter(s) ['topic']"),
    ],
)
def test_bad_values_are_refused_naming_the_field(values: dict, message: str) -> None:
    with pytest.raises(RunParamsError) as raised:
        ScrubParams.parse(values)
    assert message in str(raised.value)


def test_the_report_lands_where_its_url_says(runtime: Runtime, tmp_path: Path) -> None:
    rt = runtime
    offloaded_topic(rt, "orders", [(20, 500)])
    report = run_scrub(rt)
    store = rt.settings.resolved_object_store_url.rstrip("/")
    for url in (f"{store}/reports/weekly.json", (tmp_path / "a" / "b.json").as_uri()):
        assert read_report_at(url, rt.settings) is None
        write_report_at(report, url, rt.settings)
        assert read_report_at(url, rt.settings) == report.to_json()
    # a file URL is a plain file for people and tools; an S3 one a plain object
    assert json.loads((tmp_path / "a" / "b.json").read_bytes()) == report.to_json()
    if store.startswith("s3://"):
        assert json.loads(rt.objects.get("reports/weekly.json")) == report.to_json()
    else:
        stored = Path(store.removeprefix("file://"), "reports", "weekly.json").read_bytes()
        assert json.loads(stored) == report.to_json()


def test_an_executor_finds_what_the_driver_would(runtime: Runtime) -> None:
    """scrub_partition opens each recorded store from the target's location and the
    object-store settings alone, and finds exactly what the one-process scrub finds."""
    rt = runtime
    ledgers = offloaded_topic(rt, "orders", [(20, 500), (30, 800)])
    planted = DAMAGES["missing-index-object"](rt, ledgers[1])
    targets = plan_scrub(rt.metadata)
    closure = rt.settings.for_object_stores()
    assert closure.metadata_url is None
    assert scrub_partition(targets, closure) == scrub_targets(rt.stores, targets)
    (damaged,) = [r for r in scrub_partition(targets, closure) if r.damaged]
    assert [(f.key, f.kind) for f in damaged.findings] == [(planted.key, planted.kind)]


def test_an_executor_reports_a_store_it_cannot_open_as_unreadable(
    runtime: Runtime, tmp_path: Path
) -> None:
    rt = runtime
    offloaded_topic(rt, "orders", [(20, 500)])
    (target,) = plan_scrub(rt.metadata)
    gone = StoreLocation.from_url((tmp_path / "gone").as_uri())
    moved, unrecorded = replace(target, location=gone), replace(target, location=None)
    results = scrub_partition([moved, unrecorded], rt.settings.for_object_stores())
    kinds = [[f.kind for f in r.findings] for r in results]
    assert kinds == [[FindingKind.UNREADABLE], [FindingKind.UNREADABLE]]
    assert "directory does not exist" in results[0].findings[0].reason
    assert "offloader db upgrade" in results[1].findings[0].reason

"""The OpenLineage names of stores, folders and hot topics (plugins/offloader_airflow/lineage.py),
checked against the naming spec written out by hand."""

from __future__ import annotations

import pytest
from openlineage.client.serde import Serde

from offloader_airflow.lineage import (
    MAX_TOPICS,
    LineageMixin,
    Moved,
    hot_topic_urls,
    names,
    operator_lineage,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://bucket", ("s3://bucket", "/")),  # a bucket's root, as the amazon provider names it
        ("s3://bucket/", ("s3://bucket", "/")),
        ("s3://bucket/tier/prod/", ("s3://bucket", "tier/prod")),
        ("s3://bucket/tier/exports/daily/", ("s3://bucket", "tier/exports/daily")),
        ("file:///srv/objects", ("file://node-1", "/srv/objects")),
        ("file:///srv/ledgers/a%25C3%25A9", ("file://node-1", "/srv/ledgers/a%C3%A9")),
    ],
)
def test_store_and_folder_names_follow_the_spec(url: str, expected: tuple[str, str]) -> None:
    assert names(url, "node-1") == expected


@pytest.mark.parametrize(
    "url", ["s3://key:secret@bucket/prefix", "http://bucket/prefix", "file://host/dir", "s3://"]
)
def test_a_url_with_credentials_or_of_another_kind_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="object store URL"):
        names(url, "node-1")


def test_hot_topics_are_their_folders_and_many_topics_the_hot_tier() -> None:
    assert hot_topic_urls("/srv/ledgers", ["Orders", "clicks", "clicks"]) == [
        "file:///srv/ledgers/%254Frders",  # the folder's own name, %4F, in a URL
        "file:///srv/ledgers/clicks",
    ]
    many = [f"t{i}" for i in range(MAX_TOPICS)]
    assert len(hot_topic_urls("/srv/ledgers", many)) == MAX_TOPICS
    assert hot_topic_urls("/srv/ledgers", [*many, "one-more"]) == ["file:///srv/ledgers"]


def test_lineage_of_a_task_and_of_one_that_moved_nothing() -> None:
    moved = Moved(
        host="node-1",
        ledger_dir="/srv/ledgers",
        topics=["orders"],
        written=["s3://bucket/tier", "s3://bucket/tier"],
    )
    lineage = operator_lineage(moved)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [
        ("file://node-1", "/srv/ledgers/orders")
    ]
    assert [(d.namespace, d.name) for d in lineage.outputs] == [("s3://bucket", "tier")]
    assert lineage.outputs[0].outputFacets == {}  # no statistics without an export's
    for nothing in (None, Moved(host="node-1", ledger_dir="/srv/ledgers", topics=["orders"])):
        empty = operator_lineage(nothing)
        assert empty.inputs == [] and empty.outputs == []


def test_an_export_says_what_it_wrote() -> None:
    moved = Moved(
        host="node-1",
        read=["s3://bucket/tier", "file:///srv/old-store"],
        written=["s3://bucket/tier/exports/daily/"],
        rows=120,
        size=4096,
        files=3,
    )
    lineage = operator_lineage(moved)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [
        ("s3://bucket", "tier"),
        ("file://node-1", "/srv/old-store"),
    ]
    (output,) = lineage.outputs
    facet = Serde.to_dict(output.outputFacets["outputStatistics"])
    assert (facet["rowCount"], facet["size"], facet["fileCount"]) == (120, 4096, 3)


def test_success_and_failure_report_what_execute_recorded() -> None:
    task = LineageMixin()
    assert task.get_openlineage_facets_on_failure(None).outputs == []
    task.moved = Moved(host="h", ledger_dir="/l", topics=["t"], written=["s3://b/p"])
    for method in (task.get_openlineage_facets_on_complete, task.get_openlineage_facets_on_failure):
        assert [(d.namespace, d.name) for d in method(None).outputs] == [("s3://b", "p")]


def test_lineage_that_cannot_be_read_fails_nothing_and_logs_no_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = LineageMixin()
    task.moved = Moved(host="h", ledger_dir="/l", topics=["t"], written=["s3://b/p"])

    def metadata_gone() -> Moved | None:
        raise ConnectionError("could not connect to postgresql://user:hunter2@db/offloader")

    with caplog.at_level("WARNING", logger="offloader_airflow.lineage"):
        task.record_moved(metadata_gone)
    assert task.moved is None  # an earlier try's datasets are not reported either
    assert task.get_openlineage_facets_on_complete(None).outputs == []
    assert "ConnectionError" in caplog.text and "hunter2" not in caplog.text
    task.record_moved(lambda: Moved(host="h", written=["s3://b/p"]))
    assert task.moved is not None and task.moved.written == ["s3://b/p"]

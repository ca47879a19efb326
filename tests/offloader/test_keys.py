"""Every key shape of offloader/keys.py, byte for byte as docs/FORMAT.md describes it, and
what each parser and classifier accepts and refuses."""

from __future__ import annotations

import time
import uuid

import pytest

from offloader.keys import (
    MANIFEST_KEY,
    data_key_of,
    export_attempt_folder,
    export_file_path,
    export_prefix,
    is_export_attempt_key,
    is_ledger_object_key,
    is_metadata_key,
    is_offloaded_object_key,
    is_segment_object_key,
    is_snapshot_key,
    ledger_object_keys,
    parse_ledger_index_key,
    parse_segment_index_key,
    parse_topic_start_key,
    scrub_report_key,
    segment_object_keys,
    snapshot_key,
    topic_start_key,
)

ID = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"


def test_ledger_and_segment_keys_are_the_documented_shapes() -> None:
    assert ledger_object_keys(ID, 42) == (f"{ID}-ledger-42", f"{ID}-ledger-42-index")
    assert segment_object_keys(ID) == (ID, f"{ID}-index")
    assert data_key_of(f"{ID}-ledger-42-index") == f"{ID}-ledger-42"
    assert data_key_of(f"{ID}-index") == ID
    assert data_key_of(ID) == ID  # a data key is its own


def test_index_keys_parse_back_to_their_ids() -> None:
    data, index = ledger_object_keys(ID, 7)
    assert parse_ledger_index_key(index) == (ID, 7)
    assert parse_segment_index_key(segment_object_keys(ID)[1]) == ID
    for other in (data, ID, f"{ID}-index-index", f"x{index}", f"tiered/{index}", ID.upper()):
        assert parse_ledger_index_key(other) is None, other
    for other in (index, ID, f"{ID}-data", f"tiered/{ID}-index", f"{ID.upper()}-index"):
        assert parse_segment_index_key(other) is None, other


def test_offloaded_objects_are_told_from_anything_else() -> None:
    segment_id = str(uuid.uuid4())
    ledger = ledger_object_keys(segment_id, 5)
    segment = segment_object_keys(segment_id)
    assert all(is_ledger_object_key(k) and not is_segment_object_key(k) for k in ledger)
    assert all(is_segment_object_key(k) and not is_ledger_object_key(k) for k in segment)
    assert all(is_offloaded_object_key(k) for k in (*ledger, *segment))
    for foreign in (
        segment_id.upper(),
        f"tiered/{segment[0]}",
        f"{segment[0]}-index-index",
        f"{ledger[0]}-data",
        segment_id[:-1],
        f"{segment_id}-ledger-x",
        "_metadata/snapshots/x.jsonl.gz",
    ):
        assert not is_offloaded_object_key(foreign), foreign


def test_snapshot_keys_in_utc_and_under_the_reserved_prefix() -> None:
    ms = 1_700_000_000_123  # 2023-11-14 22:13:20.123 UTC
    key = snapshot_key(ms, ID)
    assert key == f"_metadata/snapshots/20231114T221320123Z-{ID}.jsonl.gz"
    assert snapshot_key(1_700_000_000_007, ID).startswith(
        "_metadata/snapshots/20231114T221320007Z-"
    )
    assert MANIFEST_KEY == "_metadata/snapshots/manifest.json"
    assert is_snapshot_key(key) and is_metadata_key(key) and is_metadata_key(MANIFEST_KEY)
    assert not is_snapshot_key(MANIFEST_KEY)
    for other in ("_metadata/snapshots/a/b.jsonl.gz", "_metadata/x.jsonl.gz", f"x{key}"):
        assert not is_snapshot_key(other), other
    assert not is_metadata_key(f"tiered/{key}") and not is_metadata_key(ID)


def test_a_snapshot_key_is_in_utc_whatever_the_local_time_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "America/St_Johns")  # 3.5 hours behind UTC in November
    time.tzset()
    try:
        assert snapshot_key(1_700_000_000_123, ID).startswith("_metadata/snapshots/20231114T2213")
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        (
            "orders",
            "topic=orders/ledger_id=3/part-00000000000000000010-00000000000000000019.parquet",
        ),
        (
            "a/b ü",
            "topic=a%2Fb%20%C3%BC/ledger_id=3/part-00000000000000000010-00000000000000000019.parquet",
        ),
    ],
)
def test_export_files_are_partitioned_by_topic_and_ledger(topic: str, expected: str) -> None:
    assert export_file_path(topic, 3, 10, 19) == expected


def test_export_folders_and_the_scrub_report() -> None:
    attempt = uuid.uuid4().hex
    assert export_prefix("e1") == "e1/"
    assert export_attempt_folder(attempt) == f"{attempt}/"
    assert is_export_attempt_key(f"e1/{attempt}/topic=t/x.parquet", "e1")
    assert not is_export_attempt_key("e1/_manifest.json", "e1")
    assert not is_export_attempt_key(f"e1/{attempt[:-1]}/x", "e1")
    assert not is_export_attempt_key(f"e2/{attempt}/x", "e1")
    assert scrub_report_key("manual__2026") == "scrub-reports/manual__2026.json"


@pytest.mark.parametrize(
    ("topic", "key"),
    [
        ("orders", "_metadata/starts/orders.json"),
        ("päyments/eu", "_metadata/starts/p%C3%A4yments%2Feu.json"),
        ("a b.json", "_metadata/starts/a%20b.json.json"),
    ],
)
def test_a_topic_start_key_is_one_encoded_segment_that_parses_back(topic: str, key: str) -> None:
    assert topic_start_key(topic) == key
    assert parse_topic_start_key(key) == topic
    assert is_metadata_key(key)
    # never a candidate of the orphan sweep (it judges only these shapes)
    assert not (is_offloaded_object_key(key) or is_snapshot_key(key))


@pytest.mark.parametrize(
    "key",
    ["_metadata/starts/a/b.json", "_metadata/starts/orders", "starts/orders.json", MANIFEST_KEY],
)
def test_other_keys_are_no_topic_start(key: str) -> None:
    assert parse_topic_start_key(key) is None

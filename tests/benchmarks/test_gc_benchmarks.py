"""The GC and metadata-scale benchmarks at a smoke size: they measure what they claim (the
queue drained, the bucket emptied, one request per batch; the plan right at every size)
and the report's verdicts follow their numbers."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package lives beside tests/

from benchmarks import gc_throughput, metadata_scale, run  # noqa: E402
from fixtures.backends import POSTGRES_ONLY  # noqa: E402
from fixtures.databases import postgres_database  # noqa: E402
from offloader.runtime import Runtime  # noqa: E402


@POSTGRES_ONLY
def test_gc_throughput_drains_everything_one_request_per_batch(runtime: Runtime) -> None:
    result = gc_throughput._bench(runtime, total=200)
    rounds = gc_throughput.ROUNDS
    assert result["deletions_per_path"] == 200
    assert (result["objects_left"], result["pending_left"]) == (0, 0)
    assert result["ours"]["delete_requests"] == result["ours"]["http_delete_objects"] == rounds
    assert result["ours"]["http_other"] == 0 and result["raw"]["delete_requests"] == rounds
    assert result["ratio"] > 0 and result["met"] == (result["ratio"] >= 0.8)


def test_metadata_scale_plans_the_hot_ledgers_and_completes_a_batch() -> None:
    for url in postgres_database():
        result = metadata_scale._one_size(url, rows=1_500)  # asserts the plan itself
        assert result["rows"] == 1_500
        for what in ("plan", "gc_batch"):
            assert result[what]["seconds"] > 0 and result[what]["peak_kib"] > 0


def test_the_report_shows_gc_and_scale_verdicts_from_the_numbers() -> None:
    results = copy.deepcopy(json.loads(run.RESULTS.read_text()))
    results["gc_throughput"] = {
        "deletions_per_path": 100,
        "rounds": 4,
        "batch_keys": 1000,
        "ours": {
            "seconds": 2.0,
            "deletions_per_s": 50,
            "delete_requests": 4,
            "http_delete_objects": 4,
            "http_other": 0,
            "passes": 4,
        },
        "raw": {"seconds": 1.0, "deletions_per_s": 100, "delete_requests": 4},
        "ratio": 0.5,
        "target_ratio": 0.8,
        "met": False,
        "objects_left": 0,
        "pending_left": 0,
    }
    size = {"plan": {"seconds": 0.01, "peak_kib": 10}, "gc_batch": {"seconds": 2.5, "peak_kib": 9}}
    results["metadata_scale"] = {
        "hot_ledgers": 50,
        "pending_deletions": 5000,
        "repeats": 3,
        "sizes": [{"rows": 10, **size}, {"rows": 1_000_000, **size}],
        "growth_first_to_last": {
            "plan": {"time": 1.0, "memory": 1.0},
            "gc_batch": {"time": 1.0, "memory": 1.0},
        },
        "under_a_second": False,
    }
    doc = run.document(results)
    assert "- GC ours/raw 0.50 (target >= 0.8): **missed**" in doc
    assert "up to 1,000,000 ledger rows: **missed**" in doc
    assert "| one GC batch, 1,000,000 ledger rows (postgres) | 2.5 s, 9 KiB peak" in doc
    assert "< 1 s: MISSED" in doc
    results["gc_throughput"].update(ratio=0.91, met=True)
    assert "- GC ours/raw 0.91 (target >= 0.8): **met**" in run.document(results)


@pytest.mark.parametrize("key", ["gc_throughput", "metadata_scale"])
def test_a_skipped_benchmark_is_reported_as_skipped(key: str) -> None:
    results = copy.deepcopy(json.loads(run.RESULTS.read_text()))
    results[key] = {"skipped": "PostgreSQL not reachable on 127.0.0.1:5432"}
    doc = run.document(results)
    assert "Skipped: PostgreSQL not reachable on 127.0.0.1:5432." in doc

"""The export scaling benchmark at a smoke size, so its code cannot rot: the real
bulk_export application submitted on local[1] and local[2] (each must publish a new export
of every row), its time split from Spark's event log, the library baselines over the same
plan; then run.py's rendering of the numbers and the verdict."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package lives beside tests/

from benchmarks import export_scaling, run  # noqa: E402
from fixtures.databases import require_postgres  # noqa: E402

SMOKE = export_scaling.Config(ledgers=2, ledger_mib=2, slice_mib=1, repeats=1)


@pytest.mark.spark
@pytest.mark.long  # the short form: the bulk_export DAG tests (tests/spark) run the same job
def test_export_scaling_benchmark_smoke() -> None:
    require_postgres()
    result = export_scaling.run(cfg=SMOKE)
    assert result["entries"] == 2 * 2 * 1024 * 1024 // SMOKE.entry_size
    assert result["payload_mib"] == 4.0 and result["slices"] == 4  # 1 MiB slices
    for path in ("library_read", "library_export"):
        assert len(result[path]["seconds"]) == SMOKE.repeats and result[path]["mb_per_s"] > 0
    for n in ("1", "2"):
        (only,) = result["spark"][n]["runs"]
        assert min(only.values()) > 0  # start-up, job and after all took time
        split = only["startup_s"] + only["job_s"] + only["after_s"]
        assert abs(split - only["wall_s"]) < 0.01  # the parts add up to the submission
        assert result["spark"][n]["job_mb_per_s"] > result["spark"][n]["wall_mb_per_s"]
    one, two = result["spark"]["1"], result["spark"]["2"]
    assert result["scaling_job"] == round(two["job_mb_per_s"] / one["job_mb_per_s"], 3)
    assert result["met"] == (result["scaling_job"] >= 1.5)

    (row,) = export_scaling.rows(result)
    assert row[3] == f"{result['scaling_job']:.2f}" and row[4].endswith(
        "met" if result["met"] else "MISSED"
    )
    results = json.loads(run.RESULTS.read_text())  # the other benchmarks' last full run
    assert run.rows(results | {"export_scaling": result})[-1] == row  # in the summary table
    prose = export_scaling.prose(result)
    assert f"{one['median_startup_s']} | {one['median_job_s']}" in prose
    assert f"**{'met' if result['met'] else 'missed'}**" in prose
    flipped = copy.deepcopy(result)
    flipped["met"] = not result["met"]
    (line,) = export_scaling.findings(flipped)
    assert f"{run._verdict(not result['met'])};" in line


def test_the_report_says_when_export_scaling_was_not_measured() -> None:
    assert export_scaling.rows({}) == []
    assert export_scaling.prose({}) == "Not run."
    assert export_scaling.findings({"skipped": "no server"}) == [
        "- Bulk export scaling: not measured (no server)."
    ]
    assert export_scaling.rows({"skipped": "no server"})[0][1:3] == ("skipped", "no server")

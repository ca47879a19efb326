"""The sweep benchmark runs at a smoke size and reports what it measured; run.py renders it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package lives beside tests/

from benchmarks import run, sweep_scale  # noqa: E402
from fixtures.databases import require_postgres  # noqa: E402


@pytest.mark.long  # the short form: the sweep's own tests (tests/offloader/gc)
def test_sweep_benchmark_smoke() -> None:
    require_postgres()
    # the system's temporary directory: SeaweedFS's unix socket path must stay short (a
    # pytest tmp_path under an xdist worker is too long for bind())
    result = sweep_scale.run(count=300)
    assert result["objects"] == result["raw_listed"] == 300
    assert result["orphans_queued"] == 300 - result["referenced"] > 0
    assert result["list_objects_requests"] == 1  # one page of up to 1,000 keys
    assert result["list_uploads_requests"] == 1
    assert result["sweep_s"] > 0 and result["peak_python_mib"] > 0

    row = run._sweep_row(result)
    assert "orphan sweep of 300 objects" in row[0]
    assert f"{result['list_objects_requests']} LISTs" in row[1]
    assert str(result["sweep_s"]) in run._sweep_prose(result)
    assert run._sweep_prose({}) == "Not measured: not run."
    assert run._sweep_row({"skipped": "no server"})[1:3] == ("skipped", "no server")

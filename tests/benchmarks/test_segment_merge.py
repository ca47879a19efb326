"""The compaction benchmark at a smoke size: big segments really go by UploadPartCopy and
small ones by download, both merged objects are the sources' bytes, and run.py renders
only the numbers the run measured."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package lives beside tests/

from benchmarks import run, segment_merge  # noqa: E402
from fixtures.seaweedfs import SeaweedS3  # noqa: E402
from offloader.objectstore.s3 import S3ObjectStore  # noqa: E402

SMOKE = segment_merge.Config(big_segments=2, big_mib=6, small_segments=12, repeats=2)


@pytest.fixture(scope="module")
def result(s3_server: SeaweedS3) -> dict:
    settings = s3_server.make_settings("bench-merge-smoke", prefix="segments")
    assert settings.object_store_url is not None
    store = S3ObjectStore.from_url(settings.object_store_url, settings)
    try:
        return segment_merge.measure(store, settings, SMOKE)
    finally:
        store.close()


def test_big_segments_are_copied_small_ones_downloaded(result: dict) -> None:
    big, small = result["big"], result["small"]
    assert big["segments"] == 2 and small["segments"] == 12
    assert small["segment_kib"] == 64 and big["segment_kib"] * 1024 >= 5 * 1024 * 1024
    # big: the sources' indexes are read, their data only copied server side
    assert big["ours_requests"] == {
        "complete_multipart": 1,
        "create_multipart": 1,
        "get": 2,
        "put": 1,
        "upload_part_copy": 2,
    }
    # small: each source's data is read once (one ranged GET) and uploaded in one part
    assert small["ours_requests"] == {
        "complete_multipart": 1,
        "create_multipart": 1,
        "get": 12,
        "put": 1,
        "read_range": 12,
        "upload_part": 1,
    }
    assert (big["parts"], small["parts"]) == (2, 1)
    assert big["raw_requests"] == {
        "get": 2,
        "create_multipart": 1,
        "upload_part": 2,
        "complete_multipart": 1,
    }
    for case in (big, small):
        assert len(case["ours_all_s"]) == len(case["raw_all_s"]) == SMOKE.repeats
        # medians are rounded to ms: a 50 ms merge is 1 % off by rounding alone
        assert case["ratio"] == pytest.approx(case["raw_s"] / case["ours_s"], rel=0.05)
        merged = case["merged_mib"] * 1024 * 1024
        # MB/s are rounded to 0.1 (up to 0.05 off) and computed from the size and time before
        # they were rounded (MiB to 0.01, s to ms: up to 0.005 MiB and 0.5 ms off); the
        # bound is the sum of the three, plus float slack
        mb_per_s = merged / case["ours_s"] / 1e6
        relative = 0.0005 / case["ours_s"] + 0.005 / case["merged_mib"]
        bound = 0.05 + 1.01 * mb_per_s * relative + 1e-9
        assert abs(case["ours_mb_per_s"] - mb_per_s) <= bound, (case["ours_mb_per_s"], mb_per_s)


def test_the_report_renders_the_run_and_nothing_else(result: dict) -> None:
    rows = run._merge_rows(result)
    assert [r[3] for r in rows] == [
        f"{result['big']['ratio']:.2f}",
        f"{result['small']['ratio']:.2f}",
    ]
    assert rows[0][1] == f"{result['big']['ours_s']} s, {result['big']['ours_mb_per_s']} MB/s"
    prose = run._merge_prose(result)
    assert f"{result['small']['raw_all_s']}" in prose and "No target" in prose
    flipped = copy.deepcopy(result)
    flipped["big"]["ratio"] = 0.5
    flipped["small"]["ratio"] = 2.0
    lines = run._merge_findings(flipped)
    assert "raw/ours 0.50, ours slower than" in lines[0]
    assert "raw/ours 2.00, ours faster than" in lines[1]
    flipped["big"]["ratio"] = 1.04
    assert "raw/ours 1.04, ours about as fast as" in run._merge_findings(flipped)[0]


def test_the_report_says_when_compaction_was_not_measured() -> None:
    assert run._merge_rows({}) == []
    assert run._merge_prose({}) == "Not run."
    assert run._merge_findings({}) == ["- Compaction (segment merge): not measured (not run)."]

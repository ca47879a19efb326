"""The streaming benchmark at a smoke size: every entry offloaded and its lag measured, the
requests counted per verb on both paths, the backlog pass timed against raw; run.py renders
its numbers and verdicts."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package lives beside tests/

from benchmarks import run, streaming  # noqa: E402
from fixtures.databases import require_postgres  # noqa: E402

SMOKE = streaming.Config(
    rate_mib_s=1,
    seconds=6,
    backlog_mib=6,
    repeats=1,
    pass_interval_s=1,
    rollover_age_s=3,
    segment_max_mib=16,
)


@pytest.mark.long  # the short form: the streaming pass's own tests (tests/offloader/stream)
def test_streaming_benchmark_smoke() -> None:
    require_postgres()
    # the system's temporary directory: SeaweedFS's unix socket path must stay short
    result = streaming.run(cfg=SMOKE)
    s, q, t = result["stream"], result["requests"], result["throughput"]
    assert s["entries"] == int(SMOKE.seconds * SMOKE.rate_mib_s * 1024 * 1024) // SMOKE.entry_size
    assert s["segments"] == len(s["by_segment"]) >= 1 and s["objects"] == 2 * s["segments"]
    # an entry is durable no later than committed; nothing is offloaded before it is written
    assert 0 < s["lag_durable"]["max_s"] <= s["lag_committed"]["max_s"]
    assert s["lag_met"] == (s["lag_committed"]["max_s"] <= SMOKE.lag_target_s)
    verbs = q["streaming"]["requests_by_verb"]
    assert verbs["create_multipart"] == verbs["complete_multipart"] == s["segments"]
    assert verbs["put"] == s["segments"]  # one index per segment
    assert verbs["upload_part"] >= s["segments"]
    small = q["ledger_based"]["64 KiB"]
    assert small["requests_by_verb"] == {"put": 2 * small["ledgers"]}  # data + index
    assert q["met"] == (q["streaming"]["put_class_per_gib"] <= 20)
    assert t["uploaded_mib"] >= SMOKE.backlog_mib and t["ratio"] > 0
    assert t["met"] == (t["ratio"] >= 0.8)

    rows = run._streaming_rows(result)
    assert [r[4] for r in rows] == [
        run._target("<= 4 s", s["lag_met"]),
        run._target("<= 20", q["met"]),
        run._target(">= 0.8", t["met"]),
    ]
    prose = run._streaming_prose(result)
    assert f"{s['lag_committed']['max_s']} s" in prose and "Modelled, not measured" in prose
    flipped = copy.deepcopy(result)
    flipped["stream"]["lag_met"] = not s["lag_met"]
    lines = run._streaming_findings(flipped)
    assert lines[0].endswith(f"{run._verdict(not s['lag_met'])}.")


def test_the_report_says_when_streaming_was_not_measured() -> None:
    assert run._streaming_rows({}) == []
    assert run._streaming_prose({}) == "Not run."
    assert run._streaming_findings({"skipped": "no server"}) == [
        "- Streaming offload: not measured (no server)."
    ]

"""The chaos soak's short form (the long one is `make soak`): a few cycles with a fixed seed,
faults and kills really happening, and nothing lost, leaked or committed twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.databases import require_postgres
from soak.driver import Soak, SoakOptions, render_table, write_docs, write_results

SEED = 20261207


@pytest.mark.slow
@pytest.mark.s3
@pytest.mark.postgres
@pytest.mark.timeout(1200)  # about a minute on an idle 2-core machine; far more when shared
def test_short_soak_loses_leaks_and_double_commits_nothing(tmp_path: Path) -> None:
    require_postgres()
    soak = Soak(SoakOptions(seed=SEED, cycles=2, out_dir=tmp_path))
    summary = soak.run()
    json_path, md_path = write_results(summary, tmp_path, soak.steps_log)
    print(render_table(summary))

    assert summary["cycles"] == 2
    # the chaos really happened
    assert sum(summary["faults"].values()) > 0, summary["faults"]
    assert summary["kills"] >= 1
    assert summary["entries_verified"] > 0
    # and nothing was lost, leaked or committed twice
    assert summary["journal_mismatches"] == []
    assert summary["lost_entries"] == []
    assert summary["readable_below_start"] == []
    assert (summary["leaked"], summary["lost"], summary["double_commits"]) == (0, 0, 0)
    assert summary["verify"]["runs"] == 2
    assert summary["verify"]["unavailable"] == 0, "offloader verify is not in this build"
    assert summary["verify"]["failed"] == 0, summary["verify"]["samples"]
    assert summary["settle_problems"] == []
    assert summary["unexplained_failures"] == [], summary["unexplained_failures"]
    assert summary["ok"], summary["failures"]

    assert json_path.name == f"{summary['started'][:10]}-seed{SEED}.json"
    assert md_path.read_text().count("| objects leaked | 0 |") == 1


def test_the_figures_go_into_the_marked_block_of_the_docs(tmp_path: Path) -> None:
    summary = {
        "seed": 5,
        "started": "2026-12-07T03:00:00+00:00",
        "minutes": 1.5,
        "cycles": 3,
        "operations": {"gc": 3},
        "failed_steps": {},
        "failed_by_cause": {},
        "faults": {"slowdown_503": 2},
        "kills": 1,
        "deadline_kills": 0,
        "db_drop_events": 1,
        "dropped_connections": 2,
        "entries_verified": 90,
        "entries_refused_below_start": 4,
        "leaked": 0,
        "lost": 0,
        "double_commits": 0,
        "verify": {"runs": 3, "failed": 0, "unavailable": 0},
        "ok": True,
        "failures": [],
        "notes": [],
        "unexplained_failures": [],
    }
    result, _ = write_results(summary, tmp_path)
    docs = tmp_path / "RELIABILITY.md"
    docs.write_text("# Reliability\n\nIntro by hand.\n\n## Later\n")
    write_docs(result, docs)
    first = docs.read_text()
    assert "| entries verified | 90 |" in first and "Intro by hand." in first
    summary["entries_verified"] = 91
    result, _ = write_results(summary, tmp_path)
    write_docs(result, docs)  # replaces the block, keeps the rest
    second = docs.read_text()
    assert "| entries verified | 91 |" in second and "| entries verified | 90 |" not in second
    assert second.count("soak-results:begin") == 1
    assert second.startswith("# Reliability\n\nIntro by hand.\n\n## Later\n")

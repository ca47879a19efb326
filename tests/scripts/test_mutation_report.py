"""scripts/mutation_report.py: which survivor notes are stale, and where the numbers come from."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import mutation_report
from mutation_cache import Cache

SWEEP = "offloader.gc.sweep.x_sweep__mutmut_"


def test_only_notes_of_tested_modules_can_be_stale() -> None:
    results = {
        "offloader/gc/sweep.py": {
            SWEEP + "1": "killed",
            SWEEP + "2": "survived",
            SWEEP + "3": "not checked",
        },
        "offloader/offload/keys.py": {"offloader.offload.keys.x_key__mutmut_1": "not checked"},
    }
    notes = {
        SWEEP + "1": {},  # killed since the note was written: stale
        SWEEP + "2": {},  # still survives
        SWEEP + "3": {},  # not run yet: cannot tell
        SWEEP + "9": {},  # no such mutant in a tested module: stale
        "offloader.offload.keys.x_key__mutmut_1": {},  # module never tested
        "offloader.read.tiered.x_read__mutmut_1": {},  # module absent from the results
    }
    assert mutation_report.stale_notes(results, notes) == [SWEEP + "1", SWEEP + "9"]


def test_run_lines_count_the_verdicts_each_run_decided() -> None:
    cache = Cache(
        runs={
            "a": {"commit": "abc", "date": "2026-11-23", "machine": "m", "command": "make mutate"},
            "b": {"commit": "def", "date": "2026-11-24", "machine": "m", "command": "make x"},
        },
        modules={
            "offloader/gc/sweep.py": {
                "x_sweep": {"hash": "h", "codes": [1, 0, None], "run": "a"},
                "x_other": {"hash": "h", "codes": [1], "run": "b"},
                "x_never": {"hash": "h", "codes": [None], "run": None},
            }
        },
    )
    assert mutation_report.run_lines(cache) == [
        "- 2026-11-23, commit `abc` (m): `make mutate`: 2 verdicts",
        "- 2026-11-24, commit `def` (m): `make x`: 1 verdicts",
    ]
    statuses = mutation_report.cached_results(cache)["offloader/gc/sweep.py"]
    assert statuses[SWEEP + "2"] == "survived"
    assert statuses["offloader.gc.sweep.x_never__mutmut_1"] == "not checked"

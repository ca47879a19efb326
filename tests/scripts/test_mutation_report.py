"""scripts/mutation_report.py: which survivor notes are stale, and where the numbers come from."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytest

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


def test_docs_get_the_table_the_report_gets_the_runs_and_survivors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run logs and per-mutant lists go to mutation/report.md, never into docs/."""
    from mutmut.mutation.file_mutation import compute_function_hashes

    library = tmp_path / "include"
    module = library / "offloader" / "gc" / "sweep.py"
    module.parent.mkdir(parents=True)
    module.write_text("def sweep(a):\n    return a + 1\n")
    notes = tmp_path / "survivors.toml"
    notes.write_text(f'["{SWEEP}2"]\nkind = "equivalent"\nreason = "no test can tell"\n')
    monkeypatch.setattr(mutation_report, "LIBRARY", library)
    monkeypatch.setattr(mutation_report, "load_notes", partial(mutation_report.load_notes, notes))
    digest = compute_function_hashes(module.read_text())["x_sweep"]
    sweep = {"x_sweep": {"hash": digest, "codes": [1, 0], "run": "a"}}
    cache = Cache(
        runs={"a": {"commit": "abc", "date": "2026-11-23", "machine": "m", "command": "make x"}},
        modules={"offloader/gc/sweep.py": sweep},
    )
    stage = tmp_path / "stage"  # no mutated copy: the survivors' diffs are left out
    docs = mutation_report.markdown(stage, cache)
    report = mutation_report.report(stage, cache)
    row = "| `offloader/gc/sweep.py` | 1 | 0 | 1 | 0 | 0 | 0 | 1 | 100.0% |"
    assert docs.startswith(mutation_report.START) and docs.endswith(mutation_report.END)
    assert row in docs and "Surviving mutants: 1, 0 without a note." in docs
    assert "make x" not in docs and SWEEP + "2" not in docs
    assert "- 2026-11-23, commit `abc` (m): `make x`: 2 verdicts" in report
    assert f"- `{SWEEP}2` (survived) : **equivalent**: no test can tell" in report
    assert row not in report

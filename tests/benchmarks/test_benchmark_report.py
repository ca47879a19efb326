"""docs/BENCHMARKS.md says only what the run measured: verdicts computed from the results,
the machine and UTC date always written, hand-written analysis outside the generated block
kept as it is."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package lives beside tests/

from benchmarks import run  # noqa: E402


@pytest.fixture
def results() -> dict:
    """The shape the harness writes (benchmarks/results/latest.json), values ours to set."""
    return copy.deepcopy(json.loads(run.RESULTS.read_text()))


def test_verdicts_follow_the_numbers(results: dict) -> None:
    o = results["offload_s3"]["offload"]
    o.update(ratio=0.5, met=False)
    small = results["small_ledgers"]
    small["after_batched"]["ratio_to_raw"] = 0.73
    small["met"] = True
    doc = run.document(results)
    assert "- Offload throughput ours/raw 0.50 (target >= 0.8): **missed**." in doc
    assert "- Small ledgers batched/raw 0.73 (target >= 0.5): **met**" in doc
    o.update(ratio=0.93, met=True)
    small["after_batched"]["ratio_to_raw"] = 0.31
    small["met"] = False
    doc = run.document(results)
    assert "- Offload throughput ours/raw 0.93 (target >= 0.8): **met**." in doc
    assert "- Small ledgers batched/raw 0.31 (target >= 0.5): **missed**" in doc


def test_machine_and_date_are_written_and_the_pulsar_figure_is_measured(results: dict) -> None:
    results["date"] = "2031-01-02 03:04 UTC"
    results["machine"].update(nproc=7, cpu="Test CPU 9000", memory_gib=12.5)
    doc = run.document(results)
    assert "on 2031-01-02 03:04 UTC" in doc
    assert "Machine: 7 CPUs (Test CPU 9000), 12.5 GiB" in doc
    assert "Pulsar-style v1 reader, measured" in doc
    assert "Pulsar layout" not in doc  # the modelled figure is gone


def test_a_run_rewrites_only_the_generated_block(
    results: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    head = "# Benchmarks\n\nintro kept\n\n"
    tail = "\n\n## Analysis (hand-written, 2030-01-01)\n\nnumbers from then: 1.06\n"
    doc.write_text(head + run.BEGIN + "\nold generated text\n" + run.END + tail)
    monkeypatch.setattr(run, "DOC", doc)
    run.write_doc(results)
    first = doc.read_text()
    assert first.startswith(head + run.BEGIN) and first.endswith(run.END + tail)
    assert "old generated text" not in first
    run.write_doc(results)
    assert doc.read_text() == first


def test_the_sequential_read_reports_the_batch_api_and_read_apart(results: dict) -> None:
    """Results with both paths: each has its own ratio, target and verdict. Results from
    before the batch API (latest.json's figures are read()'s) never pass for the batch API."""
    r = results["offload_s3"]["sequential_read"]
    r.pop("read_tuples", None)
    r.update(ratio=0.7, target=0.8, met=False)
    doc = run.document(results)
    assert "- Sequential read, batch API: not measured (results predate it)." in doc
    assert "- Sequential read, `read()` tuples ours/raw 0.70 (target >= 0.8): **missed**." in doc
    tuples = {**r, "ratio": 0.81, "met": True}
    r.update(ratio=0.84, target=0.85, met=False, read_tuples=tuples)
    doc = run.document(results)
    assert "- Sequential read, batch API ours/raw 0.84 (target >= 0.85): **missed**." in doc
    assert "- Sequential read, `read()` tuples ours/raw 0.81 (target >= 0.8): **met**." in doc
    assert "Batch API target >= 0.85: **missed** (ratio 0.84)" in doc
    assert "| 0.84 | >= 0.85: MISSED |" in doc and "| 0.81 | >= 0.8: met |" in doc
    r.update(ratio=0.9, met=True)
    assert "- Sequential read, batch API ours/raw 0.90 (target >= 0.85): **met**." in (
        run.document(results)
    )

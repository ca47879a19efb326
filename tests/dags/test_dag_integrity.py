"""Every DAG file imports cleanly, fast, without I/O, and carries tags and retries."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
DAG_FILES = sorted(p for p in DAGS.glob("*.py") if not p.name.startswith("_"))

# Parse one file under an audit hook that records network connections, database opens and
# file writes: a DAG file must do none of these at parse time.
PROBE = r"""
import json, sys, time
events = []
def hook(event, args):
    if event in ("socket.connect", "sqlite3.connect", "subprocess.Popen", "os.system"):
        events.append([event, repr(args)[:200]])
    elif event == "open" and len(args) > 1 and isinstance(args[1], str) and any(
            c in args[1] for c in "wax+") and args[0] != "/dev/null":
        events.append([event, repr(args)[:200]])
# Airflow's own import-time work is not the DAG's (croniter shells out to `file`; dill,
# which the OpenLineage provider's import of airflow.models brings, opens /dev/null)
import airflow.sdk, croniter
sys.addaudithook(hook)
import importlib.util
spec = importlib.util.spec_from_file_location("dag_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
started = time.process_time()  # CPU seconds: a loaded machine does not inflate them
spec.loader.exec_module(module)
seconds = time.process_time() - started
print(json.dumps({"seconds": seconds, "events": events}))
"""


def test_there_are_dags() -> None:
    assert DAG_FILES, f"no DAG files in {DAGS}"


def test_dagbag_has_no_import_errors_and_every_dag_is_tagged_and_retried() -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert bag.dags, "no DAGs loaded"
    for dag_id, dag in bag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        for task in dag.tasks:
            assert task.retries and task.retries > 0, f"{dag_id}.{task.task_id} has no retries"
        assert not dag.catchup, f"{dag_id}: catchup must be explicit"


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_parse_is_fast_and_does_no_io(path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["events"] == [], f"{path.name} does I/O at parse time: {report['events']}"
    # a coarse guard against heavy imports at parse time, in CPU seconds of the parse (about
    # 0.2 s; 0.6 s for the Spark DAGs, whose SparkSubmitOperator import brings the OpenLineage
    # provider's listener and airflow.models): speed itself is measured in benchmarks, not here
    assert report["seconds"] < 3.0, f"{path.name} took {report['seconds']:.2f} CPU s to parse"
    assert time.monotonic() - started < 60


def test_the_probe_catches_io(tmp_path: Path) -> None:
    bad = tmp_path / "bad_dag.py"
    bad.write_text("import sqlite3\nsqlite3.connect(':memory:')\n")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(bad)], capture_output=True, text=True, timeout=120
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [e[0] for e in report["events"]] == ["sqlite3.connect"]

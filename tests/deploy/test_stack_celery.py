"""`make stack STACK_EXECUTOR=celery`: scripts/stack.sh runs Airflow's services and two
Celery workers instead of `airflow standalone`; `status` lists them, `down` stops them.

The real script on a stack of its own: a short temporary folder (SeaweedFS's Unix socket
paths must be short), free ports, databases named for this run (dropped at the end), a
Redis database claimed for the run, no Spark (STACK_SPARK=0)."""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.airflow_scheduler import CELERY_APP, REDIS_HOST, REDIS_PORT, redis_database
from fixtures.databases import pg_dsn, require_postgres

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "scripts" / "stack.sh"
# long: the short form runs the same Airflow services and workers through the test fixture
# (tests/dags/test_celery_workers.py); this one checks the script's start, status and stop
pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.postgres, pytest.mark.timeout(900)]


def port_pair_free(port: int) -> bool:
    """``port`` and ``port + 10000`` (SeaweedFS's gRPC twin) both free on loopback."""
    for candidate in (port, port + 10000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def stack_ports() -> dict[str, str]:
    """Every STACK_*_PORT the Celery stack without Spark opens, free now."""
    names = ("S3", "WEED_MASTER", "WEED_VOLUME", "WEED_FILER", "WEED_ADMIN")
    names += ("AIRFLOW", "AIRFLOW_WORKER_LOG", "AIRFLOW_TRIGGER_LOG")
    ports: list[int] = []
    while len(ports) < len(names):
        port = random.randrange(20000, 30000)
        if port not in ports and port_pair_free(port):
            ports.append(port)
    return {f"STACK_{n}_PORT": str(p) for n, p in zip(names, ports, strict=True)}


def stack(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(STACK), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def drop_database(name: str) -> None:
    drop = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
    subprocess.run(
        ["psql", "-X", "-q", "-d", f"{pg_dsn()} dbname=postgres", "-c", drop],
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture
def celery_stack_env() -> Iterator[dict[str, str]]:
    require_postgres()
    run = uuid.uuid4().hex[:10]
    with (
        tempfile.TemporaryDirectory(prefix="stk-", dir="/tmp") as folder,
        redis_database() as redis_db,
    ):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "STACK_"))}
        env |= stack_ports() | {
            "STACK_DIR": f"{folder}/stack",
            "STACK_AIRFLOW_DB": f"airflow_stack_{run}",
            "STACK_OFFLOADER_DB": f"offloader_stack_{run}",
            "STACK_EXECUTOR": "celery",
            "STACK_WORKERS": "2",
            "STACK_WORKER_CONCURRENCY": "1",
            "STACK_SPARK": "0",
            "STACK_REDIS_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}",
        }
        try:
            yield env
        finally:
            stack(env, "down", timeout=300)
            for name in (env["STACK_AIRFLOW_DB"], env["STACK_OFFLOADER_DB"]):
                drop_database(name)


def test_a_celery_stack_runs_two_workers_and_stops_them(celery_stack_env: dict[str, str]) -> None:
    env = celery_stack_env
    up = stack(env, "up", timeout=800)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    for n in (1, 2):
        assert f"airflow-worker-{n} ready after" in up.stdout, up.stdout

    status = stack(env, "status")
    assert status.returncode == 0, status.stdout
    running = {line.split()[0] for line in status.stdout.splitlines() if " running " in line}
    assert running == {
        "seaweedfs",
        "airflow-api-server",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "airflow-worker-1",
        "airflow-worker-2",
    }, status.stdout

    # both are nodes of the broker the scheduler sends to (the env file the stack wrote)
    env_file = Path(env["STACK_DIR"]) / "env.sh"
    ping_command = [sys.executable, "-m", "celery", "--app", CELERY_APP, "inspect", "ping"]
    ping = subprocess.run(
        ["bash", "-c", f". {shlex.quote(str(env_file))} && exec {shlex.join(ping_command)}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "airflow-worker-1@" in ping.stdout and "airflow-worker-2@" in ping.stdout, ping

    down = stack(env, "down", timeout=300)
    assert down.returncode == 0, down.stderr
    status = stack(env, "status")
    assert status.returncode == 3 and " running " not in status.stdout, status.stdout
    with contextlib.suppress(FileNotFoundError):
        assert not list((Path(env["STACK_DIR"]) / "run").glob("*.pid"))

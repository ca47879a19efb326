"""`make airflow`'s environment: the API server listens on loopback only, and the login's
password is in a file of mode 600, never in the log.

Runs the real thing the Makefile runs (scripts/demo_env.sh, scripts/airflow_login.py, the
API server) on a free port, with Airflow's home in a temporary directory.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.airflow_server import free_port, stop_group

ROOT = Path(__file__).resolve().parents[2]


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on ``port`` (from /proc/net/tcp*)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                if width == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[tuple[int, Path, Path]]:
    """`make airflow`'s steps up to the API server (not standalone's scheduler and
    dag-processor: they add nothing to what is checked here)."""
    port = free_port()
    home = tmp_path / "airflow"
    log = tmp_path / "api-server.log"
    script = (
        ". scripts/demo_env.sh"
        f" && export AIRFLOW_HOME={home}"
        f" && export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE={home}/passwords.json"
        " && airflow db migrate >/dev/null"
        f" && {sys.executable} scripts/airflow_login.py"
        " && exec airflow api-server --workers 1"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW__API__PORT"] = str(port)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(1)
        yield port, home / "passwords.json", log
    finally:
        stop_group(process)


def test_the_ui_listens_on_loopback_and_the_password_stays_in_its_file(api_server) -> None:
    port, password_file, log = api_server
    assert listening_addresses(port) == {"127.0.0.1"}
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    password = json.loads(password_file.read_text())["admin"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/auth/token",
        data=json.dumps({"username": "admin", "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.load(response)["access_token"]
    text = log.read_text()
    assert f"passwords in {password_file}" in text
    assert password not in text


def test_the_login_script_keeps_existing_passwords(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["AIRFLOW_HOME"] = str(tmp_path)
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = "admin:admin,viewer:viewer"
    file = tmp_path / "passwords.json"
    file.write_text(json.dumps({"admin": "kept-as-it-was"}))
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] = str(file)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "airflow_login.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    passwords = json.loads(file.read_text())
    assert passwords["admin"] == "kept-as-it-was" and len(passwords["viewer"]) == 20
    assert passwords["viewer"] not in done.stdout + done.stderr
    assert stat.S_IMODE(file.stat().st_mode) == 0o600

"""Who may open the tiered-storage view, its API and its metrics, in a real Airflow API server
with the simple auth manager: anonymous, an invalid token, a signed-in user with no role
(permitted nothing), a viewer and an admin, by bearer token and by the UI's cookie; and
Prometheus' scrape token, right, wrong and absent, configured as an Airflow connection."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from fixtures.airflow import DAGS
from fixtures.airflow_server import (
    USER,
    AirflowServer,
    api_token,
    http_answer,
    running_server,
)
from offloader_airflow.ui.access import FORBIDDEN, SCRAPE_CONN_ID

DAG_IDS = sorted(p.stem for p in DAGS.glob("*.py"))
PATHS = ("/offloader/", "/offloader/api/tiers", "/offloader/metrics")
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("airflow_server")]


@pytest.fixture(scope="module")
def tokens(airflow_server: AirflowServer) -> dict[str, str]:
    """A JWT of each user of the server (admin, viewer, and nobody: no role)."""
    return {user: api_token(airflow_server, user) for user in airflow_server.passwords}


@pytest.fixture
def scrape_token(airflow_server: AirflowServer) -> Iterator[str]:
    """The scrape token, stored as the password of the offloader_metrics connection in
    Airflow's database (as the UI or ``airflow connections add`` would), removed after."""
    token = secrets.token_urlsafe(24)
    airflow_server.airflow(
        "connections", "add", SCRAPE_CONN_ID, "--conn-type", "generic", "--conn-password", token
    )
    try:
        yield token
    finally:
        airflow_server.airflow("connections", "delete", SCRAPE_CONN_ID)


def answer(
    server: AirflowServer, path: str, bearer: str | None = None, cookie: str | None = None
) -> tuple[int, Any, str]:
    headers = {"Cookie": f"_token={cookie}"} if cookie else {}
    return http_answer(server, path, bearer, headers)


def assert_login_redirect(server: AirflowServer, bearer: str | None = None) -> None:
    status, headers, _ = answer(server, "/offloader/", bearer)
    assert status == 303 and "/auth/login?next=" in headers["Location"]


def assert_granted(server: AirflowServer, path: str, answered: tuple[int, Any, str]) -> None:
    status, headers, body = answered
    assert status == 200, f"GET {path}: {status} {body[:500]}"
    if path == "/offloader/api/tiers":
        assert sorted(d["dag_id"] for d in json.loads(body)["dags"]) == DAG_IDS
    elif path == "/offloader/metrics":
        assert headers["Content-Type"] == PROMETHEUS_TEXT
        assert "# TYPE " in body
    else:
        assert "<h1>Tiered storage</h1>" in body
        assert all(f'data-dag="{dag_id}"' in body for dag_id in DAG_IDS)
    assert server.password not in body


def test_anonymous_callers_are_sent_to_sign_in(airflow_server: AirflowServer) -> None:
    assert_login_redirect(airflow_server)
    assert answer(airflow_server, "/offloader/api/tiers")[0] == 401
    assert answer(airflow_server, "/offloader/metrics")[0] == 401


def test_an_invalid_token_is_refused(airflow_server: AirflowServer) -> None:
    assert_login_redirect(airflow_server, "not-a-jwt")
    assert answer(airflow_server, "/offloader/api/tiers", "not-a-jwt")[0] == 403
    assert answer(airflow_server, "/offloader/metrics", "not-a-jwt")[0] == 403


@pytest.mark.parametrize("by", ["bearer", "cookie"])
def test_a_signed_in_user_without_the_permission_gets_403(
    airflow_server: AirflowServer, tokens: dict[str, str], by: str
) -> None:
    credential = {by: tokens["nobody"]}
    for path in PATHS:
        status, _, body = answer(airflow_server, path, **credential)
        assert status == 403, f"GET {path}: {status} {body[:500]}"
        if path == "/offloader/":
            assert FORBIDDEN in body and "<h1>" not in body
        else:
            assert json.loads(body)["detail"] == FORBIDDEN


@pytest.mark.parametrize(
    ("user", "by"), [("viewer", "bearer"), ("viewer", "cookie"), (USER, "bearer")]
)
def test_viewers_and_admins_may_read_all_three(
    airflow_server: AirflowServer, tokens: dict[str, str], user: str, by: str
) -> None:
    for path in PATHS:
        assert_granted(airflow_server, path, answer(airflow_server, path, **{by: tokens[user]}))


def test_the_scrape_token_opens_the_metrics_alone(
    airflow_server: AirflowServer, tokens: dict[str, str], scrape_token: str
) -> None:
    assert_granted(
        airflow_server,
        "/offloader/metrics",
        answer(airflow_server, "/offloader/metrics", scrape_token),
    )
    # not a key to the view: the token is no Airflow user
    assert answer(airflow_server, "/offloader/api/tiers", scrape_token)[0] == 403
    assert_login_redirect(airflow_server, scrape_token)
    # Airflow users still scrape with their own token
    assert_granted(
        airflow_server,
        "/offloader/metrics",
        answer(airflow_server, "/offloader/metrics", tokens["viewer"]),
    )
    assert answer(airflow_server, "/offloader/metrics", tokens["nobody"])[0] == 403
    wrong = secrets.token_urlsafe(24)
    for bearer in (wrong, scrape_token[:-1], scrape_token + "x"):
        status, _, body = answer(airflow_server, "/offloader/metrics", bearer)
        assert status == 403 and scrape_token not in body and bearer not in body
    assert answer(airflow_server, "/offloader/metrics")[0] == 401
    log = airflow_server.log.read_text()
    assert scrape_token not in log and wrong not in log


def test_without_a_scrape_token_only_airflow_users_scrape(
    airflow_server: AirflowServer, tokens: dict[str, str]
) -> None:
    assert answer(airflow_server, "/offloader/metrics", secrets.token_urlsafe(24))[0] == 403
    assert answer(airflow_server, "/offloader/metrics")[0] == 401
    assert_granted(
        airflow_server,
        "/offloader/metrics",
        answer(airflow_server, "/offloader/metrics", tokens[USER]),
    )


# --- the DAG runs listed: only those of the DAGs the user may read (multi-team mode) -------

SHARED_DAG = "shared_open"
RED_DAG = "red_secret"
DAG_FILE = """from datetime import datetime

from airflow.sdk import DAG

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), tags=["test"]):
    pass
"""


@pytest.fixture(scope="module")
def team_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    """Multi-team mode: a bundle of no team (``shared_open``) and one of team ``red``
    (``red_secret``), one queued run each; an admin, a viewer of team red, a viewer of team
    blue. The simple auth manager lets a team's users read only their team's DAGs (and
    those of no team)."""
    base = tmp_path_factory.mktemp("airflow-teams")
    bundles = []
    for name, dag_id, team in (("shared", SHARED_DAG, None), ("red", RED_DAG, "red")):
        folder = base / "bundles" / name
        folder.mkdir(parents=True)
        (folder / f"{dag_id}.py").write_text(DAG_FILE.format(dag_id=dag_id))
        bundle: dict[str, Any] = {
            "name": name,
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(folder)},
        }
        if team:
            bundle["team_name"] = team
        bundles.append(bundle)
    env = {
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
    }

    def prepare(server: AirflowServer) -> None:
        for team in ("red", "blue"):
            server.airflow("teams", "create", team)
        server.airflow("dags", "reserialize")
        for dag_id in (SHARED_DAG, RED_DAG):
            server.airflow("dags", "trigger", dag_id, "--run-id", f"manual__{dag_id}")

    roles = {"operator": "admin", "red": "viewer:red", "blue": "viewer:blue"}
    with running_server(base, roles, prepare, env) as server:
        yield server


def listed_runs(server: AirflowServer, user: str) -> dict[str, list[str]]:
    status, _, body = http_answer(server, "/offloader/api/tiers", api_token(server, user))
    assert status == 200, body[:500]
    return {d["dag_id"]: [r["run_id"] for r in d["runs"]] for d in json.loads(body)["dags"]}


def test_the_runs_listed_are_those_of_the_dags_the_user_may_read(
    team_server: AirflowServer,
) -> None:
    everything = {SHARED_DAG: [f"manual__{SHARED_DAG}"], RED_DAG: [f"manual__{RED_DAG}"]}
    assert listed_runs(team_server, "operator") == everything
    assert listed_runs(team_server, "red") == everything
    assert listed_runs(team_server, "blue") == {SHARED_DAG: [f"manual__{SHARED_DAG}"]}
    assert {SHARED_DAG, RED_DAG}.isdisjoint(DAG_IDS)  # not hidden behind a DAG of dags/
    # Airflow's own API agrees: blue may not read red's runs
    path = f"/api/v2/dags/{RED_DAG}/dagRuns"
    assert http_answer(team_server, path, api_token(team_server, "blue"))[0] == 403
    assert http_answer(team_server, path, api_token(team_server, "red"))[0] == 200

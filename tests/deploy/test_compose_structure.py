"""The production shape (docker-compose.yaml, Dockerfile, deploy/) checked without Docker.

No container engine runs in CI, and ``docker compose config`` is not usable here, so the
compose file is read with ``yaml.safe_load`` and variables are substituted the way compose
does it (``${VAR}``, ``${VAR:?msg}``, ``${VAR:-default}``, ``$$``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / "deploy" / ".env.example"

AIRFLOW_SERVICES = (
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
)
SPARK_SERVICES = ("spark-master", "spark-worker")
ONE_SHOT_SERVICES = ("seaweedfs-init", "airflow-init")
REQUIRED_SERVICES = (
    "postgres",
    "seaweedfs",
    *ONE_SHOT_SERVICES,
    *SPARK_SERVICES,
    *AIRFLOW_SERVICES,
)
CONNECTION_VARS = (
    "AIRFLOW_CONN_OFFLOADER_DEFAULT",
    "AIRFLOW_CONN_AWS_DEFAULT",
    "AIRFLOW_CONN_SPARK_DEFAULT",
)

# ${NAME}, ${NAME:?message}, ${NAME?message}, ${NAME:-default}, ${NAME-default}
VAR_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|FERNET|TOKEN|(^|_)KEY$|ACCESS_KEY", re.IGNORECASE)
URL_PASSWORD = re.compile(r"[a-z0-9+.-]+://[^:/@\s\"']+:(?P<password>[^@\s\"']+)@", re.IGNORECASE)


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose-style substitution; ``$$`` is a literal dollar for the container."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        value = env.get(name)
        if op in (":?", "?") and not value:
            raise KeyError(f"{name} required: {arg}")
        if op in (":-", "-") and not value:
            return arg
        return value or ""

    placeholder = "\0"
    return VAR_REF.sub(one, text.replace("$$", placeholder)).replace(placeholder, "$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def references(compose: dict[str, Any]) -> list[re.Match[str]]:
    """Every ${VAR...} in the compose data (comments are not data: yaml drops them)."""
    return [m for _, value in walk_strings(compose) for m in VAR_REF.finditer(value)]


@pytest.fixture(scope="module")
def dummy_env(compose: dict[str, Any]) -> dict[str, str]:
    """A value for every variable the compose file references: letters and digits only,
    as deploy/.env.example asks for."""
    return {m["name"]: f"x{m['name'].lower().replace('_', '')}" for m in references(compose)}


@pytest.fixture(scope="module")
def dockerfile() -> str:
    # Join continuation lines: one logical instruction per line.
    return DOCKERFILE.read_text().replace("\\\n", " ")


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the "KEY=value" list form
        env = dict(item.split("=", 1) for item in env)
    return {str(key): str(value) for key, value in env.items()}


def command_text(service: Mapping[str, Any]) -> str:
    command = service.get("command", "")
    return " ".join(command) if isinstance(command, list) else str(command)


def named_volume_mounts(service: Mapping[str, Any]) -> dict[str, str]:
    """Named volume -> container path (bind mounts, which start with . or /, left out)."""
    mounts = {}
    for volume in service.get("volumes") or []:
        source, target = volume.split(":")[:2]
        if not source.startswith((".", "/")):
            mounts[source] = target
    return mounts


def bind_mounts(service: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(host path, container path, mode) of every bind mount."""
    result = []
    for volume in service.get("volumes") or []:
        parts = volume.split(":")
        if parts[0].startswith((".", "/")):
            result.append((parts[0], parts[1], parts[2] if len(parts) > 2 else "rw"))
    return result


def walk_strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk_strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk_strings(value, f"{path}[{index}]")
    elif isinstance(node, str):
        yield path, node


def is_required_reference(value: str) -> bool:
    """The whole value is one ``${VAR:?...}``: no default that could be a real secret."""
    match = VAR_REF.fullmatch(value.strip())
    return match is not None and match["op"] in (":?", "?")


# ------------------------------------------------------------------------------- services


def test_every_required_service_exists(services: dict[str, Any]) -> None:
    missing = set(REQUIRED_SERVICES) - set(services)
    assert not missing, f"services missing from docker-compose.yaml: {sorted(missing)}"


def test_airflow_and_spark_run_the_same_image(services: dict[str, Any]) -> None:
    # The Spark driver runs inside the Airflow scheduler, the executors on the Spark
    # workers: one image guarantees one Spark, one Python, one offloader library.
    shapes = {
        name: (json.dumps(services[name].get("build"), sort_keys=True), services[name].get("image"))
        for name in (*AIRFLOW_SERVICES, "airflow-init", *SPARK_SERVICES)
    }
    assert len(set(shapes.values())) == 1, shapes
    build, image = next(iter(shapes.values()))
    assert json.loads(build) in (".", {"context": "."}), "built from this repository's Dockerfile"
    assert image, "the shared image has a name, so compose builds it once"


def test_every_long_running_service_has_a_healthcheck(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if name in ONE_SHOT_SERVICES:
            assert str(service.get("restart", "no")) == "no", f"{name} is one-shot"
            continue
        check = service.get("healthcheck") or {}
        assert not check.get("disable"), name
        test = check.get("test")
        assert test and test != ["NONE"], f"{name} has no healthcheck"
        assert service.get("restart") in ("always", "unless-stopped"), name


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_services_wait_for_init_and_stores(services: dict[str, Any], name: str) -> None:
    depends = services[name].get("depends_on")
    assert isinstance(depends, dict), f"{name}: long depends_on syntax, with conditions"
    conditions = {dep: spec.get("condition") for dep, spec in depends.items()}
    assert conditions["airflow-init"] == "service_completed_successfully"
    assert conditions["postgres"] == "service_healthy"
    assert conditions["seaweedfs"] == "service_healthy"


def test_one_shot_jobs_are_ordered(services: dict[str, Any]) -> None:
    def conditions(name: str) -> dict[str, str]:
        return {dep: spec["condition"] for dep, spec in services[name]["depends_on"].items()}

    assert conditions("seaweedfs-init") == {"seaweedfs": "service_healthy"}
    assert conditions("airflow-init") == {
        "postgres": "service_healthy",
        "seaweedfs-init": "service_completed_successfully",
    }
    assert conditions("spark-worker") == {"spark-master": "service_healthy"}


def test_every_dependency_condition_matches_the_dependency(services: dict[str, Any]) -> None:
    # A one-shot never becomes healthy, a server never "completes": the wrong condition
    # either hangs `up` forever or starts consumers too early.
    for name, service in services.items():
        for dep, spec in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            want = (
                "service_completed_successfully" if dep in ONE_SHOT_SERVICES else "service_healthy"
            )
            assert spec.get("condition") == want, f"{name} -> {dep}"
            if want == "service_healthy":
                assert services[dep].get("healthcheck"), f"{dep} needs a healthcheck"


def test_init_jobs_migrate_create_pool_and_bucket(services: dict[str, Any]) -> None:
    init = command_text(services["airflow-init"])
    assert "airflow db migrate" in init
    assert "python -m offloader_airflow.upgrade" in init  # tasks never migrate
    assert 'airflow pools set offload_uploads 4 "bounded concurrent uploads"' in init
    bucket = command_text(services["seaweedfs-init"])
    assert "s3 mb s3://offloader" in bucket
    assert "head-bucket --bucket offloader" in bucket, "idempotent: a second `up` succeeds"


def test_spark_cluster_commands(services: dict[str, Any]) -> None:
    master = command_text(services["spark-master"])
    worker = command_text(services["spark-worker"])
    assert master.startswith("spark-class org.apache.spark.deploy.master.Master")
    assert worker.startswith("spark-class org.apache.spark.deploy.worker.Worker")
    port = re.search(r"--port (\d+)", master)
    assert port, "explicit master port"
    assert f"spark://spark-master:{port[1]}" in worker


def test_apiserver_healthcheck_uses_monitor_health(services: dict[str, Any]) -> None:
    api = services["airflow-apiserver"]
    assert "airflow api-server --port 8080" in command_text(api)
    assert "http://localhost:8080/api/v2/monitor/health" in " ".join(api["healthcheck"]["test"])


# ---------------------------------------------------------------------------- connections


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_services_share_the_connections(services: dict[str, Any], name: str) -> None:
    reference = environment(services["airflow-scheduler"])
    env = environment(services[name])
    for var in CONNECTION_VARS:
        assert env.get(var) == reference[var], f"{name}: {var}"


def connection(services: dict[str, Any], var: str, env: Mapping[str, str]) -> dict[str, Any]:
    raw = environment(services["airflow-scheduler"])[var]
    return json.loads(interpolate(raw, env))


def test_offloader_connection(services: dict[str, Any], dummy_env: dict[str, str]) -> None:
    conn = connection(services, "AIRFLOW_CONN_OFFLOADER_DEFAULT", dummy_env)
    assert conn["conn_type"] == "generic"
    extra = conn["extra"]
    assert set(extra) >= {"metadata_url", "object_store_url", "ledger_dir", "aws_conn_id"}
    password = dummy_env["OFFLOADER_DB_PASSWORD"]
    assert extra["metadata_url"] == (
        f"postgresql+psycopg2://offloader:{password}@postgres:5432/offloader"
    )
    assert extra["object_store_url"] == "s3://offloader/ledgers"
    assert extra["aws_conn_id"] == "aws_default"
    # The ledger dir is the shared hot-tier volume, where tasks and Spark executors run.
    for name in ("airflow-scheduler", "spark-worker"):
        assert extra["ledger_dir"] in named_volume_mounts(services[name]).values(), name


def test_aws_connection(services: dict[str, Any], dummy_env: dict[str, str]) -> None:
    conn = connection(services, "AIRFLOW_CONN_AWS_DEFAULT", dummy_env)
    assert conn["conn_type"] == "aws"
    assert conn["login"] == dummy_env["S3_ACCESS_KEY"]
    assert conn["password"] == dummy_env["S3_SECRET_KEY"]
    assert conn["extra"]["region_name"] == "us-east-1"
    s3_port = re.search(r"-s3\.port=(\d+)", command_text(services["seaweedfs"]))
    assert s3_port, "SeaweedFS S3 port is explicit"
    assert conn["extra"]["endpoint_url"] == f"http://seaweedfs:{s3_port[1]}"


def test_spark_connection(services: dict[str, Any], dummy_env: dict[str, str]) -> None:
    conn = connection(services, "AIRFLOW_CONN_SPARK_DEFAULT", dummy_env)
    # conn_type spark + full master URL in host: the spark provider's hook then builds
    # spark://spark-master:7077 (host plus port).
    assert conn["conn_type"] == "spark"
    assert conn["host"] == "spark://spark-master"
    master_port = re.search(r"--port (\d+)", command_text(services["spark-master"]))
    assert master_port
    assert int(conn["port"]) == int(master_port[1])
    assert conn["extra"]["deploy-mode"] == "client"
    assert conn["extra"]["spark-binary"] == "spark-submit"


# ------------------------------------------------------------------------------- secrets


def test_no_plaintext_secret_in_environment(compose: dict[str, Any]) -> None:
    blocks = [("x-airflow-common", compose["x-airflow-common"])]
    blocks += list(compose["services"].items())
    for name, service in blocks:
        for key, value in environment(service).items():
            if SECRET_NAME.search(key) and not key.endswith("_FILE"):
                assert is_required_reference(value), f"{name}: {key} must be ${{VAR:?...}}"


def test_no_plaintext_secret_anywhere(compose: dict[str, Any], dummy_env: dict[str, str]) -> None:
    def mask(match: re.Match[str]) -> str:
        return "REQUIREDREF" if match["op"] in (":?", "?") else "OTHERREF"

    for path, value in walk_strings(compose):
        # Passwords inside URLs (SQLAlchemy URLs, also inside connection JSON). References
        # are masked first: their messages may contain spaces, which end a URL.
        for match in URL_PASSWORD.finditer(VAR_REF.sub(mask, value)):
            assert match["password"] == "REQUIREDREF", f"{path}: password in URL"
        # Secret fields of JSON connections.
        if value.lstrip().startswith("{"):
            conn = json.loads(interpolate(value, dummy_env))
            raw = json.loads(VAR_REF.sub("REF", value))
            for field in ("login", "password"):
                if field in conn:
                    assert raw[field] == "REF", f"{path}: {field} must be a ${{VAR}} reference"


def test_env_example_covers_every_required_variable(compose: dict[str, Any]) -> None:
    required = {m["name"] for m in references(compose) if m["op"] in (":?", "?")}
    example = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            example[key.strip()] = value.strip()
    assert required <= set(example), f"missing from .env.example: {sorted(required - set(example))}"
    for key, value in example.items():
        if SECRET_NAME.search(key) and key != "S3_ACCESS_KEY":
            assert value == "change-me", f"{key}: .env.example holds placeholders only"


def test_no_real_env_file_committed() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", ".env", "deploy/.env"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert tracked.stdout.strip() == "", "an .env with real secrets is tracked by git"


# ------------------------------------------------------------------------------- volumes


def test_named_volumes_declared_and_used(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    assert declared >= {"postgres-data", "seaweedfs-data", "airflow-logs", "ledgers"}
    used = {
        volume
        for service in compose["services"].values()
        for volume in named_volume_mounts(service)
    }
    assert used <= declared, f"undeclared named volumes: {sorted(used - declared)}"
    assert declared <= used, f"declared but unused: {sorted(declared - used)}"


def test_volumes_mounted_where_the_data_lives(services: dict[str, Any]) -> None:
    assert named_volume_mounts(services["postgres"])["postgres-data"] == "/var/lib/postgresql/data"
    assert named_volume_mounts(services["seaweedfs"])["seaweedfs-data"] == "/data"
    assert "-dir=/data" in command_text(services["seaweedfs"])
    for name in AIRFLOW_SERVICES:
        mounts = named_volume_mounts(services[name])
        assert mounts.get("airflow-logs") == "/opt/airflow/logs", name
    for name in ("airflow-scheduler", "spark-worker"):
        assert named_volume_mounts(services[name]).get("ledgers") == "/data/ledgers", name


@pytest.mark.parametrize("name", (*AIRFLOW_SERVICES, "airflow-init"))
def test_code_mounted_read_only(services: dict[str, Any], dockerfile: str, name: str) -> None:
    mounts = {host: (target, mode) for host, target, mode in bind_mounts(services[name])}
    for folder in ("dags", "plugins", "include"):
        target, mode = mounts[f"./{folder}"]
        assert target == f"/opt/offloader/{folder}", name
        assert mode == "ro", f"{name}: ./{folder} must be read-only"
    # The mounted folders are the ones Airflow reads (set in the image).
    assert "AIRFLOW__CORE__DAGS_FOLDER=/opt/offloader/dags" in dockerfile
    assert "AIRFLOW__CORE__PLUGINS_FOLDER=/opt/offloader/plugins" in dockerfile


def test_bind_mount_sources_exist(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for host, _, _ in bind_mounts(service):
            assert (ROOT / host).exists(), f"{name}: {host} missing"


def test_postgres_init_script(services: dict[str, Any]) -> None:
    mounts = {host: target for host, target, _ in bind_mounts(services["postgres"])}
    assert mounts["./deploy/postgres/init.sql"].startswith("/docker-entrypoint-initdb.d/")
    sql = (ROOT / "deploy/postgres/init.sql").read_text()
    for database in ("airflow", "offloader"):
        assert re.search(rf"CREATE DATABASE {database} OWNER {database}\b", sql), database
        assert re.search(rf"CREATE ROLE {database} LOGIN PASSWORD :'\w+'", sql), database
    assert "\\getenv airflow_db_password AIRFLOW_DB_PASSWORD" in sql
    assert "\\getenv offloader_db_password OFFLOADER_DB_PASSWORD" in sql
    env = environment(services["postgres"])
    assert {"AIRFLOW_DB_PASSWORD", "OFFLOADER_DB_PASSWORD", "POSTGRES_PASSWORD"} <= set(env)


def test_seaweedfs_identities_generated_from_env(services: dict[str, Any]) -> None:
    seaweed = services["seaweedfs"]
    template = json.loads((ROOT / "deploy/seaweedfs/s3.json").read_text())
    credentials = template["identities"][0]["credentials"][0]
    assert credentials == {"accessKey": "@S3_ACCESS_KEY@", "secretKey": "@S3_SECRET_KEY@"}
    entrypoint = ROOT / "deploy/seaweedfs/entrypoint.sh"
    assert os.access(entrypoint, os.X_OK)
    assert seaweed["entrypoint"][-1] == "/etc/seaweedfs-template/entrypoint.sh"
    assert {"S3_ACCESS_KEY", "S3_SECRET_KEY"} <= set(environment(seaweed))
    # Every port explicit: SeaweedFS picks its own otherwise.
    command = command_text(seaweed)
    for flag in ("master.port", "volume.port", "filer.port", "s3.port"):
        assert f"-{flag}=" in command and f"-{flag}.grpc=" in command, flag


# ---------------------------------------------------------------------------------- ports


def test_ports_published_on_loopback(services: dict[str, Any]) -> None:
    expected = {"airflow-apiserver": "8080", "spark-master": "8080", "seaweedfs": "8333"}
    for name, container_port in expected.items():
        ports = [str(p) for p in services[name].get("ports") or []]
        assert any(p.endswith(f":{container_port}") for p in ports), f"{name}: {ports}"
    for name, service in services.items():
        for port in service.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} bound to every interface"
    # Workers scale with --scale: a fixed host port would make the second replica fail.
    assert not services["spark-worker"].get("ports")


# ----------------------------------------------------------------------------- Dockerfile


def test_dockerfile_base_java_and_user(dockerfile: str) -> None:
    assert re.search(r"^FROM python:3\.11-slim-bookworm\b", dockerfile, re.MULTILINE)
    assert "openjdk-17-jre-headless" in dockerfile
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    assert users and users[-1] not in ("root", "0"), "runs as a non-root user"
    for setting in (
        "AIRFLOW_HOME=/opt/airflow",
        "PYSPARK_PYTHON=python",
        "SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark",
    ):
        assert setting in dockerfile, setting


def test_dockerfile_installs_like_the_makefile(dockerfile: str) -> None:
    assert re.search(r"^COPY requirements\.txt constraints\.txt ", dockerfile, re.MULTILINE)
    steps = [
        "pip install -r requirements.txt -c constraints.txt",
        "pip uninstall -y pyspark-client",
        "pip install --force-reinstall --no-deps",
        "pip install --no-deps -e .",
    ]
    positions = [dockerfile.find(step) for step in steps]
    assert -1 not in positions, dict(zip(steps, positions, strict=True))
    assert positions == sorted(positions), "constraints, drop pyspark-client, full pyspark, repo"
    # The full pyspark pinned by requirements.txt (read at build time, never a second pin).
    assert "pyspark==$(sed -n 's/^pyspark==//p' requirements.txt)" in dockerfile
    assert "requirements-dev.txt" not in dockerfile, "no test tooling in the image"
    # Airflow 3 on PostgreSQL needs asyncpg: the build must fail loudly without it.
    assert 'python -c "import asyncpg"' in dockerfile
    for folder in ("include/", "plugins/", "dags/"):
        assert re.search(rf"^COPY {folder} ", dockerfile, re.MULTILINE), folder


# --------------------------------------------------------------------------------- shells


@pytest.mark.parametrize(
    ("shell", "script"),
    [("sh", "deploy/seaweedfs/entrypoint.sh"), ("bash", "scripts/stack.sh")],
)
def test_shell_scripts_parse(shell: str, script: str) -> None:
    path = ROOT / script
    assert os.access(path, os.X_OK), f"{script} is executable"
    # sh and bash are part of every image this runs on: a missing one is a broken
    # environment, not a reason to skip the check
    assert shutil.which(shell) is not None, f"{shell} is not installed; cannot check {script}"
    subprocess.run([shell, "-n", str(path)], check=True)


def test_interpolate_behaves_like_compose() -> None:
    env = {"A": "1"}
    assert interpolate("${A}-${B:-2}-$${C}", env) == "1-2-${C}"
    with pytest.raises(KeyError):
        interpolate("${B:?set B}", env)


# ------------------------------------------------------------------------- specification


def test_the_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    """The compose specification's JSON schema (as vendored by check-jsonschema): an unknown
    key, a wrong type or a misspelt option fails here instead of on `docker compose up`."""
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(compose)
    ]
    assert not errors, "\n".join(errors)


def test_the_schema_check_catches_a_misspelt_option(compose: dict[str, Any]) -> None:
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["airflow-worker"]["healthchek"] = broken["services"]["airflow-worker"].pop(
        "healthcheck"
    )
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert any("healthchek" in e.message for e in validator.iter_errors(broken))


# ---------------------------------------------------------------------- the celery profile

CELERY_PROFILE = ("redis", "airflow-worker")


def test_the_default_profile_keeps_its_services_and_executor(
    services: dict[str, Any], dummy_env: dict[str, str]
) -> None:
    default = {n for n, s in services.items() if not s.get("profiles")}
    assert default == set(REQUIRED_SERVICES)
    for name in CELERY_PROFILE:
        assert services[name]["profiles"] == ["celery"], name
    # without AIRFLOW_EXECUTOR (the default .env), the scheduler runs tasks itself
    executor = environment(services["airflow-scheduler"])["AIRFLOW__CORE__EXECUTOR"]
    assert interpolate(executor, {}) == "LocalExecutor"
    assert interpolate(executor, {"AIRFLOW_EXECUTOR": "CeleryExecutor"}) == "CeleryExecutor"


def test_the_workers_scale(services: dict[str, Any]) -> None:
    """`--scale airflow-worker=N`: nothing a second replica would collide on."""
    worker = services["airflow-worker"]
    for key in ("container_name", "hostname", "ports"):
        assert key not in worker, f"airflow-worker: {key} makes replicas collide"
    assert "redis" in services and not services["redis"].get("ports"), "broker not published"


def test_the_workers_run_what_the_scheduler_runs(services: dict[str, Any]) -> None:
    worker, scheduler = services["airflow-worker"], services["airflow-scheduler"]
    assert (worker["build"], worker["image"]) == (scheduler["build"], scheduler["image"])
    assert environment(worker) == environment(scheduler), "same settings and connections"
    assert sorted(worker["volumes"]) == sorted(scheduler["volumes"]), "same code, logs, hot tier"
    assert named_volume_mounts(worker)["ledgers"] == "/data/ledgers"
    command = command_text(worker)
    assert command.rstrip().endswith("exec airflow celery worker")
    assert '"$${AIRFLOW__CORE__EXECUTOR}" != CeleryExecutor' in command, "refuses LocalExecutor"
    conditions = {d: s["condition"] for d, s in worker["depends_on"].items()}
    assert conditions["redis"] == conditions["airflow-apiserver"] == "service_healthy"
    assert conditions["airflow-init"] == "service_completed_successfully"
    assert "inspect ping" in " ".join(worker["healthcheck"]["test"])


def test_the_broker_is_the_profiles_redis(services: dict[str, Any]) -> None:
    for name in (*AIRFLOW_SERVICES, "airflow-worker"):
        assert environment(services[name])["AIRFLOW__CELERY__BROKER_URL"] == "redis://redis:6379/0"
    # the scheduler waits for Redis only when the profile runs it
    assert services["airflow-scheduler"]["depends_on"]["redis"] == {
        "condition": "service_healthy",
        "required": False,
    }
    assert named_volume_mounts(services["redis"]) == {"redis-data": "/data"}

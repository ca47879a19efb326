#!/usr/bin/env bash
# The docker-compose.yaml stack without Docker, for a laptop or a CI box:
#   SeaweedFS (S3)  ->  Spark master + worker  ->  PostgreSQL databases  ->  Airflow standalone
# everything bound to 127.0.0.1, state, pid files and logs under var/stack.
#
#   scripts/stack.sh up       start what is not running, wait until each answers, print URLs
#   scripts/stack.sh down     stop everything (TERM, wait, KILL); safe to repeat
#   scripts/stack.sh status   which components run
#
# Ports are fixed (see below) and can be moved with STACK_*_PORT variables. The PostgreSQL
# server is not ours: we only create two databases on it (airflow_stack, offloader_stack).
#
# STACK_EXECUTOR=celery runs Airflow as the production shape does instead of `airflow
# standalone`: api-server, scheduler, dag-processor, triggerer and STACK_WORKERS (2) Celery
# workers, each a component of its own; Redis (not ours either, like PostgreSQL) is the
# broker at STACK_REDIS_URL, PostgreSQL (the Airflow database) Celery's result backend.
# `down` and `status` handle whichever shape is running.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/.venv/bin"
# STACK_DIR, STACK_*_DB: a second stack beside this one (the deploy tests run one)
STACK="${STACK_DIR:-$ROOT/var/stack}"
RUN_DIR="$STACK/run"
LOG_DIR="$STACK/log"
HOST=127.0.0.1

# SeaweedFS opens one HTTP and one gRPC port per component and, when a port is not given,
# silently picks another one. Every port is therefore explicit.
S3_PORT="${STACK_S3_PORT:-8333}"
WEED_MASTER_PORT="${STACK_WEED_MASTER_PORT:-9333}"
WEED_VOLUME_PORT="${STACK_WEED_VOLUME_PORT:-8380}"
WEED_FILER_PORT="${STACK_WEED_FILER_PORT:-8888}"
WEED_ADMIN_PORT="${STACK_WEED_ADMIN_PORT:-23646}"
SPARK_MASTER_PORT="${STACK_SPARK_MASTER_PORT:-7077}"
SPARK_MASTER_UI_PORT="${STACK_SPARK_MASTER_UI_PORT:-8081}"
# The master's REST submission server (cluster deploy mode) listens by default in Spark 4.
SPARK_MASTER_REST_PORT="${STACK_SPARK_MASTER_REST_PORT:-6066}"
SPARK_WORKER_PORT="${STACK_SPARK_WORKER_PORT:-7078}"
SPARK_WORKER_UI_PORT="${STACK_SPARK_WORKER_UI_PORT:-8082}"
AIRFLOW_PORT="${STACK_AIRFLOW_PORT:-8080}"
# Airflow's log servers (scheduler/LocalExecutor and triggerer) listen on every interface;
# Airflow has no setting for their bind address. At least their ports are ours to choose.
AIRFLOW_WORKER_LOG_PORT="${STACK_AIRFLOW_WORKER_LOG_PORT:-8793}"
AIRFLOW_TRIGGER_LOG_PORT="${STACK_AIRFLOW_TRIGGER_LOG_PORT:-8794}"

PG_HOST="${STACK_PG_HOST:-127.0.0.1}"
PG_PORT="${STACK_PG_PORT:-5432}"
PG_USER="${STACK_PG_USER:-postgres}"
AIRFLOW_DB="${STACK_AIRFLOW_DB:-airflow_stack}"
OFFLOADER_DB="${STACK_OFFLOADER_DB:-offloader_stack}"
BUCKET=offloader

SPARK_WORKER_CORES="${STACK_SPARK_WORKER_CORES:-2}"
SPARK_WORKER_MEMORY="${STACK_SPARK_WORKER_MEMORY:-2g}"

# Start-up budgets in seconds. Airflow standalone migrates, then starts four processes that
# each import all of Airflow: minutes on a slow machine.
S3_TIMEOUT="${STACK_S3_TIMEOUT:-60}"
SPARK_TIMEOUT="${STACK_SPARK_TIMEOUT:-90}"
AIRFLOW_TIMEOUT="${STACK_AIRFLOW_TIMEOUT:-300}"

EXECUTOR="${STACK_EXECUTOR:-local}"
WORKERS="${STACK_WORKERS:-2}"
WORKER_CONCURRENCY="${STACK_WORKER_CONCURRENCY:-2}"
REDIS_URL="${STACK_REDIS_URL:-redis://127.0.0.1:6379/0}"
# STACK_SPARK=0 leaves Spark out (the Spark DAGs then fail; the others do not need it)
SPARK="${STACK_SPARK:-1}"
[[ "$EXECUTOR" == local || "$EXECUTOR" == celery ]] ||
  { echo "[stack] ERROR: STACK_EXECUTOR must be local or celery, not '$EXECUTOR'" >&2; exit 2; }
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] ||
  { echo "[stack] ERROR: STACK_WORKERS must be a positive number, not '$WORKERS'" >&2; exit 2; }

# Components in start order; `down` walks it backwards.
COMPONENTS=(seaweedfs)
[[ "$SPARK" == 0 ]] || COMPONENTS+=(spark-master spark-worker)
CELERY_AIRFLOW=(airflow-api-server airflow-scheduler airflow-dag-processor airflow-triggerer)
if [[ "$EXECUTOR" == celery ]]; then
  COMPONENTS+=("${CELERY_AIRFLOW[@]}")
  for ((n = 1; n <= WORKERS; n++)); do COMPONENTS+=("airflow-worker-$n"); done
else
  COMPONENTS+=(airflow)
fi

# Every process we launch carries this variable, so `down` can find a straggler that left
# our process groups (Airflow puts each task in a group of its own) without guessing by name.
MARKER="OFFLOADER_STACK_DIR=$STACK"

log() { printf '[stack] %s\n' "$*"; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------
# Process bookkeeping. Each component runs as the leader of its own process group (setsid),
# and its pid file holds that pid = group id: signalling the group reaches the JVM that
# spark-class execs and the four Airflow processes that standalone forks.

pid_file() { echo "$RUN_DIR/$1.pid"; }

# Prints the group id of a component that is still alive; fails (and forgets a stale pid
# file) otherwise. A group is alive while any member is, even if the leader exited.
running_pid() {
  local file pid
  file="$(pid_file "$1")"
  [[ -f "$file" ]] || return 1
  pid="$(<"$file")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 -- "-$pid" 2>/dev/null; then
    echo "$pid"
    return 0
  fi
  rm -f "$file"
  return 1
}

port_busy() {
  # Bash's /dev/tcp: no dependency on nc/ss. A connect that succeeds means someone listens.
  (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

require_free_ports() {
  local name=$1 port
  shift
  for port in "$@"; do
    if port_busy "$port"; then
      die "$name: port $port on $HOST is already in use (set STACK_*_PORT to move it)"
    fi
  done
}

# start NAME COMMAND...: launch in a new session, stdout+stderr to the component's log.
start() {
  local name=$1 pid
  shift
  # No job control in a script: the background child is not a group leader, so setsid
  # execs in place (no fork) and $! is the new session's leader, the pid we record.
  env "$MARKER" setsid "$@" >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$(pid_file "$name")"
  log "$name started (pid $pid, log ${LOG_DIR#"$ROOT"/}/$name.log)"
}

# wait_for NAME TIMEOUT CHECK...: poll CHECK until it succeeds; fail early with the log
# tail if the component died, so a bad flag does not cost the whole timeout.
wait_for() {
  local name=$1 timeout=$2 started=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ! running_pid "$name" >/dev/null; then
      tail -n 40 "$LOG_DIR/$name.log" >&2 || true
      die "$name exited during start-up (log: $LOG_DIR/$name.log)"
    fi
    if ((SECONDS - started > timeout)); then
      tail -n 40 "$LOG_DIR/$name.log" >&2 || true
      die "$name not ready after ${timeout}s (log: $LOG_DIR/$name.log); run: scripts/stack.sh down"
    fi
    sleep 1
  done
  log "$name ready after $((SECONDS - started))s"
}

# stop NAME GRACE: TERM the whole group, give it GRACE seconds, then KILL what is left.
stop() {
  local name=$1 grace=$2 pid waited=0 began=$SECONDS
  if ! pid="$(running_pid "$name")"; then
    log "$name not running"
    return 0
  fi
  log "$name stopping (group $pid)"
  kill -TERM -- "-$pid" 2>/dev/null || true
  while kill -0 -- "-$pid" 2>/dev/null && ((waited < grace * 5)); do
    sleep 0.2
    waited=$((waited + 1))
  done
  if kill -0 -- "-$pid" 2>/dev/null; then
    log "$name still running after ${grace}s: KILL"
    kill -KILL -- "-$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$(pid_file "$name")"
  log "$name stopped after $((SECONDS - began))s"
}

# Processes that carry our marker but live outside the recorded groups (Airflow task
# process groups orphaned by a KILL). Matched on the exact environment entry, by pid.
stragglers() {
  local environ pid
  for environ in /proc/[0-9]*/environ; do
    pid="${environ#/proc/}"
    pid="${pid%/environ}"
    [[ "$pid" == "$$" || "$pid" == "$BASHPID" ]] && continue
    # -z: environ entries end in NUL. Unreadable (exited, other user's) files just miss.
    if grep -qzxF -- "$MARKER" "$environ" 2>/dev/null; then
      echo "$pid"
    fi
  done
}

# ---------------------------------------------------------------------------------------
# Configuration shared by the components and by people who want a CLI on the stack.

S3_ENV="$STACK/s3.env"
ENV_FILE="$STACK/env.sh"

# A random secret per checkout, made once and kept, so restarts keep working with the data
# already in SeaweedFS. Only letters and digits: it goes into JSON and sed unescaped.
ensure_s3_credentials() {
  if [[ ! -f "$S3_ENV" ]]; then
    (
      umask 077
      printf 'S3_ACCESS_KEY=offloader-stack\nS3_SECRET_KEY=%s\n' \
        "$("$BIN/python" -c 'import secrets; print(secrets.token_hex(20))')" >"$S3_ENV"
    )
  fi
  # shellcheck disable=SC1090
  source "$S3_ENV"
}

# The same three connections as docker-compose.yaml, pointing at 127.0.0.1 ports, plus the
# OFFLOADER_* variables so the `offloader` CLI talks to the same stores. Written to
# var/stack/env.sh (mode 0600: it holds the S3 secret) and sourced from there.
write_env_file() {
  local metadata_url="postgresql+psycopg2://$PG_USER@$PG_HOST:$PG_PORT/$OFFLOADER_DB"
  local ledger_dir="$STACK/ledgers"
  local s3_url="http://$HOST:$S3_PORT"
  local conn_offloader conn_aws conn_spark
  conn_offloader="{\"conn_type\": \"generic\", \"extra\": {\"metadata_url\": \"$metadata_url\", \"object_store_url\": \"s3://$BUCKET/ledgers\", \"ledger_dir\": \"$ledger_dir\", \"aws_conn_id\": \"aws_default\"}}"
  conn_aws="{\"conn_type\": \"aws\", \"login\": \"$S3_ACCESS_KEY\", \"password\": \"$S3_SECRET_KEY\", \"extra\": {\"endpoint_url\": \"$s3_url\", \"region_name\": \"us-east-1\", \"config_kwargs\": {\"s3\": {\"addressing_style\": \"path\"}}}}"
  conn_spark="{\"conn_type\": \"spark\", \"host\": \"spark://$HOST\", \"port\": $SPARK_MASTER_PORT, \"extra\": {\"deploy-mode\": \"client\", \"spark-binary\": \"spark-submit\"}}"
  local -a vars=(
    # standalone runs `airflow <component>` from PATH: it must be this virtualenv's.
    "PATH=$BIN:$PATH"
    "AIRFLOW_HOME=$STACK/airflow"
    "AIRFLOW__CORE__DAGS_FOLDER=$ROOT/dags"
    "AIRFLOW__CORE__PLUGINS_FOLDER=$ROOT/plugins"
    "AIRFLOW__CORE__LOAD_EXAMPLES=False"
    "AIRFLOW__CORE__EXECUTOR=$([[ "$EXECUTOR" == celery ]] && echo CeleryExecutor || echo LocalExecutor)"
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgresql+psycopg2://$PG_USER@$PG_HOST:$PG_PORT/$AIRFLOW_DB"
    "AIRFLOW__API__HOST=$HOST"
    "AIRFLOW__API__PORT=$AIRFLOW_PORT"
    "AIRFLOW__API__WORKERS=1"
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://$HOST:$AIRFLOW_PORT/execution/"
    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=$AIRFLOW_WORKER_LOG_PORT"
    "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=$AIRFLOW_TRIGGER_LOG_PORT"
    "AIRFLOW_CONN_OFFLOADER_DEFAULT=$conn_offloader"
    "AIRFLOW_CONN_AWS_DEFAULT=$conn_aws"
    "AIRFLOW_CONN_SPARK_DEFAULT=$conn_spark"
    "OFFLOADER_METADATA_URL=$metadata_url"
    "OFFLOADER_OBJECT_STORE_URL=s3://$BUCKET/ledgers"
    "OFFLOADER_S3_ENDPOINT_URL=$s3_url"
    "OFFLOADER_S3_ACCESS_KEY_ID=$S3_ACCESS_KEY"
    "OFFLOADER_S3_SECRET_ACCESS_KEY=$S3_SECRET_KEY"
    "OFFLOADER_LEDGER_DIR=$ledger_dir"
    # Spark drivers started by tasks: same Python as the workers, loopback only.
    "PYSPARK_PYTHON=$BIN/python"
    "SPARK_LOCAL_IP=$HOST"
  )
  if [[ "$EXECUTOR" == celery ]]; then
    vars+=(
      "AIRFLOW__CELERY__BROKER_URL=$REDIS_URL"
      "AIRFLOW__CELERY__RESULT_BACKEND=db+postgresql+psycopg2://$PG_USER@$PG_HOST:$PG_PORT/$AIRFLOW_DB"
      "AIRFLOW__CELERY__WORKER_CONCURRENCY=$WORKER_CONCURRENCY"
      # one task per pool process at a time: a prefetched task would wait behind a long one
      "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER=1"
      # each worker reports its own name on the task instances it runs (one machine)
      "AIRFLOW__CORE__HOSTNAME_CALLABLE=offloader_airflow.worker_hostname.hostname"
      # the plugins folder is not on a worker's import path before its plugins load
      "PYTHONPATH=$ROOT/plugins${PYTHONPATH:+:$PYTHONPATH}"
    )
  fi
  # Airflow 3 also opens an async engine on its database and derives the driver from the
  # sync URL: postgresql -> asyncpg. Without asyncpg every airflow command dies at import.
  # The requirements do not pin asyncpg yet, so when it is missing we switch the async
  # engine off (empty URL): everything the stack needs works; the few async-only API
  # endpoints (e.g. waiting for a DAG run) do not. Installing asyncpg lifts this by itself.
  if ! "$BIN/python" -c 'import asyncpg' 2>/dev/null; then
    log "WARNING: asyncpg not installed: Airflow's async DB engine is disabled (see docs/DEPLOYMENT.md)"
    vars+=("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC=")
  fi
  local entry
  (
    umask 077
    {
      echo "# Generated by scripts/stack.sh: source it to use airflow/offloader on the stack."
      for entry in "${vars[@]}"; do
        printf 'export %s=%q\n' "${entry%%=*}" "${entry#*=}"
      done
    } >"$ENV_FILE"
  )
  # shellcheck disable=SC1090
  source "$ENV_FILE"
}

# ---------------------------------------------------------------------------------------
# Components.

s3_check() {
  "$BIN/python" - "$@" <<'PY'
import sys

import boto3
from botocore.config import Config

endpoint, key, secret, bucket = sys.argv[1:5]
client = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id=key,
    aws_secret_access_key=secret,
    config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                  connect_timeout=1, read_timeout=3),
)
names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
if bucket and bucket not in names:
    client.create_bucket(Bucket=bucket)
PY
}

up_seaweedfs() {
  local dir="$STACK/seaweedfs"
  if running_pid seaweedfs >/dev/null; then
    log "seaweedfs already running"
  else
    require_free_ports seaweedfs "$S3_PORT" "$((S3_PORT + 10000))" \
      "$WEED_MASTER_PORT" "$((WEED_MASTER_PORT + 10000))" \
      "$WEED_VOLUME_PORT" "$((WEED_VOLUME_PORT + 10000))" \
      "$WEED_FILER_PORT" "$((WEED_FILER_PORT + 10000))" \
      "$WEED_ADMIN_PORT" "$((WEED_ADMIN_PORT + 10000))"
    mkdir -p "$dir/data" "$dir/admin"
    # Same template as the compose service (deploy/seaweedfs/s3.json), same substitution.
    (
      umask 077
      sed -e "s|@S3_ACCESS_KEY@|$S3_ACCESS_KEY|g" -e "s|@S3_SECRET_KEY@|$S3_SECRET_KEY|g" \
        "$ROOT/deploy/seaweedfs/s3.json" >"$dir/s3.json"
    )
    # Read from the working directory: one volume per new collection instead of seven.
    printf '[master.volume_growth]\ncopy_1 = 1\n' >"$dir/master.toml"
    # weed mini = master, volume, filer, S3 and admin in one process. Iceberg, Lance,
    # WebDAV, the admin UI and telemetry are off; every remaining port is explicit, and the
    # Unix sockets live here rather than as /tmp/seaweedfs-*-<port>.sock, left behind.
    (
      cd "$dir"
      start seaweedfs "$BIN/weed" mini \
        -dir="$dir/data" -ip="$HOST" -ip.bind="$HOST" \
        -s3.config="$dir/s3.json" -s3.iam=false \
        -filer.localSocket="$dir/filer.sock" -s3.localSocket="$dir/s3.sock" \
        -admin.dataDir="$dir/admin" -admin.ui=false \
        -webdav=false -s3.port.iceberg=0 -s3.port.lance=0 \
        -master.telemetry=false -master.volumeSizeLimitMB=64 -volume.preStopSeconds=0 \
        -master.port="$WEED_MASTER_PORT" -master.port.grpc="$((WEED_MASTER_PORT + 10000))" \
        -volume.port="$WEED_VOLUME_PORT" -volume.port.grpc="$((WEED_VOLUME_PORT + 10000))" \
        -filer.port="$WEED_FILER_PORT" -filer.port.grpc="$((WEED_FILER_PORT + 10000))" \
        -s3.port="$S3_PORT" -s3.port.grpc="$((S3_PORT + 10000))" \
        -admin.port="$WEED_ADMIN_PORT" -admin.port.grpc="$((WEED_ADMIN_PORT + 10000))"
    )
  fi
  # Ready = a signed ListBuckets succeeds; then the bucket is created if missing.
  wait_for seaweedfs "$S3_TIMEOUT" \
    s3_check "http://$HOST:$S3_PORT" "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$BUCKET"
}

# Master UI JSON: ALIVE, and (with an argument) at least that many registered workers.
spark_check() {
  "$BIN/python" - "http://$HOST:$SPARK_MASTER_UI_PORT/json/" "${1:-0}" <<'PY'
import json
import sys
import urllib.request

with urllib.request.urlopen(sys.argv[1], timeout=3) as response:
    state = json.load(response)
assert state["status"] == "ALIVE", state["status"]
assert state.get("aliveworkers", 0) >= int(sys.argv[2]), state.get("aliveworkers")
PY
}

# Through env(1), because setsid cannot run a shell function. SPARK_LOCAL_IP binds the JVMs
# (RPC and web UI) to loopback instead of every interface; spark-class execs the JVM, so
# the recorded pid is the JVM's.
SPARK_ENV=(env SPARK_LOCAL_IP="$HOST" PYSPARK_PYTHON="$BIN/python")

up_spark() {
  if running_pid spark-master >/dev/null; then
    log "spark-master already running"
  else
    require_free_ports spark-master "$SPARK_MASTER_PORT" "$SPARK_MASTER_UI_PORT" \
      "$SPARK_MASTER_REST_PORT"
    start spark-master "${SPARK_ENV[@]}" \
      SPARK_MASTER_OPTS="-Dspark.master.rest.port=$SPARK_MASTER_REST_PORT" "$BIN/spark-class" org.apache.spark.deploy.master.Master \
      --host "$HOST" --port "$SPARK_MASTER_PORT" --webui-port "$SPARK_MASTER_UI_PORT"
  fi
  wait_for spark-master "$SPARK_TIMEOUT" spark_check 0

  if running_pid spark-worker >/dev/null; then
    log "spark-worker already running"
  else
    require_free_ports spark-worker "$SPARK_WORKER_PORT" "$SPARK_WORKER_UI_PORT"
    mkdir -p "$STACK/spark/work"
    start spark-worker "${SPARK_ENV[@]}" "$BIN/spark-class" org.apache.spark.deploy.worker.Worker \
      "spark://$HOST:$SPARK_MASTER_PORT" --host "$HOST" --port "$SPARK_WORKER_PORT" \
      --webui-port "$SPARK_WORKER_UI_PORT" --cores "$SPARK_WORKER_CORES" \
      --memory "$SPARK_WORKER_MEMORY" --work-dir "$STACK/spark/work"
  fi
  # The worker is ready when the master lists it, not merely when its JVM is up.
  wait_for spark-worker "$SPARK_TIMEOUT" spark_check 1
}

psql_admin() {
  psql -X -q -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres "$@"
}

up_databases() {
  command -v psql >/dev/null || die "psql not found: install the PostgreSQL client"
  psql_admin -tAc 'SELECT 1' >/dev/null 2>&1 ||
    die "PostgreSQL not reachable at $PG_HOST:$PG_PORT as $PG_USER"
  local db
  for db in "$AIRFLOW_DB" "$OFFLOADER_DB"; do
    # CREATE DATABASE has no IF NOT EXISTS: look first, so a second `up` is a no-op.
    if [[ "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'")" != 1 ]]; then
      psql_admin -c "CREATE DATABASE \"$db\""
      log "database $db created"
    else
      log "database $db exists"
    fi
  done
}

airflow_health_check() {
  "$BIN/python" - "http://$HOST:$AIRFLOW_PORT/api/v2/monitor/health" <<'PY'
import json
import sys
import urllib.request

with urllib.request.urlopen(sys.argv[1], timeout=5) as response:
    health = json.load(response)
# The API server answers before the scheduler's first heartbeat: wait for both.
for part in ("metadatabase", "scheduler"):
    assert health[part]["status"] == "healthy", (part, health[part])
PY
}

up_airflow() {
  if running_pid airflow >/dev/null; then
    log "airflow already running"
  else
    require_free_ports airflow "$AIRFLOW_PORT" "$AIRFLOW_WORKER_LOG_PORT" "$AIRFLOW_TRIGGER_LOG_PORT"
    prepare_airflow
    start airflow airflow standalone
  fi
  wait_for airflow "$AIRFLOW_TIMEOUT" airflow_health_check
}

redis_check() {
  "$BIN/python" - "$REDIS_URL" <<'PY'
import sys

import redis

redis.Redis.from_url(sys.argv[1], socket_timeout=3).ping()
PY
}

# prepare_airflow: migrate, the pool and the offloader schema, before any scheduler starts.
prepare_airflow() {
  mkdir -p "$AIRFLOW_HOME" "$OFFLOADER_LEDGER_DIR"
  # Migrate and create the pool before the scheduler starts, so the first DAG run never
  # sees a missing pool. Both are idempotent; standalone's own migration is then a no-op.
  log "airflow: db migrate (log ${LOG_DIR#"$ROOT"/}/airflow-init.log)"
  env "$MARKER" airflow db migrate >>"$LOG_DIR/airflow-init.log" 2>&1 ||
    { tail -n 40 "$LOG_DIR/airflow-init.log" >&2; die "airflow db migrate failed"; }
  env "$MARKER" airflow pools set offload_uploads 4 "bounded concurrent uploads" \
    >>"$LOG_DIR/airflow-init.log" 2>&1 ||
    { tail -n 40 "$LOG_DIR/airflow-init.log" >&2; die "airflow pools set failed"; }
  # The offloader's schema, once, before any task runs (tasks only check the revision).
  # OFFLOADER_* come from the env file: the same database and store as the connection.
  log "offloader: db upgrade"
  "$BIN/offloader" db upgrade >>"$LOG_DIR/airflow-init.log" 2>&1 ||
    { tail -n 40 "$LOG_DIR/airflow-init.log" >&2; die "offloader db upgrade failed"; }
}

# A worker is ready when Celery logs "<name>@<host> ready." (it consumes from the broker).
worker_ready() {
  grep -q "$1@.* ready\." "$LOG_DIR/$1.log"
}

# The production shape on one machine: every Airflow service a component of its own, the
# workers named airflow-worker-N (Celery node and task instances' host name). No log
# server on the workers: they and the API server share this stack's log folder.
up_airflow_celery() {
  redis_check >/dev/null 2>&1 || die "Redis not reachable at $REDIS_URL (set STACK_REDIS_URL)"
  local name pending=0
  for name in "${CELERY_AIRFLOW[@]}"; do
    running_pid "$name" >/dev/null || pending=1
  done
  if ((pending)); then
    require_free_ports airflow "$AIRFLOW_PORT" "$AIRFLOW_TRIGGER_LOG_PORT"
    prepare_airflow
    for name in "${CELERY_AIRFLOW[@]}"; do
      running_pid "$name" >/dev/null || start "$name" airflow "${name#airflow-}"
    done
  fi
  wait_for airflow-api-server "$AIRFLOW_TIMEOUT" airflow_health_check
  for ((n = 1; n <= WORKERS; n++)); do
    name="airflow-worker-$n"
    if running_pid "$name" >/dev/null; then
      log "$name already running"
    else
      : >"$LOG_DIR/$name.log"  # `ready` is looked for in this start's log only
      start "$name" env OFFLOADER_WORKER_HOSTNAME="$name" airflow celery worker \
        --celery-hostname "$name@%h" --concurrency "$WORKER_CONCURRENCY" --skip-serve-logs
    fi
  done
  for ((n = 1; n <= WORKERS; n++)); do
    wait_for "airflow-worker-$n" "$AIRFLOW_TIMEOUT" worker_ready "airflow-worker-$n"
  done
}

# ---------------------------------------------------------------------------------------

cmd_up() {
  [[ -x "$BIN/python" && -x "$BIN/weed" && -x "$BIN/spark-class" && -x "$BIN/airflow" ]] ||
    die "virtualenv incomplete: run 'make install' first"
  mkdir -p "$RUN_DIR" "$LOG_DIR"
  local began=$SECONDS
  ensure_s3_credentials
  write_env_file
  if [[ "$EXECUTOR" == local ]] && running_pid airflow-scheduler >/dev/null; then
    die "a Celery stack runs here: scripts/stack.sh down first, or set STACK_EXECUTOR=celery"
  fi
  if [[ "$EXECUTOR" == celery ]] && running_pid airflow >/dev/null; then
    die "a standalone stack runs here: scripts/stack.sh down first, or unset STACK_EXECUTOR"
  fi
  up_seaweedfs
  [[ "$SPARK" == 0 ]] || up_spark
  up_databases
  if [[ "$EXECUTOR" == celery ]]; then up_airflow_celery; else up_airflow; fi
  local password_file="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
  cat <<EOF

[stack] up in $((SECONDS - began))s, on $HOST (except Airflow's log servers, ports $AIRFLOW_WORKER_LOG_PORT/$AIRFLOW_TRIGGER_LOG_PORT).
  Airflow UI/API   http://$HOST:$AIRFLOW_PORT   (user admin, password in ${password_file#"$ROOT"/})
  Airflow health   http://$HOST:$AIRFLOW_PORT/api/v2/monitor/health
  Spark master     spark://$HOST:$SPARK_MASTER_PORT   UI http://$HOST:$SPARK_MASTER_UI_PORT   REST :$SPARK_MASTER_REST_PORT
  Spark worker UI  http://$HOST:$SPARK_WORKER_UI_PORT
  S3 (SeaweedFS)   http://$HOST:$S3_PORT   bucket '$BUCKET', credentials in ${S3_ENV#"$ROOT"/}
  PostgreSQL       $PG_HOST:$PG_PORT   databases $AIRFLOW_DB, $OFFLOADER_DB
  Shell on it      source ${ENV_FILE#"$ROOT"/}   (airflow and offloader CLIs)
  Logs             ${LOG_DIR#"$ROOT"/}/
  Stop             make stack-down
EOF
}

# Every component this stack directory knows: the configured ones, and any other with a
# pid file (a Celery stack's, or more workers than STACK_WORKERS says now), workers first.
known_components() {
  local file name
  local -a extra=()
  for file in "$RUN_DIR"/*.pid; do
    [[ -e "$file" ]] || continue
    name="$(basename "$file" .pid)"
    [[ " ${COMPONENTS[*]} " == *" $name "* ]] || extra+=("$name")
  done
  printf '%s\n' "${COMPONENTS[@]}" "${extra[@]}"
}

cmd_down() {
  local i name pid
  local -a all
  mapfile -t all < <(known_components)
  # workers first (no new task starts), then the rest backwards
  for name in "${all[@]}"; do
    [[ "$name" == airflow-worker-* ]] && stop "$name" 60
  done
  for ((i = ${#all[@]} - 1; i >= 0; i--)); do
    name="${all[i]}"
    case "$name" in
      airflow-worker-*) ;;
      # The scheduler finishes its loop and the API server drains requests: give it time.
      airflow | airflow-*) stop "$name" 60 ;;
      *) stop "$name" 20 ;;
    esac
  done
  # weed puts one Unix socket per gRPC port in /tmp and does not always remove the admin
  # one. Only the files of our own ports: another SeaweedFS (the test suite's) may be up.
  local port
  for port in "$((WEED_MASTER_PORT + 10000))" "$((WEED_VOLUME_PORT + 10000))" \
    "$((WEED_FILER_PORT + 10000))" "$((S3_PORT + 10000))" "$((WEED_ADMIN_PORT + 10000))"; do
    rm -f /tmp/seaweedfs-*-grpc-"$port".sock
  done
  local -a left
  mapfile -t left < <(stragglers)
  if ((${#left[@]})); then
    log "stopping leftover stack processes: ${left[*]}"
    kill -TERM "${left[@]}" 2>/dev/null || true
    sleep 3
    mapfile -t left < <(stragglers)
    ((${#left[@]} == 0)) || kill -KILL "${left[@]}" 2>/dev/null || true
  fi
  log "down (data kept in ${STACK#"$ROOT"/}; rm -rf it and drop $AIRFLOW_DB/$OFFLOADER_DB for a clean slate)"
}

cmd_status() {
  local name pid state=0
  local -a all
  mapfile -t all < <(known_components)
  for name in "${all[@]}"; do
    if pid="$(running_pid "$name")"; then
      printf '%-22s running  (pid %s)\n' "$name" "$pid"
    else
      printf '%-22s stopped\n' "$name"
      state=3
    fi
  done
  # LSB convention: 0 when everything runs, 3 when something does not.
  return "$state"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac

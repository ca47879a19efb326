# Environment of the embedded default (local files + SQLite + Spark local), shared by
# `make demo` and `make airflow`. Source it: `. scripts/demo_env.sh`.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEMO="$ROOT/var/demo"
export AIRFLOW_HOME="$DEMO/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$ROOT/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False
# `make airflow`: the API server (UI and execution API) listens on loopback only.
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT="${AIRFLOW__API__PORT:-8080}"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$AIRFLOW__API__PORT/execution/"
# the simple auth manager's passwords (scripts/airflow_login.py writes them, mode 600)
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$AIRFLOW_HOME/passwords.json"
export OFFLOADER_DATA_DIR="$DEMO/data"
export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
# The offloader connection the DAGs use; the library's defaults under OFFLOADER_DATA_DIR.
export AIRFLOW_CONN_OFFLOADER_DEFAULT="{\"conn_type\": \"generic\", \"extra\": {\
\"metadata_url\": \"sqlite:///$DEMO/data/metadata.db\", \
\"object_store_url\": \"file://$DEMO/data/objects\", \
\"ledger_dir\": \"$DEMO/data/ledgers\"}}"
# Spark in the Airflow task's own process tree (the provider takes a host without "://"
# and without a port as the whole master URL); client mode, spark-submit from the .venv.
export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]", "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"}}'
export PATH="$ROOT/.venv/bin:$PATH"

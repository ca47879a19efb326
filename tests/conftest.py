"""Shared fixtures: real SeaweedFS, real PostgreSQL, real SQLite, a real Airflow home.

Airflow reads its configuration when first imported, so its environment is set here,
before any test module imports it: one throw-away AIRFLOW_HOME per test process, this
repo's dags/ and plugins/.
"""

import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="offloader-airflow-home-")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
# the product's own settings and connections from the caller's shell must not leak into
# tests; the test-run switches (OFFLOADER_TEST_*) are for the tests and stay
for name in [n for n in os.environ if n.startswith(("OFFLOADER_", "AIRFLOW_CONN_"))]:
    if not name.startswith("OFFLOADER_TEST_"):
        del os.environ[name]

pytest_plugins = [
    "fixtures.hypothesis_profiles",
    "fixtures.seaweedfs",
    "fixtures.databases",
    "fixtures.backends",
    "fixtures.airflow",
    "fixtures.lineage",
    "fixtures.airflow_server",
    "fixtures.browser",
    "fixtures.spark",
    "fixtures.blackhole",
]

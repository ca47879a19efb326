"""Two runners over the same topics at once: two Airflow schedulers on one PostgreSQL
metadata database running offload_ledgers, streaming_offload, retention and
garbage_collection, and two `offloader` CLI processes looping offload, stream, trim and
gc, while `offloader produce` keeps writing. Storage: SeaweedFS + PostgreSQL.

Here and not in tests/dags/: the case is about the product under concurrent runners (the
DAGs and the console script together), not about one DAG's wiring.

At the end every failure, of a task try or of a CLI command, must be fencing the design
intends (a busy stream, a lost compare-and-set, a lease the other runner holds); the
readable entries must be exactly what the producer wrote at or above the topic's start;
no ledger may have two committed attempts; and `offloader verify` must pass.

The short form runs ``SHORT_SECONDS`` of load (`slow`); the `long` form runs
``OFFLOADER_TEST_CONCURRENCY_SECONDS`` (default 600).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures.backends import POSTGRES_ONLY
from fixtures.concurrency import run_two_runners
from offloader.settings import Settings

SHORT_SECONDS = 60.0
LONG_SECONDS = float(os.environ.get("OFFLOADER_TEST_CONCURRENCY_SECONDS", "600"))

pytestmark = [POSTGRES_ONLY, pytest.mark.slow, pytest.mark.postgres, pytest.mark.s3]


@pytest.mark.timeout(SHORT_SECONDS + 420)
@pytest.mark.long  # about 5 minutes of a 2-core machine; the short suite's races between
# two runners: test_cli_races.py, test_offload_race.py, test_metadata_races.py
def test_two_schedulers_and_two_cli_runners_keep_every_promise(
    backend_settings: Settings, tmp_path: Path
) -> None:
    report = run_two_runners(backend_settings, tmp_path, seconds=SHORT_SECONDS)
    print(report)


# long: the short form above runs the same load for a minute
@pytest.mark.long
@pytest.mark.timeout(LONG_SECONDS + 600)
def test_two_schedulers_and_two_cli_runners_for_long(
    backend_settings: Settings, tmp_path: Path
) -> None:
    report = run_two_runners(backend_settings, tmp_path, seconds=LONG_SECONDS)
    print(report)

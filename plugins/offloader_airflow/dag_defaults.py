"""Task defaults every offloader DAG shares: retries with exponential backoff, an owner.

Each DAG adds its own ``execution_timeout``. Tasks are idempotent, so retrying is safe.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def default_args(execution_timeout: timedelta) -> dict[str, Any]:
    return {
        "owner": "storage",
        "retries": 3,
        "retry_delay": timedelta(seconds=20),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=10),
        "execution_timeout": execution_timeout,
    }

"""The host name a worker reports to Airflow (``[core] hostname_callable``).

Airflow records it on every task instance it runs. Several Celery workers on one machine
(`make stack STACK_EXECUTOR=celery`, the tests) would all report the machine's name, so a
worker started with ``OFFLOADER_WORKER_HOSTNAME`` reports that instead; without it, the
machine's fully qualified name, as Airflow's default does."""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    """``OFFLOADER_WORKER_HOSTNAME`` if set, else the machine's fully qualified name."""
    return os.environ.get("OFFLOADER_WORKER_HOSTNAME") or socket.getfqdn()

"""The Airflow Assets the offloader's DAGs hand work over with (one per concern, not per topic).

A task that queues deletions (retention's trim, offload's stale attempts, a topic delete)
lists :data:`DELETION_QUEUE` in its ``outlets``; the ``garbage_collection`` DAG is
scheduled on it, with an hourly fallback, so deletes follow within minutes. A task that
commits offloads (``offload_ledgers``' and ``offload_historical``'s ``offload``) updates
:data:`OFFLOADED_LEDGERS`: a DAG that reads the object tier in bulk (an export, a scrub)
can be scheduled on it instead of polling.
"""

from __future__ import annotations

from airflow.sdk import Asset

# An "x-" scheme is a user scheme Airflow does not normalise: any other unknown scheme makes
# Airflow load every provider to look for a normaliser, over a second at each DAG parse.
DELETION_QUEUE = Asset(
    name="offloader_deletion_queue",
    uri="x-offloader://metadata/deletion-queue",
    group="offloader",
)

OFFLOADED_LEDGERS = Asset(
    name="offloader_offloaded_ledgers",
    uri="x-offloader://object-store/offloaded-ledgers",
    group="offloader",
)

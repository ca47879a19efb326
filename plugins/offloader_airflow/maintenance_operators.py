"""Maintenance operators for the garbage_collection DAG: the orphan sweep and metadata export.

Thin, like every operator here: parse the params, call the library, return a JSON-able
summary for XCom. Both are idempotent: a rerun sweeps again (what was queued is now
referenced by the queue) or writes one more snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from offloader.gc.sweep import sweep
from offloader.runtime import export_metadata
from offloader_airflow.base import OffloaderBaseOperator, offloader_template_fields
from offloader_airflow.operators import _bool


class _MaintenanceOperator(OffloaderBaseOperator):
    """A maintenance task: its one argument, ``dry_run`` (templated), is all it takes."""

    template_fields: Sequence[str] = offloader_template_fields("dry_run")

    def __init__(
        self,
        *,
        dry_run: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.dry_run = dry_run


class SweepOrphansOperator(_MaintenanceOperator):
    """Queue unreferenced objects past the grace period for deletion and abort stale
    uploads in every recorded store (``dry_run``: report only, what ``offloader scan``
    does). A recorded store that does not answer is skipped and named; fails, after
    sweeping the others, if a store could not be swept for another reason."""

    def execute(self, context: Context) -> dict[str, Any]:
        dry_run = _bool(self.dry_run, "dry_run")
        with self.hook.get_runtime() as runtime:
            result = sweep(runtime.metadata, runtime.stores, runtime.settings, dry_run=dry_run)
        self.log.info("%s", result)
        result.raise_for_errors()
        swept = result.to_json()
        return {
            "dry_run": dry_run,
            "orphans": swept["orphans"],
            "skipped": swept["skipped"],  # stores that did not answer: "<store>: <why>"
            "stores": [
                {k: v for k, v in s.items() if k not in ("objects", "uploads")}
                for s in swept["stores"]
            ],
        }


class ExportMetadataOperator(_MaintenanceOperator):
    """Write a metadata snapshot to the default store and keep the newest
    ``metadata_snapshots_keep`` (older ones go through the deletion queue). A dry run
    writes nothing."""

    def execute(self, context: Context) -> dict[str, Any]:
        if _bool(self.dry_run, "dry_run"):
            self.log.info("dry run: no metadata snapshot written")
            return {"dry_run": True}
        with self.hook.get_runtime() as runtime:
            result = export_metadata(runtime)
        self.log.info("wrote metadata snapshot %s", result.snapshot.key)
        return result.to_json()

"""One garbage collection run's parameters: one model for the `garbage_collection` DAG's
trigger form and its drain task, so every bound the form shows is the task's too (built
like :class:`offloader.offload.params.OffloadRunParams`)."""

from __future__ import annotations

from pydantic import Field

from offloader.params import RunParams


class GcParams(RunParams):
    """What one run of `garbage_collection` is asked to do."""

    max_items: int = Field(
        default=100_000,
        ge=1,
        le=10_000_000,
        title="Most keys to take",
        description="Stop after this many queued keys were tried in this run.",
    )
    time_budget_seconds: int = Field(
        default=1800,
        ge=1,
        le=3300,
        title="Time budget (seconds)",
        description="Start no new pass after this long; the next run goes on.",
    )
    dry_run: bool = Field(
        default=False,
        title="Dry run",
        description="Only report: orphans the sweep would queue, the backlog, failing items.",
    )

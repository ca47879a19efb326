"""The state of the tiers for people: per topic the hot and offloaded bytes and ledgers and
the deletions still queued for it, the global deletion backlog (``offloader status``'s), and
the bytes per tier and the lags over time (the tiered-storage view's).

The metadata store reads the totals and the changes (metadata/totals.py says how the
histories are derived from the ledger, segment and deletion-queue rows); this module
shapes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.engine import make_url

from offloader.metadata import MetadataStore
from offloader.metadata.records import DeletionBacklog, Record, TopicTiers
from offloader.results import jsonable

if TYPE_CHECKING:  # the tiered-storage view reads the metadata alone: no Runtime imported
    from offloader.runtime import Runtime

#: The most points a history holds; longer ones keep evenly spread change points.
HISTORY_POINTS = 200


class TierSample(Record):
    """Bytes in each tier from ``at_ms`` on (a step function over all topics)."""

    at_ms: int
    hot_bytes: int
    offloaded_bytes: int


class LagSample(Record):
    """The lags from ``at_ms`` on, over all topics: bytes of sealed ledgers waiting for
    their offload, and keys waiting in the deletion queue (a step function)."""

    at_ms: int
    offload_lag_bytes: int
    deletion_backlog: int


class TiersReport(Record):
    now_ms: int
    topics: list[TopicTiers]
    deletion_backlog: DeletionBacklog
    history: list[TierSample]
    lag_history: list[LagSample]


S = TypeVar("S")


@dataclass(frozen=True)
class StatusReport:
    """`offloader status`: where the metadata, objects and hot tier are, rows by state, the
    tiers of each topic and the deletion backlog."""

    metadata_url: str  # without its password
    object_store: str
    ledger_dir: str
    counts: dict[str, object]  # MetadataStore.counts
    deletion_backlog: DeletionBacklog
    tiers: list[TopicTiers]  # per topic, as the Airflow UI's tiered-storage view shows them

    def to_json(self) -> dict[str, Any]:
        return {
            "metadata_url": self.metadata_url,
            "object_store": self.object_store,
            "ledger_dir": self.ledger_dir,
            **jsonable(self.counts),
            "deletion_backlog": jsonable(self.deletion_backlog),
            "tiers": jsonable(self.tiers),
        }

    def __str__(self) -> str:
        places = {
            "metadata_url": self.metadata_url,
            "object_store": self.object_store,
            "ledger_dir": self.ledger_dir,
        }
        lines = [f"{k}: {v}" for k, v in {**places, **self.counts}.items()]
        lines += [
            f"topic {t.topic}: hot {t.hot_ledgers} ledger(s) {t.hot_bytes} B, offloaded "
            f"{t.offloaded_ledgers} ledger(s) {t.offloaded_bytes} B, {t.pending_deletions} "
            "deletion(s) pending"
            for t in self.tiers
        ]
        return "\n".join(lines + backlog_lines(self.deletion_backlog))


def status_report(rt: Runtime) -> StatusReport:
    """What `offloader status` shows of ``rt``: no password in it."""
    return StatusReport(
        metadata_url=_redact_url(rt.settings.resolved_metadata_url),
        object_store=rt.objects.url,
        ledger_dir=str(rt.settings.resolved_ledger_dir),
        counts=rt.metadata.counts(),
        deletion_backlog=rt.metadata.deletions.backlog(rt.settings.gc_failing_tries),
        tiers=rt.metadata.topic_tiers(),
    )


def backlog_lines(backlog: DeletionBacklog) -> list[str]:
    """The deletion queue for people: backlog, oldest item's age, keys that keep failing."""
    age = "-" if backlog.oldest_age_ms is None else f"{backlog.oldest_age_ms / 1000:.0f}s"
    lines = [
        f"deletion backlog: {backlog.pending} pending ({backlog.due} due), oldest {age}, "
        f"{backlog.failing_count} failing (>= {backlog.failing_tries} tries)"
    ]
    lines += [
        f"  failing: {d.object_key} (store {d.store_id}, {d.tries} tries): {d.last_error}"
        for d in backlog.failing
    ]
    if backlog.failing_count > len(backlog.failing):
        lines.append(f"  ... and {backlog.failing_count - len(backlog.failing)} more")
    return lines


def _redact_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def tiers_report(metadata: MetadataStore, failing_tries: int) -> TiersReport:
    """Everything the tiered-storage view shows of the tiers, read in a few queries."""
    return TiersReport(
        now_ms=metadata.db_now_ms(),
        topics=metadata.topic_tiers(),
        deletion_backlog=metadata.deletions.backlog(failing_tries),
        history=tier_history(metadata),
        lag_history=lag_history(metadata),
    )


def tier_history(metadata: MetadataStore, points: int = HISTORY_POINTS) -> list[TierSample]:
    """Bytes per tier over time, at most ``points`` samples (metadata/totals.py)."""

    def sample(at: int, hot: int, offloaded: int) -> TierSample:
        return TierSample(at_ms=at, hot_bytes=hot, offloaded_bytes=offloaded)

    return _thin(list(_steps(metadata.tier_changes(), sample)), points)


def lag_history(metadata: MetadataStore, points: int = HISTORY_POINTS) -> list[LagSample]:
    """Offload lag bytes and deletion backlog over time, at most ``points`` samples
    (metadata/totals.py)."""

    def sample(at: int, lag: int, backlog: int) -> LagSample:
        return LagSample(at_ms=at, offload_lag_bytes=lag, deletion_backlog=backlog)

    return _thin(list(_steps(metadata.lag_changes(), sample)), points)


def _steps(
    changes: list[tuple[int, int, int]], sample: Callable[[int, int, int], S]
) -> Iterable[S]:
    """Cumulative sums of (at_ms, delta, delta) changes, one sample per distinct time."""
    first = second = 0
    changes.sort()
    for i, (at, d_first, d_second) in enumerate(changes):
        first += d_first
        second += d_second
        if i + 1 == len(changes) or changes[i + 1][0] != at:
            yield sample(at, first, second)


def _thin(samples: list[S], points: int) -> list[S]:
    """At most ``points`` samples, evenly spread, always keeping the first and the last."""
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    if len(samples) <= points:
        return samples
    step = (len(samples) - 1) / (points - 1)
    return [samples[round(i * step)] for i in range(points)]

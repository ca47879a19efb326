"""The tiers observed from the metadata alone: per topic what waits (the lags) and what is
where (the tiers), the global deletion queue, and the rows per metadata table.

Read in a fixed handful of aggregate statements (metadata/observations.py), never an
object-store request; every age is on the database's clock, against one ``now_ms``.

What each figure means (docs/OPERATIONS.md, "Metrics", lists them with their families):

- **offload lag**: the topic's live sealed ledgers that hold entries, are not offloaded and
  still have their hot copy: what an offload (or, on a streaming topic, the stream) must
  still move. Counted whatever the policy's offload thresholds say (Kafka's
  RemoteCopyLag counts every rolled segment not yet copied, the same way): a topic whose
  ``offload_threshold_bytes`` keeps data hot shows that data here by design. Seconds: since
  the oldest of them was sealed.
- **stream lag** (streaming topics; 0 and absent otherwise): entries not yet in a
  committed segment. The metadata records a ledger's size when it is sealed and a
  segment's pieces as entry ranges, not bytes, so the bytes are the sealed ledgers not
  yet settled (offloaded by the stream), each counted whole even when some of its entries
  are in committed segments already; the open ledger counts once it is sealed. Seconds: the
  older of the open segment's age since its assignment (its parts wait for the commit) and
  the oldest such ledger's age since sealing.
- **hot-deletion lag**: live offloaded ledgers whose hot copy is still there (present or
  being deleted) though the topic's ``deletion_lag_seconds`` since the offload passed.
  Seconds: how long past due the oldest is.
- **deletion backlog**: pending deletion-queue keys the topic owns (its ledgers' and its
  offload attempts' leftovers, as ``offloader status`` counts them), the oldest one's age,
  and the ones tried ``gc_failing_tries`` times or more. Keys no topic owns (orphans the
  sweep queued, snapshots) are only in the global ``deletion_backlog``.
- **tiers**: as ``offloader status`` shows them (hot_bytes, hot_ledgers; tiered_bytes and
  tiered_ledgers are its offloaded_bytes and offloaded_ledgers), plus the objects: the
  data and index objects of ledgers offloaded ledger by ledger, and of offloaded segments.

An age is ``None`` when there is nothing of its kind (no sample is exported for it).
"""

from __future__ import annotations

from pydantic import Field

from offloader.metadata import MetadataStore
from offloader.metadata.observations import TopicFacts
from offloader.metadata.records import DeletionBacklog, Record
from offloader.settings import Settings


class TierFigures(Record):
    """The figures a topic has, and the totals over all topics (sums; ages: the max)."""

    offload_lag_ledgers: int = 0
    offload_lag_bytes: int = 0
    offload_lag_seconds: float | None = None
    stream_lag_bytes: int = 0
    stream_lag_seconds: float | None = None
    hot_deletion_lag_ledgers: int = 0
    hot_deletion_lag_bytes: int = 0
    hot_deletion_lag_seconds: float | None = None
    deletion_backlog_keys: int = 0
    deletion_backlog_seconds: float | None = None
    deletion_failing_keys: int = 0
    hot_bytes: int = 0
    hot_ledgers: int = 0
    tiered_bytes: int = 0
    tiered_objects: int = 0
    tiered_segments: int = 0
    tiered_ledgers: int = 0


#: the figures that are ages: totals take their max, the rest are summed
AGES = frozenset(name for name in TierFigures.model_fields if name.endswith("_seconds"))


class TopicObservation(TierFigures):
    """One topic (deleted ones too: their queued deletions still count)."""

    topic: str
    state: str
    streaming: bool


class Totals(TierFigures):
    """Over every topic: sums, and the largest of each age."""

    topics: int = Field(ge=0)


class Observations(Record):
    now_ms: int  # the database's clock, when the figures were read
    topics: list[TopicObservation]
    totals: Totals
    deletion_backlog: DeletionBacklog  # the whole queue, keys no topic owns included
    metadata_rows: dict[str, int]  # rows per metadata table (RemoteLogMetadataCount)


def observe(metadata: MetadataStore, settings: Settings) -> Observations:
    """The tiers now, from the metadata alone (no object-store request)."""
    facts = metadata.observations.read(settings.gc_failing_tries)
    backlog = metadata.deletions.backlog(settings.gc_failing_tries)
    topics = [_topic(f, facts.now_ms) for f in facts.topics]
    return Observations(
        now_ms=facts.now_ms,
        topics=topics,
        totals=totals(topics),
        deletion_backlog=backlog,
        metadata_rows=facts.rows,
    )


def _topic(f: TopicFacts, now_ms: int) -> TopicObservation:
    def age(since_ms: int | None) -> float | None:
        return None if since_ms is None else max(0, now_ms - since_ms) / 1000

    streaming = f.topic.policy.streaming
    offload_age = age(f.oldest_unoffloaded_sealed_ms)
    stream_ages = [a for a in (offload_age, age(f.open_segment_assigned_ms)) if a is not None]
    return TopicObservation(
        topic=f.topic.name,
        state=f.topic.state.value,
        streaming=streaming,
        offload_lag_ledgers=f.unoffloaded_ledgers,
        offload_lag_bytes=f.unoffloaded_bytes,
        offload_lag_seconds=offload_age,
        stream_lag_bytes=f.unoffloaded_bytes if streaming else 0,
        stream_lag_seconds=max(stream_ages) if streaming and stream_ages else None,
        hot_deletion_lag_ledgers=f.hot_overdue_ledgers,
        hot_deletion_lag_bytes=f.hot_overdue_bytes,
        hot_deletion_lag_seconds=age(f.oldest_hot_due_ms),
        deletion_backlog_keys=f.tiers.pending_deletions,
        deletion_backlog_seconds=age(f.tiers.oldest_pending_deletion_ms),
        deletion_failing_keys=f.failing_deletions,
        hot_bytes=f.tiers.hot_bytes,
        hot_ledgers=f.tiers.hot_ledgers,
        tiered_bytes=f.tiers.offloaded_bytes,
        tiered_objects=f.ledger_objects + 2 * f.offloaded_segments,  # data + index each
        tiered_segments=f.offloaded_segments,
        tiered_ledgers=f.tiers.offloaded_ledgers,
    )


def totals(topics: list[TopicObservation]) -> Totals:
    """Sums over ``topics``; for each age, the largest (None when no topic has one)."""
    figures: dict[str, float | int | None] = {}
    for name in TierFigures.model_fields:
        values = [getattr(t, name) for t in topics]
        if name in AGES:
            present = [v for v in values if v is not None]
            figures[name] = max(present) if present else None
        else:
            figures[name] = sum(values)
    return Totals.model_validate({"topics": len(topics), **figures})

"""Per-topic service levels: the ``max_*`` fields of a topic's policy held against what
:func:`~offloader.metrics.observe.observe` saw (docs/OPERATIONS.md, "Service levels and
alerts").

Each level bounds one figure of :class:`~offloader.metrics.observe.TopicObservation`; a
figure above its limit is a breach, one exactly at it meets it, an absent age (nothing of
its kind waits) meets every limit, and a level set to ``None`` is not checked. Deleted
topics have no levels left. The report is a :class:`~offloader.results.RunResult`:
``offloader check-service-levels`` prints it and exits 1 on a breach; the Airflow check
task fails with its lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from offloader.metadata import MetadataStore
from offloader.metadata.records import Topic, TopicState
from offloader.metrics.observe import Observations, TopicObservation, observe
from offloader.policy import OffloadPolicy
from offloader.results import BreachReport, fields_json
from offloader.runtime import database_deadlines
from offloader.settings import Settings


def _size(n: int) -> str:
    """``12.0 MiB``, or ``1234 bytes`` below a MiB."""
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{n} bytes"


def _number(value: float) -> str:
    """``3600`` for 3600.0, ``1.5`` for 1.5: limits as set, figures to a tenth."""
    return str(int(value)) if value == int(value) else f"{value:.1f}"


@dataclass(frozen=True)
class Level:
    """One service level: the policy field, the observed figure it bounds, how a breach
    reads (``what`` and ``unit`` for the figure, ``context`` for what lies behind it)."""

    policy_field: str
    observed_field: str
    what: str
    unit: str
    context: Callable[[TopicObservation], str]


LEVELS: tuple[Level, ...] = (
    Level(
        "max_offload_lag_seconds",
        "offload_lag_seconds",
        "offload lag",
        "s",
        lambda o: f"{o.offload_lag_ledgers} ledgers, {_size(o.offload_lag_bytes)} not offloaded",
    ),
    Level(
        "max_offload_lag_bytes",
        "offload_lag_bytes",
        "offload lag",
        "bytes",
        lambda o: f"{o.offload_lag_ledgers} ledgers, {_size(o.offload_lag_bytes)} not offloaded",
    ),
    Level(
        "max_stream_lag_seconds",
        "stream_lag_seconds",
        "stream lag",
        "s",
        lambda o: f"{_size(o.stream_lag_bytes)} not in a committed segment",
    ),
    Level(
        "max_hot_deletion_lag_seconds",
        "hot_deletion_lag_seconds",
        "hot-deletion lag",
        "s",
        lambda o: (
            f"{o.hot_deletion_lag_ledgers} offloaded ledgers, "
            f"{_size(o.hot_deletion_lag_bytes)} still in the hot tier past their deletion lag"
        ),
    ),
    Level(
        "max_deletion_backlog_age_seconds",
        "deletion_backlog_seconds",
        "oldest queued deletion",
        "s",
        lambda o: (
            f"{o.deletion_backlog_keys} keys queued, {o.deletion_failing_keys} failing; "
            "see `offloader status`"
        ),
    ),
    Level(
        "max_deletion_failing_keys",
        "deletion_failing_keys",
        "failing deletions",
        "keys",
        lambda o: (
            f"of {o.deletion_backlog_keys} keys queued, failed gc_failing_tries times or "
            "more; see `offloader status`"
        ),
    ),
)


@dataclass(frozen=True)
class ServiceLevelBreach:
    """One level exceeded: which topic, which level (the policy field), the observed
    figure and the limit, and one line for people."""

    topic: str
    level: str
    observed: float
    limit: float
    message: str

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        return self.message


@dataclass
class ServiceLevelReport(BreachReport):
    """`offloader check-service-levels`: ok when every level set is met; exit status 1
    otherwise, one line per breach."""

    now_ms: int  # the database's clock when the figures were read
    topics: list[str]  # the topics checked (not deleted)
    levels_checked: int  # (topic, level) pairs with a level set
    breaches: list[ServiceLevelBreach] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "now_ms": self.now_ms,
            "topics": list(self.topics),
            "levels_checked": self.levels_checked,
            "breaches": [b.to_json() for b in self.breaches],
        }

    def __str__(self) -> str:
        if self.breaches:
            return "\n".join(map(str, self.breaches))
        return f"ok: {self.levels_checked} service level(s) met on {len(self.topics)} topic(s)"


def check_service_levels(
    obs: Observations, policies: Mapping[str, OffloadPolicy]
) -> ServiceLevelReport:
    """Every level that ``policies`` set, for every observed topic they name that is not
    deleted. A topic without a policy here (created after they were read) is skipped."""
    checked = [t for t in obs.topics if t.topic in policies and t.state != TopicState.DELETED.value]
    report = ServiceLevelReport(
        now_ms=obs.now_ms, topics=[t.topic for t in checked], levels_checked=0
    )
    for topic in checked:
        policy = policies[topic.topic]
        for level in LEVELS:
            limit = getattr(policy, level.policy_field)
            if limit is None:
                continue
            report.levels_checked += 1
            observed = getattr(topic, level.observed_field)
            if observed is not None and observed > limit:
                report.breaches.append(_breach(topic, level, observed, limit))
    return report


def _breach(
    topic: TopicObservation, level: Level, observed: float, limit: float
) -> ServiceLevelBreach:
    message = (
        f"topic {topic.topic}: {level.what} {_number(observed)} {level.unit} exceeds "
        f"{level.policy_field} {_number(limit)} ({level.context(topic)})"
    )
    return ServiceLevelBreach(topic.topic, level.policy_field, observed, limit, message)


def read_service_levels(
    settings: Settings, topic: str | None = None, *, streaming_only: bool = False
) -> ServiceLevelReport:
    """Observe the metadata and check the levels of ``topic`` (NotFoundError if it does
    not exist, ValueError if it was deleted, before anything else is read), or of every
    topic (``streaming_only``: every topic whose policy streams, for the streaming DAG's
    check). Opens the metadata store alone: no object store, no hot tier. The policies are
    read in one query, after the figures."""
    metadata = MetadataStore.open(settings.resolved_metadata_url, database_deadlines(settings))
    try:
        if topic is not None and metadata.get_topic(topic).is_deleted:
            raise ValueError(f"topic {topic!r} was deleted; it has no service levels left to check")
        obs = observe(metadata, settings)
        policies = {
            t.name: t.policy for t in metadata.list_topics() if _chosen(t, topic, streaming_only)
        }
    finally:
        metadata.close()
    return check_service_levels(obs, policies)


def _chosen(t: Topic, topic: str | None, streaming_only: bool) -> bool:
    if topic is not None:
        return t.name == topic
    return t.policy.streaming or not streaming_only

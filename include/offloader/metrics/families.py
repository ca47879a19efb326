"""The metric families: OpenTelemetry-style names (dotted) and UCUM units, one fixed label
set each, gauges. The set is static (:data:`FAMILIES`), so an OpenTelemetry meter can
create its instruments before the first collection; :func:`families` fills in the
samples from one :class:`~offloader.metrics.observe.Observations`.

Per-topic families are labelled ``topic``; global facts (the whole deletion queue, keys no
topic owns included; the metadata rows, labelled ``table``) are families of their own. An
age that is absent (nothing of its kind) has no sample for that topic. Exporters
(prometheus.py, otel.py) translate the names; docs/OPERATIONS.md, "Metrics", lists them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Literal

from pydantic import model_validator

from offloader.metadata.records import Record
from offloader.metrics.observe import Observations

#: UCUM units the exporters know; annotations in braces (``{ledger}``) count things
UNITS = frozenset({"By", "s", "ms", "1"})
_NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
_ANNOTATION = re.compile(r"\{[a-z_]+\}")

Sample = tuple[dict[str, str], float]


class FamilySpec(Record):
    """What a family is, before any value: name, unit, meaning, label names."""

    name: str
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    kip963: str | None = None  # Kafka's equivalent tiered-storage metric, if any

    @model_validator(mode="after")
    def _well_formed(self) -> FamilySpec:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"metric name {self.name!r}: dotted lower-case words expected")
        if self.unit not in UNITS and not _ANNOTATION.fullmatch(self.unit):
            raise ValueError(
                f"metric {self.name}: unit {self.unit!r} is not one of {sorted(UNITS)} "
                "or an annotation such as {ledger}"
            )
        return self


class MetricFamily(Record):
    """A family with its samples: (labels, value) pairs, every one with exactly the
    family's label names."""

    name: str
    unit: str
    description: str
    kind: Literal["gauge"] = "gauge"
    labels: tuple[str, ...] = ()
    samples: list[Sample] = []

    @model_validator(mode="after")
    def _one_label_set(self) -> MetricFamily:
        FamilySpec(name=self.name, unit=self.unit, description=self.description)
        for labels, _ in self.samples:
            if tuple(sorted(labels)) != tuple(sorted(self.labels)):
                raise ValueError(
                    f"metric {self.name}: a sample labelled {sorted(labels)} in a family "
                    f"labelled {list(self.labels)} (one label set per family)"
                )
        return self

    @classmethod
    def of(cls, spec: FamilySpec, samples: list[Sample]) -> MetricFamily:
        return cls(
            name=spec.name,
            unit=spec.unit,
            description=spec.description,
            labels=spec.labels,
            samples=samples,
        )


def _per_topic(
    name: str, unit: str, field: str, description: str, kip963: str | None = None
) -> tuple[FamilySpec, str]:
    spec = FamilySpec(
        name=name, unit=unit, description=description, labels=("topic",), kip963=kip963
    )
    return spec, field


#: per-topic families and the TopicObservation field each one exports
TOPIC_FAMILIES: tuple[tuple[FamilySpec, str], ...] = (
    _per_topic(
        "offloader.offload.lag.ledgers",
        "{ledger}",
        "offload_lag_ledgers",
        "Sealed ledgers with entries not yet offloaded (hot copy present).",
        "RemoteCopyLagSegments",
    ),
    _per_topic(
        "offloader.offload.lag.size",
        "By",
        "offload_lag_bytes",
        "Bytes of the sealed ledgers not yet offloaded.",
        "RemoteCopyLagBytes",
    ),
    _per_topic(
        "offloader.offload.lag",
        "s",
        "offload_lag_seconds",
        "Age since sealing of the oldest sealed ledger not yet offloaded.",
    ),
    _per_topic(
        "offloader.stream.lag.size",
        "By",
        "stream_lag_bytes",
        "Streaming topics: bytes of sealed ledgers not yet in committed segments.",
    ),
    _per_topic(
        "offloader.stream.lag",
        "s",
        "stream_lag_seconds",
        "Streaming topics: the older of the open segment's age and the oldest unsettled "
        "sealed ledger's age since sealing.",
    ),
    _per_topic(
        "offloader.hot_deletion.lag.ledgers",
        "{ledger}",
        "hot_deletion_lag_ledgers",
        "Offloaded ledgers whose hot copy outlived the topic's deletion lag.",
    ),
    _per_topic(
        "offloader.hot_deletion.lag.size",
        "By",
        "hot_deletion_lag_bytes",
        "Bytes of hot copies kept past the topic's deletion lag.",
    ),
    _per_topic(
        "offloader.hot_deletion.lag",
        "s",
        "hot_deletion_lag_seconds",
        "How long the oldest hot copy kept past its deletion lag is overdue.",
    ),
    _per_topic(
        "offloader.deletion.backlog.keys",
        "{key}",
        "deletion_backlog_keys",
        "Pending deletion-queue keys the topic owns.",
        "RemoteDeleteLagSegments",
    ),
    _per_topic(
        "offloader.deletion.backlog.age",
        "s",
        "deletion_backlog_seconds",
        "Age of the topic's oldest pending deletion-queue key.",
    ),
    _per_topic(
        "offloader.deletion.backlog.failing",
        "{key}",
        "deletion_failing_keys",
        "The topic's pending keys tried gc_failing_tries times or more.",
    ),
    _per_topic("offloader.hot.size", "By", "hot_bytes", "Bytes in the hot tier."),
    _per_topic("offloader.hot.ledgers", "{ledger}", "hot_ledgers", "Ledgers in the hot tier."),
    _per_topic(
        "offloader.tiered.size",
        "By",
        "tiered_bytes",
        "Bytes in the object store: offloaded ledgers' and segments' data objects.",
        "RemoteLogSizeBytes",
    ),
    _per_topic(
        "offloader.tiered.objects",
        "{object}",
        "tiered_objects",
        "Data and index objects of offloaded ledgers and offloaded segments.",
    ),
    _per_topic("offloader.tiered.segments", "{segment}", "tiered_segments", "Offloaded segments."),
    _per_topic("offloader.tiered.ledgers", "{ledger}", "tiered_ledgers", "Offloaded ledgers."),
)


def _queue_age(obs: Observations) -> list[Sample]:
    age = obs.deletion_backlog.oldest_age_ms
    return [] if age is None else [({}, age / 1000)]


def _global(
    name: str,
    unit: str,
    read: Callable[[Observations], list[Sample]],
    description: str,
    labels: tuple[str, ...] = (),
    kip963: str | None = None,
) -> tuple[FamilySpec, Callable[[Observations], list[Sample]]]:
    spec = FamilySpec(name=name, unit=unit, description=description, labels=labels, kip963=kip963)
    return spec, read


#: global families and how each is read off the observations
GLOBAL_FAMILIES: tuple[tuple[FamilySpec, Callable[[Observations], list[Sample]]], ...] = (
    _global(
        "offloader.deletion.queue.keys",
        "{key}",
        lambda obs: [({}, obs.deletion_backlog.pending)],
        "Pending deletion-queue keys, whoever owns them.",
    ),
    _global(
        "offloader.deletion.queue.due",
        "{key}",
        lambda obs: [({}, obs.deletion_backlog.due)],
        "Pending deletion-queue keys whose next try is due.",
    ),
    _global(
        "offloader.deletion.queue.failing",
        "{key}",
        lambda obs: [({}, obs.deletion_backlog.failing_count)],
        "Pending deletion-queue keys tried gc_failing_tries times or more.",
    ),
    _global(
        "offloader.deletion.queue.age",
        "s",
        _queue_age,
        "Age of the oldest pending deletion-queue key.",
    ),
    _global(
        "offloader.metadata.rows",
        "{row}",
        lambda obs: [({"table": t}, n) for t, n in sorted(obs.metadata_rows.items())],
        "Rows per metadata table.",
        labels=("table",),
        kip963="RemoteLogMetadataCount",
    ),
)

#: every family :func:`families` produces, in order (extra ones come after)
FAMILIES: tuple[FamilySpec, ...] = tuple(s for s, _ in TOPIC_FAMILIES + GLOBAL_FAMILIES)


def families(obs: Observations, extra: Iterable[MetricFamily] = ()) -> list[MetricFamily]:
    """The families of :data:`FAMILIES` with the samples of ``obs``, then ``extra``
    (other families, request accounting's say); a name given twice is refused."""
    result = [
        MetricFamily.of(
            spec,
            [
                ({"topic": t.topic}, float(value))
                for t in obs.topics
                if (value := getattr(t, field)) is not None
            ],
        )
        for spec, field in TOPIC_FAMILIES
    ]
    result += [MetricFamily.of(spec, read(obs)) for spec, read in GLOBAL_FAMILIES]
    result += list(extra)
    names = [f.name for f in result]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"metric families given twice: {', '.join(twice)}")
    return result

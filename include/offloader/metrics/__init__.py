"""Tier metrics from the metadata alone (docs/OPERATIONS.md, "Metrics").

``observe`` reads the figures (a few aggregate SQL statements, no object-store request),
``families`` turns them into metric families (OpenTelemetry names and units), and
``prometheus`` and ``otel`` export those: Prometheus text, OpenTelemetry gauges, OTLP.
"""

from offloader.metrics.families import FAMILIES, FamilySpec, MetricFamily, families
from offloader.metrics.observe import Observations, TopicObservation, Totals, observe
from offloader.metrics.prometheus import CONTENT_TYPE, prometheus_text

__all__ = [
    "CONTENT_TYPE",
    "FAMILIES",
    "FamilySpec",
    "MetricFamily",
    "Observations",
    "TopicObservation",
    "Totals",
    "families",
    "observe",
    "prometheus_text",
]

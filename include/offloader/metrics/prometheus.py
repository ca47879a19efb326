"""The families in Prometheus's text exposition format, written by prometheus_client (a
collector in a private registry), so the output is what Prometheus parses.

Names follow OpenTelemetry's Prometheus translation: dots become underscores, the unit
becomes a suffix (``By`` -> ``_bytes``, ``s`` -> ``_seconds``) unless the name already
ends with it, annotations in braces (``{ledger}``) are dropped. So
``offloader.offload.lag.size`` (By) is ``offloader_offload_lag_size_bytes`` and
``offloader.offload.lag`` (s) is ``offloader_offload_lag_seconds``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from offloader.metrics.families import MetricFamily

#: what the text is served as (the format prometheus_client writes by default)
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
#: UCUM unit -> Prometheus suffix (OpenTelemetry's table); annotations have none
UNIT_SUFFIXES = {"By": "bytes", "s": "seconds", "ms": "milliseconds", "1": "ratio"}


def prometheus_unit(unit: str) -> str:
    """The suffix of ``unit``; "" for an annotation such as ``{ledger}``."""
    if unit.startswith("{"):
        return ""
    return UNIT_SUFFIXES[unit]


def prometheus_name(name: str, unit: str) -> str:
    """``offloader.offload.lag`` + ``s`` -> ``offloader_offload_lag_seconds``."""
    base = name.replace(".", "_")
    suffix = prometheus_unit(unit)
    return base if not suffix or base.endswith(f"_{suffix}") else f"{base}_{suffix}"


class _Families(Collector):
    def __init__(self, fams: list[MetricFamily]) -> None:
        self.fams = fams

    def collect(self) -> Iterator[Metric]:
        for fam in self.fams:
            unit = prometheus_unit(fam.unit)
            gauge = GaugeMetricFamily(
                prometheus_name(fam.name, fam.unit),
                f"{fam.description} ({fam.name}, unit {fam.unit})",
                labels=fam.labels,
                unit=unit,
            )
            for labels, value in fam.samples:
                gauge.add_metric([labels[k] for k in fam.labels], value)
            yield gauge


def prometheus_text(fams: list[MetricFamily]) -> str:
    """The text exposition of ``fams``: HELP and TYPE lines, then the samples."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(fams))
    return generate_latest(registry).decode()

"""The families through OpenTelemetry's SDK (the one Airflow ships): observable gauges on
any meter provider (:func:`register`), or one collection pushed over OTLP/HTTP
(:func:`export_once`, ``offloader metrics --otlp``).

The endpoint is the setting ``otel_endpoint``, completed as Airflow completes its own
``[metrics] otel_host``/``otel_port``/``otel_ssl_active`` into
``http(s)://host:port/v1/metrics``; headers (``otel_headers``) are secret and never
logged; the resource says ``service.name=offloader``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, MeterProvider, ObservableGauge, Observation
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import SERVICE_NAME, Resource

from offloader.exceptions import MetricsExportError
from offloader.metrics.families import FAMILIES, FamilySpec, MetricFamily
from offloader.settings import Settings

SERVICE = "offloader"
_EXPORTER_LOG = "opentelemetry.exporter"

Collect = Callable[[], list[MetricFamily]]


class _Collection:
    """One call of ``collect`` per collection, however many instruments ask: a callback
    that finds its family served already starts the next collection."""

    def __init__(self, collect: Collect) -> None:
        self.collect = collect
        self.lock = threading.Lock()
        self.current: dict[str, MetricFamily] | None = None
        self.served: set[str] = set()

    def observe(self, name: str) -> list[Observation]:
        with self.lock:
            if self.current is None or name in self.served:
                # a new collection; should the read fail, the others get nothing this time
                self.current, self.served = {}, set()
                self.served.add(name)
                self.current = {f.name: f for f in self.collect()}
            self.served.add(name)
            fam = self.current.get(name)
        if fam is None:
            return []
        return [Observation(value, attributes=labels) for labels, value in fam.samples]


def register(
    meter_provider: MeterProvider,
    collect: Collect,
    specs: Iterable[FamilySpec] = FAMILIES,
) -> list[ObservableGauge]:
    """One observable gauge per family of ``specs`` on ``meter_provider``, observing what
    ``collect`` returns (attributes: the labels). ``collect`` runs once per collection."""
    meter = meter_provider.get_meter("offloader.metrics")
    collection = _Collection(collect)

    def callback(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda _options: collection.observe(name)

    return [
        meter.create_observable_gauge(
            spec.name, callbacks=[callback(spec.name)], unit=spec.unit, description=spec.description
        )
        for spec in specs
    ]


def export_once(settings: Settings, fams_source: Collect) -> int:
    """Push one collection of ``fams_source`` to ``settings.otel_endpoint`` over OTLP/HTTP;
    the number of data points sent. MetricsExportError when no endpoint is set or the
    export fails (naming the endpoint without any user or password, never a header)."""
    if settings.otel_endpoint is None:
        raise MetricsExportError(
            "no OTLP endpoint: set OFFLOADER_OTEL_ENDPOINT (e.g. http://127.0.0.1:4318, "
            "completed to /v1/metrics)"
        )
    endpoint = safe_endpoint(settings.otel_endpoint)
    fams = fams_source()
    specs = [
        FamilySpec(name=f.name, unit=f.unit, description=f.description, labels=f.labels)
        for f in fams
    ]
    reader = InMemoryMetricReader()
    provider = SdkMeterProvider(
        resource=Resource.create({SERVICE_NAME: SERVICE}), metric_readers=[reader]
    )
    try:
        register(provider, lambda: fams, specs)
        data = reader.get_metrics_data()
    finally:
        provider.shutdown()
    points = (
        0
        if data is None
        else sum(
            len(m.data.data_points)
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        )
    )
    if data is None or points == 0:
        return 0
    session = _RecordingSession()
    exporter = OTLPMetricExporter(
        endpoint=settings.otel_endpoint,
        headers=settings.otel_header_map(),
        timeout=settings.otel_timeout_seconds,
        session=session,
    )
    try:
        with _exporter_log() as messages:
            result = exporter.export(data, timeout_millis=settings.otel_timeout_seconds * 1000)
    finally:
        exporter.shutdown()
    if result is not MetricExportResult.SUCCESS:
        reasons = session.outcomes or messages or ["no reason given"]
        raise MetricsExportError(
            f"OTLP export to {endpoint} failed after {settings.otel_timeout_seconds:g} s "
            f"(OFFLOADER_OTEL_TIMEOUT_SECONDS): {'; '.join(dict.fromkeys(reasons))}"
        )
    return points


def safe_endpoint(url: str) -> str:
    """``url`` without a user or password part."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


class _RecordingSession(requests.Session):
    """The exporter's HTTP session, noting why each request failed: the exporter itself
    only logs that it gave up."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: list[str] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        try:
            response = super().send(request, **kwargs)
        except requests.RequestException as exc:
            self.outcomes.append(_root_cause(exc))
            raise
        if response.status_code >= 400:
            self.outcomes.append(f"HTTP {response.status_code} {response.reason}")
        return response


def _root_cause(exc: BaseException) -> str:
    """``ConnectionError: connection refused``: the operating system's reason under the
    layers requests and urllib3 wrap it in, else the exception's type."""
    pending: list[object] = [exc]
    seen: set[int] = set()
    while pending:
        item = pending.pop(0)
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError) and item.strerror:
            return f"{type(exc).__name__}: {item.strerror.lower()}"
        pending += [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args]
    return type(exc).__name__


@contextmanager
def _exporter_log() -> Iterator[list[str]]:
    """The exporter's warnings and errors (why an export failed), kept from the process's
    log: the caller puts them into its one error."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger(_EXPORTER_LOG)
    handler, propagate = Keep(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate

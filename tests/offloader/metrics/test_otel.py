"""OpenTelemetry: the gauges on an SDK meter provider observe exactly the families (read
with the SDK's InMemoryMetricReader); one push over OTLP/HTTP reaches a real receiver on
loopback with every point, the resource and the headers; a refused or failing endpoint,
and a missing one, are one clear error that carries no header value."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from fixtures import tier_scenario
from fixtures.airflow_server import free_port
from fixtures.otlp_receiver import OtlpReceiver, otlp_receiver  # noqa: F401 (a fixture)
from offloader.diagnostics import describe_error
from offloader.exceptions import MetricsExportError
from offloader.metrics.families import FAMILIES, MetricFamily, families
from offloader.metrics.observe import observe
from offloader.metrics.otel import export_once, register
from offloader.runtime import Runtime
from offloader.settings import Settings

SECRET = "k3y-never-shown"

Points = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scenario_families(rt: Runtime) -> list[MetricFamily]:
    tier_scenario.build(rt)
    return families(observe(rt.metadata, rt.settings))


def family_points(fams: list[MetricFamily]) -> Points:
    """OTel name -> {sorted labels: value}, for the families that have samples."""
    return {
        f.name: {tuple(sorted(labels.items())): value for labels, value in f.samples}
        for f in fams
        if f.samples
    }


def test_gauges_observe_the_families_once_per_collection(runtime: Runtime) -> None:
    fams = scenario_families(runtime)
    calls = []

    def collect() -> list[MetricFamily]:
        calls.append(1)
        return fams

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        gauges = register(provider, collect)
        assert len(gauges) == len(FAMILIES)
        data = reader.get_metrics_data()
        assert data is not None
        got: Points = {}
        units = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    units[metric.name] = metric.unit
                    got[metric.name] = {
                        tuple(sorted((k, str(v)) for k, v in p.attributes.items())): p.value
                        for p in metric.data.data_points
                    }
        assert {k: v for k, v in got.items() if v} == family_points(fams)
        assert all(units[f.name] == f.unit for f in fams if f.samples)
        assert len(calls) == 1
        reader.get_metrics_data()
        assert len(calls) == 2  # each collection reads the metadata once, not per gauge
    finally:
        provider.shutdown()


def test_a_failing_read_is_tried_once_per_collection() -> None:
    fams = [MetricFamily.of(FAMILIES[0], [({"topic": "t"}, 7)])]
    calls = []

    def collect() -> list[MetricFamily]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the database is away")
        return fams

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        register(provider, collect)  # every family of FAMILIES: many callbacks
        first = reader.get_metrics_data()  # the SDK logs the failed callback
        assert len(calls) == 1
        assert first is None or not any(
            m.data.data_points
            for rm in first.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        )
        second = reader.get_metrics_data()  # the next collection reads again
        assert second is not None and len(calls) == 2
        values = [
            p.value
            for rm in second.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            for p in m.data.data_points
        ]
        assert values == [7]
    finally:
        provider.shutdown()


def test_one_push_reaches_a_real_receiver(
    runtime: Runtime,
    otlp_receiver: OtlpReceiver,  # noqa: F811
) -> None:
    fams = scenario_families(runtime)
    settings = Settings.from_values(
        otel_endpoint=otlp_receiver.base_url,  # completed to /v1/metrics, as Airflow does
        otel_headers=f"x-api-key={SECRET}, x-tenant=tiers%2Cone",
        otel_timeout_seconds=5,
    )
    sent = export_once(settings, lambda: fams)
    assert sent == sum(len(f.samples) for f in fams) > 0
    [received] = otlp_receiver.received
    assert received.path == "/v1/metrics"
    assert received.headers["x-api-key"] == SECRET
    assert received.headers["x-tenant"] == "tiers,one"
    assert received.headers["content-type"] == "application/x-protobuf"
    assert otlp_receiver.points() == family_points(fams)
    assert otlp_receiver.resource_attributes()["service.name"] == "offloader"


def test_a_refused_endpoint_is_one_clear_error() -> None:
    port = free_port()  # nothing listens there
    settings = Settings.from_values(
        otel_endpoint=f"http://user:pw@127.0.0.1:{port}/v1/metrics",
        otel_headers=f"x-api-key={SECRET}",
        otel_timeout_seconds=1,
    )
    fams = [MetricFamily(name="offloader.x.y", unit="By", description="d", samples=[({}, 1)])]
    started = time.monotonic()
    with pytest.raises(MetricsExportError) as caught:
        export_once(settings, lambda: fams)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert f"OTLP export to http://127.0.0.1:{port}/v1/metrics failed" in message
    assert "connection refused" in message
    assert SECRET not in message and "pw" not in message.replace("/v1/", "")


def test_a_collector_that_refuses_the_request_is_named_by_its_status(
    otlp_receiver: OtlpReceiver,  # noqa: F811
) -> None:
    otlp_receiver.status = 401
    settings = Settings.from_values(
        otel_endpoint=otlp_receiver.base_url + "/custom/path", otel_timeout_seconds=2
    )
    fams = [MetricFamily(name="offloader.x.y", unit="s", description="d", samples=[({}, 2)])]
    with pytest.raises(MetricsExportError, match="HTTP 401 Unauthorized"):
        export_once(settings, lambda: fams)
    assert otlp_receiver.received[0].path == "/custom/path"  # a given path is kept


def test_no_endpoint_says_which_setting() -> None:
    with pytest.raises(MetricsExportError, match="OFFLOADER_OTEL_ENDPOINT"):
        export_once(Settings.from_values(), list)


@pytest.mark.parametrize(
    ("given", "endpoint"),
    [
        ("http://collector:4318", "http://collector:4318/v1/metrics"),
        ("https://collector:4318/", "https://collector:4318/v1/metrics"),
        ("http://collector:4318/otlp/v1/metrics", "http://collector:4318/otlp/v1/metrics"),
        ("  ", None),
    ],
)
def test_the_endpoint_is_completed_as_airflow_does(given: str, endpoint: str | None) -> None:
    assert Settings.from_values(otel_endpoint=given).otel_endpoint == endpoint


def test_bad_settings_are_refused_without_echoing_a_header() -> None:
    with pytest.raises(ValueError, match="must be an http:// or https:// URL"):
        Settings.from_values(otel_endpoint="collector:4318")
    with pytest.raises(ValueError, match="item 2 is not NAME=VALUE") as caught:
        Settings.from_values(otel_headers=f"a=b,{SECRET}")
    # what an operator sees (the CLI's one line): the rule, not the value
    line = describe_error(caught.value)
    assert line.startswith("invalid setting OFFLOADER_OTEL_HEADERS: item 2 is not NAME=VALUE")
    assert SECRET not in line
    settings = Settings.from_values(otel_headers=f"X-Api-Key={SECRET}")
    assert SECRET not in repr(settings) and settings.otel_header_map() == {"x-api-key": SECRET}

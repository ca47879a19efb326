"""The families and their Prometheus text, parsed back by prometheus_client's own parser:
every name, unit suffix, label and value equals the observations."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fixtures import tier_scenario
from offloader.metrics.families import (
    FAMILIES,
    GLOBAL_FAMILIES,
    TOPIC_FAMILIES,
    FamilySpec,
    MetricFamily,
    families,
)
from offloader.metrics.observe import Observations, observe
from offloader.metrics.prometheus import CONTENT_TYPE, prometheus_name, prometheus_text
from offloader.runtime import Runtime


def observed(rt: Runtime) -> Observations:
    tier_scenario.build(rt)
    settings = rt.settings.model_copy(update={"gc_failing_tries": tier_scenario.FAILING_TRIES})
    return observe(rt.metadata, settings)


def expected_samples(obs: Observations) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Prometheus name -> {labels: value}, straight from the observation records."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for spec, field in TOPIC_FAMILIES:
        samples[prometheus_name(spec.name, spec.unit)] = {
            (("topic", t.topic),): float(getattr(t, field))
            for t in obs.topics
            if getattr(t, field) is not None
        }
    backlog = obs.deletion_backlog
    age = backlog.oldest_age_ms
    samples["offloader_deletion_queue_keys"] = {(): backlog.pending}
    samples["offloader_deletion_queue_due"] = {(): backlog.due}
    samples["offloader_deletion_queue_failing"] = {(): backlog.failing_count}
    samples["offloader_deletion_queue_age_seconds"] = {} if age is None else {(): age / 1000}
    samples["offloader_metadata_rows"] = {
        (("table", table),): n for table, n in obs.metadata_rows.items()
    }
    return samples


def test_the_text_parses_back_to_the_observations(runtime: Runtime) -> None:
    obs = observed(runtime)
    fams = families(obs)
    text = prometheus_text(fams)
    parsed = {m.name: m for m in text_string_to_metric_families(text)}
    want = expected_samples(obs)
    assert set(parsed) == set(want)
    assert len(parsed) == len(FAMILIES) == len(TOPIC_FAMILIES) + len(GLOBAL_FAMILIES)
    for name, metric in parsed.items():
        assert metric.type == "gauge"
        got = {tuple(sorted(s.labels.items())): s.value for s in metric.samples}
        assert got == want[name], name
        assert all(s.name == name for s in metric.samples)
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            assert line.endswith(" gauge")
    helps = [line for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(FAMILIES)

    # names as OpenTelemetry's translation makes them; the offload lags named as such
    for name in (
        "offloader_offload_lag_ledgers",
        "offloader_offload_lag_size_bytes",
        "offloader_offload_lag_seconds",
        "offloader_tiered_size_bytes",
        "offloader_metadata_rows",
    ):
        assert name in parsed
    for spec in FAMILIES:
        name = prometheus_name(spec.name, spec.unit)
        assert name.endswith({"By": "_bytes", "s": "_seconds"}.get(spec.unit, ""))
        if "offload.lag" in spec.name:
            assert "offload" in name and "lag" in name
    assert "HELP offloader_offload_lag_size_bytes Bytes of the sealed ledgers" in text

    # an absent age has no sample: the kept topic has nothing waiting for offload
    lag_age = {s.labels["topic"] for s in parsed["offloader_offload_lag_seconds"].samples}
    assert "kept" not in lag_age and "orders" in lag_age
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_label_values_are_escaped(runtime: Runtime) -> None:
    from fixtures.backends import make_topic

    name = 'odd "topic"\\with\nnewline'
    make_topic(runtime, name)
    text = prometheus_text(families(observe(runtime.metadata, runtime.settings)))
    parsed = {m.name: m for m in text_string_to_metric_families(text)}
    [sample] = parsed["offloader_hot_ledgers"].samples
    assert sample.labels == {"topic": name} and sample.value == 0


def test_extra_families_come_after_and_names_are_unique(runtime: Runtime) -> None:
    obs = observe(runtime.metadata, runtime.settings)
    extra = MetricFamily(
        name="offloader.store.requests",
        unit="{request}",
        description="Requests by verb.",
        labels=("verb",),
        samples=[({"verb": "put"}, 3.0), ({"verb": "get"}, 5.0)],
    )
    fams = families(obs, [extra])
    assert fams[-1] == extra and len(fams) == len(FAMILIES) + 1
    parsed = {m.name: m for m in text_string_to_metric_families(prometheus_text(fams))}
    got = {s.labels["verb"]: s.value for s in parsed["offloader_store_requests"].samples}
    assert got == {"put": 3.0, "get": 5.0}
    with pytest.raises(ValueError, match=r"given twice: offloader\.store\.requests"):
        families(obs, [extra, extra])


def test_a_family_has_one_label_set_and_a_known_unit() -> None:
    with pytest.raises(ValueError, match="one label set per family"):
        MetricFamily(
            name="offloader.x.y",
            unit="By",
            description="d",
            labels=("topic",),
            samples=[({"topic": "a"}, 1.0), ({}, 2.0)],
        )
    with pytest.raises(ValueError, match="unit 'bytes' is not one of"):
        FamilySpec(name="offloader.x.y", unit="bytes", description="d")
    with pytest.raises(ValueError, match="dotted lower-case words"):
        FamilySpec(name="offloader_x", unit="By", description="d")


@pytest.mark.parametrize(
    ("name", "unit", "prometheus"),
    [
        ("offloader.offload.lag", "s", "offloader_offload_lag_seconds"),
        ("offloader.offload.lag.size", "By", "offloader_offload_lag_size_bytes"),
        ("offloader.offload.lag.ledgers", "{ledger}", "offloader_offload_lag_ledgers"),
        ("offloader.x.bytes", "By", "offloader_x_bytes"),  # the suffix is not doubled
        ("offloader.hot_deletion.lag", "s", "offloader_hot_deletion_lag_seconds"),
        ("offloader.x.ratio", "1", "offloader_x_ratio"),
    ],
)
def test_prometheus_names_follow_the_opentelemetry_translation(
    name: str, unit: str, prometheus: str
) -> None:
    assert prometheus_name(name, unit) == prometheus


@pytest.mark.source_tree
def test_operations_md_lists_every_family() -> None:
    """docs/OPERATIONS.md, "Metrics": a row per family with both names and the unit."""
    from pathlib import Path

    docs = (Path(__file__).parents[3] / "docs" / "OPERATIONS.md").read_text()
    section = docs.split("## Metrics\n", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(" `"): line for line in section.splitlines() if "| `" in line}
    for spec in FAMILIES:
        row = rows[spec.name]
        assert f"`{prometheus_name(spec.name, spec.unit)}`" in row and f"`{spec.unit}`" in row
        assert (spec.kip963 or "—") in row

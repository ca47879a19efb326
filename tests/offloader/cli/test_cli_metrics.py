"""``offloader metrics`` in a real process: Prometheus text, ``--json`` and ``--otlp`` equal
what the library observes in-process; failures are one line with exit status 2 and no
secret; a scrape opens neither the object store nor the hot tier."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from fixtures import tier_scenario
from fixtures.airflow_server import free_port
from fixtures.cli import assert_one_line_error, run_cli, upgraded_data_dir
from fixtures.otlp_receiver import OtlpReceiver, otlp_receiver  # noqa: F401 (a fixture)
from offloader.metrics.families import TOPIC_FAMILIES, families
from offloader.metrics.observe import AGES, observe
from offloader.metrics.prometheus import prometheus_name, prometheus_text
from offloader.runtime import Runtime

SECRET = "hdr-secret-never-shown"
#: Prometheus names of the ages: they grow between the in-process read and the child's
AGE_NAMES = {prometheus_name(s.name, s.unit) for s, f in TOPIC_FAMILIES if f in AGES}
AGE_NAMES.add("offloader_deletion_queue_age_seconds")


def parsed(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return {
        m.name: {tuple(sorted(s.labels.items())): s.value for s in m.samples}
        for m in text_string_to_metric_families(text)
    }


def test_text_and_json_equal_the_observations(runtime: Runtime) -> None:
    rt = runtime
    tier_scenario.build(rt)
    obs = observe(rt.metadata, rt.settings)
    want = parsed(prometheus_text(families(obs)))  # test_prometheus.py checks this text
    got = parsed(run_cli(rt.settings, "metrics").stdout)
    assert set(got) == set(want)
    for name, samples in got.items():
        if name in AGE_NAMES:  # read later: as old or older, for the same topics
            assert samples.keys() == want[name].keys(), name
            assert all(samples[k] >= want[name][k] for k in samples), name
        else:
            assert samples == want[name], name

    document = json.loads(run_cli(rt.settings, "metrics", "--json").stdout)
    assert [f["name"] for f in document["families"]] == [f.name for f in families(obs)]
    topics = {t["topic"]: t for t in document["observations"]["topics"]}
    for topic in obs.topics:
        figures = topic.model_dump(mode="json", exclude=set(AGES))
        assert {k: topics[topic.topic][k] for k in figures} == figures
    assert document["observations"]["metadata_rows"] == obs.metadata_rows
    assert document["observations"]["totals"]["topics"] == 3


def test_a_push_sends_every_point(runtime: Runtime, otlp_receiver: OtlpReceiver) -> None:  # noqa: F811
    rt = runtime
    tier_scenario.build(rt)
    env = {
        "OFFLOADER_OTEL_ENDPOINT": otlp_receiver.base_url,
        "OFFLOADER_OTEL_HEADERS": f"k={SECRET}",
    }
    done = run_cli(rt.settings, "metrics", "--otlp", env=env)
    [received] = otlp_receiver.received
    points = otlp_receiver.points()
    count = sum(len(p) for p in points.values())
    assert done.stdout.strip() == (
        f"pushed {len(points)} families, {count} points to {otlp_receiver.base_url}/v1/metrics"
    )
    assert received.headers["k"] == SECRET and SECRET not in done.stdout + done.stderr
    fams = {f.name: f for f in families(observe(rt.metadata, rt.settings))}
    assert set(points) == {name for name, f in fams.items() if f.samples}
    assert points["offloader.tiered.objects"] == {
        (("topic", labels["topic"]),): value
        for labels, value in fams["offloader.tiered.objects"].samples
    }

    sent = json.loads(run_cli(rt.settings, "metrics", "--otlp", "--json", env=env).stdout)
    assert sent == {
        "endpoint": f"{otlp_receiver.base_url}/v1/metrics",
        "families": len(points),
        "points": count,
    }
    assert len(otlp_receiver.received) == 2


def test_failures_are_one_line_without_secrets(tmp_path: Path) -> None:
    d = upgraded_data_dir(tmp_path / "data")
    done = run_cli(d, "metrics", "--otlp", ok=False)
    assert_one_line_error(done, "no OTLP endpoint", "OFFLOADER_OTEL_ENDPOINT")

    port = free_port()
    env = {
        "OFFLOADER_OTEL_ENDPOINT": f"http://127.0.0.1:{port}",
        "OFFLOADER_OTEL_HEADERS": f"authorization=Bearer {SECRET}",
        "OFFLOADER_OTEL_TIMEOUT_SECONDS": "1",
    }
    done = run_cli(d, "metrics", "--otlp", env=env, ok=False)
    assert_one_line_error(done, f"http://127.0.0.1:{port}/v1/metrics", "connection refused")
    assert SECRET not in done.stderr + done.stdout

    done = run_cli(d, "metrics", env={"OFFLOADER_OTEL_HEADERS": SECRET}, ok=False)
    assert_one_line_error(done, "OFFLOADER_OTEL_HEADERS", "item 1 is not NAME=VALUE")
    assert SECRET not in done.stderr

    done = run_cli(tmp_path / "never-upgraded", "metrics", ok=False)
    assert_one_line_error(done, "offloader db upgrade")


def test_a_scrape_opens_no_store_and_no_hot_tier(tmp_path: Path) -> None:
    d = upgraded_data_dir(tmp_path / "data")
    before = sorted(p.name for p in d.iterdir())
    text = run_cli(d, "metrics").stdout
    assert 'offloader_metadata_rows{table="topics"} 0.0' in text
    assert sorted(p.name for p in d.iterdir()) == before
    assert not (d / "ledgers").exists() and not (d / "objects").exists()

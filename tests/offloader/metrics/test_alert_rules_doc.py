"""The example Prometheus alerting rules in docs/OPERATIONS.md stay true: the YAML parses,
every metric an expression names is one the exporter emits, and there is one rule per
service level, on the metric of the figure that level bounds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from fixtures.observations import observations, topic_observation
from offloader.metrics.families import TOPIC_FAMILIES, families
from offloader.metrics.observe import TierFigures
from offloader.metrics.prometheus import prometheus_name, prometheus_text
from offloader.metrics.service_levels import LEVELS

OPERATIONS = Path(__file__).resolve().parents[3] / "docs" / "OPERATIONS.md"
SECTION = "## Service levels and alerts"
METRIC = re.compile(r"\boffloader_[a-z0-9_]+\b")


def alert_rules() -> list[dict[str, Any]]:
    """The rules of the one ```yaml block with ``groups:`` in the section."""
    text = OPERATIONS.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    [block] = [b for b in blocks if b.startswith("groups:")]
    doc = yaml.safe_load(block)
    return [rule for group in doc["groups"] for rule in group["rules"]]


def exported_names() -> set[str]:
    """Every metric name in the exporter's text for an observation where every figure,
    every age included, has a value."""
    figures = {name: 1.5 if name.endswith("_seconds") else 1 for name in TierFigures.model_fields}
    obs = observations(topic_observation(**figures))
    text = prometheus_text(families(obs))
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_metric_the_rules_name_is_exported() -> None:
    rules = alert_rules()
    named = {m for rule in rules for m in METRIC.findall(rule["expr"])}
    assert named, "no metric named in the rules"
    assert named <= exported_names(), named - exported_names()


def test_one_rule_per_service_level_on_the_metric_of_its_figure() -> None:
    metric_of = {field: prometheus_name(spec.name, spec.unit) for spec, field in TOPIC_FAMILIES}
    by_level = {rule["labels"]["level"]: rule for rule in alert_rules()}
    assert sorted(by_level) == sorted(level.policy_field for level in LEVELS)
    for level in LEVELS:
        expr = by_level[level.policy_field]["expr"]
        assert METRIC.findall(expr) == [metric_of[level.observed_field]], (level, expr)
        assert "by (topic)" in expr  # one alert per topic, named in the annotation
        assert "$labels.topic" in by_level[level.policy_field]["annotations"]["summary"]


def test_the_levels_table_names_each_level_figure_and_metric() -> None:
    metric_of = {field: prometheus_name(spec.name, spec.unit) for spec, field in TOPIC_FAMILIES}
    text = OPERATIONS.read_text()
    rows = re.findall(r"^\| `(max_[a-z_]+)` \| `([a-z_]+)` \| `([a-z_]+)` \|", text, re.M)
    assert {
        (lv.policy_field, lv.observed_field, metric_of[lv.observed_field]) for lv in LEVELS
    } == set(rows)

"""The service-level check on observations built by hand: each level met, breached, exactly
at its limit, and off (None); deleted topics and absent ages; the report's shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fixtures.observations import observations as observed
from fixtures.observations import topic_observation as topic
from offloader.metrics.observe import TopicObservation
from offloader.metrics.service_levels import LEVELS, check_service_levels
from offloader.policy import OffloadPolicy
from offloader.results import RunResult

MiB = 1024 * 1024

#: per level: the observed figure it bounds, a limit, a figure above it
CASES: dict[str, tuple[str, float, float]] = {
    "max_offload_lag_seconds": ("offload_lag_seconds", 3600, 7260),
    "max_offload_lag_bytes": ("offload_lag_bytes", 8 * MiB, 12 * MiB),
    "max_stream_lag_seconds": ("stream_lag_seconds", 900, 901.5),
    "max_hot_deletion_lag_seconds": ("hot_deletion_lag_seconds", 60, 120),
    "max_deletion_backlog_age_seconds": ("deletion_backlog_seconds", 3600, 3600.5),
    "max_deletion_failing_keys": ("deletion_failing_keys", 0, 3),
}


def policy(**levels: Any) -> OffloadPolicy:
    return OffloadPolicy(streaming=True, segment_max_age_seconds=0.5, **levels)


def test_every_level_is_one_policy_field_bounding_one_observed_figure() -> None:
    assert {lv.policy_field: lv.observed_field for lv in LEVELS} == {
        name: figure for name, (figure, _, _) in CASES.items()
    }
    assert {lv.policy_field for lv in LEVELS} == {
        f for f in OffloadPolicy.model_fields if f.startswith("max_") and f != "max_block_size"
    }
    assert all(lv.observed_field in TopicObservation.model_fields for lv in LEVELS)


@pytest.mark.parametrize("level", list(CASES))
def test_a_level_is_breached_above_its_limit_and_met_at_or_below_it(level: str) -> None:
    figure, limit, above = CASES[level]
    policies = {"orders": policy(**{level: limit})}

    breached = check_service_levels(observed(topic(**{figure: above})), policies)
    [breach] = breached.breaches
    assert (breach.topic, breach.level, breach.observed, breach.limit) == (
        "orders",
        level,
        above,
        limit,
    )
    assert breach.message.startswith("topic orders: ")
    assert f" exceeds {level} " in breach.message
    assert (breached.ok, breached.exit_status, breached.levels_checked) == (False, 1, 1)

    for figure_value in (limit, limit / 2):  # exactly at the limit meets it
        met = check_service_levels(observed(topic(**{figure: figure_value})), policies)
        assert (met.ok, met.exit_status, met.breaches, met.levels_checked) == (True, 0, [], 1)


@pytest.mark.parametrize("level", list(CASES))
def test_a_level_set_to_none_is_not_checked(level: str) -> None:
    figure, _, above = CASES[level]
    report = check_service_levels(observed(topic(**{figure: above})), {"orders": policy()})
    assert (report.ok, report.levels_checked, report.topics) == (True, 0, ["orders"])


@pytest.mark.parametrize(
    "level", [lv for lv, (figure, _, _) in CASES.items() if figure.endswith("_seconds")]
)
def test_an_absent_age_meets_its_level(level: str) -> None:
    """Nothing of its kind waits: no age, nothing to breach."""
    figure, limit, _ = CASES[level]
    report = check_service_levels(
        observed(topic(**{figure: None})), {"orders": policy(**{level: limit})}
    )
    assert report.ok and report.levels_checked == 1


def test_the_message_names_the_topic_the_level_and_what_lies_behind_it() -> None:
    lagging = topic(offload_lag_seconds=7260.0, offload_lag_ledgers=3, offload_lag_bytes=12 * MiB)
    report = check_service_levels(
        observed(lagging), {"orders": policy(max_offload_lag_seconds=3600)}
    )
    assert str(report) == (
        "topic orders: offload lag 7260 s exceeds max_offload_lag_seconds 3600 "
        "(3 ledgers, 12.0 MiB not offloaded)"
    )
    failing = topic(deletion_failing_keys=2, deletion_backlog_keys=9)
    [breach] = check_service_levels(
        observed(failing), {"orders": policy(max_deletion_failing_keys=1)}
    ).breaches
    assert breach.message.startswith(
        "topic orders: failing deletions 2 keys exceeds max_deletion_failing_keys 1 "
        "(of 9 keys queued"
    )


def test_deleted_topics_and_topics_without_a_policy_are_not_checked() -> None:
    lag = {"offload_lag_seconds": 99.0}
    obs = observed(
        topic("gone", state="deleted", **lag), topic("new", **lag), topic("orders", **lag)
    )
    levels = policy(max_offload_lag_seconds=10)
    report = check_service_levels(obs, {"gone": levels, "orders": levels})
    assert report.topics == ["orders"]
    assert [(b.topic, b.level) for b in report.breaches] == [("orders", "max_offload_lag_seconds")]


def test_every_breach_of_every_topic_is_listed_one_line_each() -> None:
    obs = observed(
        topic("a", offload_lag_seconds=50.0, deletion_failing_keys=1),
        topic("b", stream_lag_seconds=40.0),
        topic("c", offload_lag_seconds=5.0),
    )
    levels = policy(
        max_offload_lag_seconds=40, max_stream_lag_seconds=35, max_deletion_failing_keys=0
    )
    report = check_service_levels(obs, {"a": levels, "b": levels, "c": levels})
    assert [(b.topic, b.level) for b in report.breaches] == [
        ("a", "max_offload_lag_seconds"),
        ("a", "max_deletion_failing_keys"),
        ("b", "max_stream_lag_seconds"),
    ]
    assert report.levels_checked == 9
    assert str(report).splitlines() == [b.message for b in report.breaches]


def test_the_report_is_a_run_result() -> None:
    report = check_service_levels(
        observed(topic(offload_lag_seconds=2.0)), {"orders": policy(max_offload_lag_seconds=1.5)}
    )
    assert isinstance(report, RunResult)
    as_json = json.loads(json.dumps(report.to_json()))
    assert as_json == {
        "ok": False,
        "now_ms": 1_000,
        "topics": ["orders"],
        "levels_checked": 1,
        "breaches": [
            {
                "topic": "orders",
                "level": "max_offload_lag_seconds",
                "observed": 2.0,
                "limit": 1.5,
                "message": "topic orders: offload lag 2 s exceeds max_offload_lag_seconds 1.5 "
                "(0 ledgers, 0 bytes not offloaded)",
            }
        ],
    }
    met = check_service_levels(observed(topic()), {"orders": policy(max_offload_lag_seconds=1)})
    assert str(met) == "ok: 1 service level(s) met on 1 topic(s)"

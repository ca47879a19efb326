import json

import pytest
from pydantic import ValidationError

from offloader.policy import OffloadPolicy, ReadPriority, describe_validation_error


def test_defaults_follow_pulsar() -> None:
    policy = OffloadPolicy()
    assert policy.max_block_size == 64 * 1024 * 1024
    assert policy.read_buffer_size == 1024 * 1024
    assert policy.read_priority is ReadPriority.TIERED_FIRST
    assert policy.offload_threshold_bytes is None


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"offload_threshold_bytes": -1}, "offload_threshold_bytes", "greater than or equal"),
        ({"max_block_size": 1024}, "max_block_size", "greater than or equal"),
        ({"read_priority": "sideways"}, "read_priority", "tiered-first"),
        ({"read_buffer_size": 128 * 1024 * 1024}, "read_buffer_size", "must not exceed"),
        ({"deletion_lag_seconds": "soon"}, "deletion_lag_seconds", "valid number"),
    ],
)
def test_invalid_values_name_the_field_and_rule(changes, field, rule) -> None:
    with pytest.raises(ValidationError) as info:
        OffloadPolicy().updated(changes)
    message = describe_validation_error(info.value)
    assert field in message or field in str(info.value)
    assert rule in message


def test_unknown_field_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"unknown policy field.*colour"):
        OffloadPolicy().updated({"colour": "red"})


def test_updated_coerces_cli_strings_and_keeps_the_rest() -> None:
    policy = OffloadPolicy(deletion_lag_seconds=5).updated(
        {"offload_threshold_bytes": "1048576", "read_priority": "hot-first"}
    )
    assert policy.offload_threshold_bytes == 1048576
    assert policy.read_priority is ReadPriority.HOT_FIRST
    assert policy.deletion_lag_seconds == 5


LEVELS = (
    "max_offload_lag_seconds",
    "max_offload_lag_bytes",
    "max_stream_lag_seconds",
    "max_hot_deletion_lag_seconds",
    "max_deletion_backlog_age_seconds",
    "max_deletion_failing_keys",
)


def test_service_levels_are_off_by_default_and_a_stored_policy_without_them_loads() -> None:
    assert all(getattr(OffloadPolicy(), level) is None for level in LEVELS)
    stored = OffloadPolicy(deletion_lag_seconds=5).model_dump(mode="json")
    for level in LEVELS:
        del stored[level]  # a policy stored before the levels existed
    assert OffloadPolicy.model_validate_json(json.dumps(stored)) == OffloadPolicy(
        deletion_lag_seconds=5
    )


def test_service_levels_are_set_from_cli_strings_and_cleared_with_none() -> None:
    policy = OffloadPolicy().updated(
        {"max_offload_lag_seconds": "3600", "max_deletion_failing_keys": "0"}
    )
    assert (policy.max_offload_lag_seconds, policy.max_deletion_failing_keys) == (3600.0, 0)
    assert policy.updated({"max_offload_lag_seconds": None}).max_offload_lag_seconds is None


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"max_offload_lag_seconds": 0}, "greater than 0"),
        ({"max_stream_lag_seconds": -1}, "greater than 0"),
        ({"max_hot_deletion_lag_seconds": 0}, "greater than 0"),
        ({"max_deletion_backlog_age_seconds": "soon"}, "valid number"),
        ({"max_offload_lag_bytes": -1}, "greater than or equal to 0"),
        ({"max_deletion_failing_keys": 1.5}, "valid integer"),
        (
            {"offload_age_seconds": 3600, "max_offload_lag_seconds": 3600},
            "max_offload_lag_seconds (3600.0) must be above offload_age_seconds (3600.0)",
        ),
        (
            {"offload_threshold_bytes": 10, "max_offload_lag_bytes": 5},
            "max_offload_lag_bytes (5) must be above offload_threshold_bytes (10)",
        ),
        (
            {"streaming": True, "max_stream_lag_seconds": 600},
            "max_stream_lag_seconds (600.0) must be above segment_max_age_seconds (600.0)",
        ),
        (
            {"streaming": True, "max_offload_lag_seconds": 60},
            "max_offload_lag_seconds (60.0) must be above segment_max_age_seconds (600.0)",
        ),
    ],
)
def test_invalid_service_levels_are_named(changes, rule) -> None:
    with pytest.raises(ValidationError) as info:
        OffloadPolicy().updated(changes)
    assert rule in describe_validation_error(info.value)


def test_a_stream_level_waits_for_streaming_and_then_must_clear_the_segment_age() -> None:
    """Off a streaming topic the stream level checks nothing, so the segment age does not
    bound it; turning streaming on validates the pair."""
    quiet = OffloadPolicy(max_stream_lag_seconds=60)
    with pytest.raises(ValidationError, match="must be above segment_max_age_seconds"):
        quiet.updated({"streaming": True})
    assert quiet.updated({"streaming": True, "segment_max_age_seconds": 30}).streaming

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

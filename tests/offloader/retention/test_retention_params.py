"""A retention run's params (the `retention` DAG's form and its tasks' model), without the
metadata: empty fields, the position's form, the rules between fields, the form's bounds."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from offloader.params import RunParamsError
from offloader.retention.params import RetentionParams


def test_empty_form_fields_mean_not_given() -> None:
    request = RetentionParams(
        topic=" ", cut_id="", position="", retention_time_seconds="", retention_size_bytes=""
    )
    assert (request.topic, request.cut_id, request.position) == (None, None, None)
    assert (request.mode, request.overrides) == ("policy", {})


def test_a_position_is_kept_in_its_canonical_form() -> None:
    request = RetentionParams(topic="orders", position=" 3:07 ")
    assert (request.position, request.mode) == ("3:7", "trim")
    assert RetentionParams(topic="orders", cut_id=0).mode == "trim"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"topic": "t", "cut_id": 1, "position": "1:0"}, "give a cut_id or a position, not both"),
        ({"cut_id": 1}, "a trim at a cut or a position needs a topic"),
        ({"position": "1:0"}, "a trim at a cut or a position needs a topic"),
        ({"retention_size_bytes": 5}, "a retention override for one run needs a topic"),
        ({"retention_time_seconds": 5}, "a retention override for one run needs a topic"),
        (
            {"topic": "t", "cut_id": 1, "retention_size_bytes": 5},
            "a trim at a cut or position takes no retention override",
        ),
        ({"position": "1-0", "topic": "t"}, "position '1-0': expected LEDGER:ENTRY"),
        ({"cut_id": -1, "topic": "t"}, "greater than or equal to 0"),
        ({"retention_size_bytes": -1, "topic": "t"}, "greater than or equal to 0"),
        ({"topic": "t", "surprise": 1}, "Extra inputs are not permitted"),
    ],
)
def test_requests_that_cannot_be_run_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RetentionParams(**fields)


def test_overrides_name_only_what_was_given() -> None:
    request = RetentionParams(topic="t", retention_size_bytes=0)
    assert request.overrides == {"retention_size_bytes": 0}
    both = RetentionParams(topic="t", retention_size_bytes=9, retention_time_seconds=1.5)
    assert both.overrides == {"retention_time_seconds": 1.5, "retention_size_bytes": 9}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"position": "3 : 7", "topic": "t"}, "position: '3 : 7' does not match"),
        ({"cut_id": "3", "topic": "t"}, "cut_id: '3' is not of type 'null', 'integer'"),
        ({"topic": "t" * 513}, "topic: '" + "t" * 513 + "' is too long"),
        ({"retention_time_seconds": -0.5, "topic": "t"}, "less than the minimum of 0"),
    ],
)
def test_parse_refuses_what_the_form_refuses(values: dict[str, object], message: str) -> None:
    """The operators parse with the form's schema: every bound the form shows holds there."""
    with pytest.raises(RunParamsError, match=re.escape(message)):
        RetentionParams.parse(values)

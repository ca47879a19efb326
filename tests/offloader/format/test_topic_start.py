"""A topic's recorded start (docs/FORMAT.md, "Topic starts"): the bytes round-trip, and
anything else is refused with a line naming what is wrong."""

from __future__ import annotations

import json

import pytest

from offloader.format.topic_start import RecordedStart, decode_start, encode_start


def test_a_record_round_trips_as_sorted_json() -> None:
    start = RecordedStart("päyments/eu", 150, 2, 1_700_000_000_000)
    data = encode_start(start)
    assert json.loads(data) == {
        "entry_id": 2,
        "format": "offloader-topic-start",
        "format_version": 1,
        "ledger_id": 150,
        "recorded_ms": 1_700_000_000_000,
        "topic": "päyments/eu",
    }
    assert list(json.loads(data)) == sorted(json.loads(data))
    assert decode_start(data) == start and start.position == (150, 2)


GOOD = {
    "format": "offloader-topic-start",
    "format_version": 1,
    "topic": "t",
    "ledger_id": 1,
    "entry_id": 0,
    "recorded_ms": 5,
}


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"{", "not a topic start record: "),
        (b"[]", "not a topic start record (format is not 'offloader-topic-start')"),
        (json.dumps({**GOOD, "format": "x"}).encode(), "format is not"),
        (json.dumps({**GOOD, "format_version": 2}).encode(), "unknown version 2"),
        (json.dumps({**GOOD, "ledger_id": -1}).encode(), "the numbers integers >= 0"),
        (json.dumps({**GOOD, "entry_id": True}).encode(), "the numbers integers >= 0"),
        (json.dumps({**GOOD, "topic": 3}).encode(), "topic must be text"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "recorded_ms"}).encode(), ">= 0"),
    ],
)
def test_anything_else_is_refused(data: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        decode_start(data)

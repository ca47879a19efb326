"""The summary an offload run returns: counts by outcome, bytes moved, throughput.

Results arrive as OffloadResult objects or, through XCom, as plain dicts; both count.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from offloader.offload.ledger_offloader import OffloadResult, Outcome
from offloader.offload.runs import summarize

RESULTS = [
    OffloadResult("a", 1, Outcome.OFFLOADED, "x", 1_000_000, 0.25),
    OffloadResult("a", 2, Outcome.OFFLOADED, "y", 234_567, 0.5),
    OffloadResult("a", 3, Outcome.RECOVERED, "z", 0, 0.0),
    OffloadResult("a", 4, Outcome.ALREADY_OFFLOADED, None, 999, 7.0),
]


def test_the_summary_is_the_same_for_results_and_their_xcom_dicts() -> None:
    expected = {
        "ledgers": 4,
        "offloaded": 3,
        "outcomes": {"offloaded": 2, "recovered": 1, "already-offloaded": 1},
        "bytes": 1_234_567,
        "seconds": 1.0,
        "mb_per_second": 1.23,
    }
    assert summarize(RESULTS, seconds=1.0) == expected
    assert summarize([asdict(r) for r in RESULTS], seconds=1.0) == expected


def test_without_a_wall_time_the_upload_seconds_of_moved_ledgers_count() -> None:
    summary = summarize(RESULTS)
    assert summary["seconds"] == 0.75  # 0.25 + 0.5; the already-offloaded 7 s do not count
    assert summary["mb_per_second"] == round(1.234567 / 0.75, 2)


@pytest.mark.parametrize(
    ("seconds", "shown", "rate"),
    [(1.23456, 1.235, 1.0), (0.5, 0.5, 2.47), (0.0, 0.0, None)],
)
def test_seconds_and_rate_are_rounded_and_a_zero_time_has_no_rate(
    seconds: float, shown: float, rate: float | None
) -> None:
    summary = summarize(RESULTS[:2], seconds=seconds)
    assert summary["seconds"] == shown
    assert summary["mb_per_second"] == rate


def test_the_rate_is_in_megabytes_of_a_million_bytes() -> None:
    moved = [OffloadResult("a", 1, Outcome.OFFLOADED, "x", 100 * 10**9, 1.0)]
    assert summarize(moved, seconds=1.0)["mb_per_second"] == 100_000.0
    assert summarize(moved, seconds=1000.0)["mb_per_second"] == 100.0


def test_an_empty_run_moves_nothing() -> None:
    assert summarize([]) == {
        "ledgers": 0,
        "offloaded": 0,
        "outcomes": {},
        "bytes": 0,
        "seconds": 0,
        "mb_per_second": None,
    }

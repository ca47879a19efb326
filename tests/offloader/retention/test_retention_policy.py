"""Retention policy fields, PIP-17 validation and the pure cut selection (PDP-19)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from offloader.policy import OffloadPolicy, describe_validation_error
from offloader.retention.policy import (
    RetentionBounds,
    choose_cut,
    in_list,
    lowest_upper_bound,
    newest_by_time,
    retention_bounds,
)


@dataclass(frozen=True)
class Cut:
    """A cut as the rules see it: position, time taken, bytes before it."""

    ledger_id: int
    entry_id: int
    created_ms: int
    offset_bytes: int


# A topic of four ledgers of 100, 150, 150 and 600 bytes; a cut at each ledger boundary,
# taken 1 s apart, and the end of the topic (1000 bytes) at 5 s.
CUTS = [
    Cut(1, 0, 1000, 0),
    Cut(2, 0, 2000, 100),
    Cut(3, 0, 3000, 250),
    Cut(4, 0, 4000, 400),
]
END = Cut(5, 0, 5000, 1000)
ALL = [*CUTS, END]


def policy(**fields: object) -> OffloadPolicy:
    return OffloadPolicy(**fields)  # type: ignore[arg-type]


def choose(now_ms: int = 5000, **fields: object) -> Cut | None:
    return choose_cut(retention_bounds(policy(**fields), now_ms, END.offset_bytes), in_list(ALL))


# --- size: PDP-19's lowest upper bound ------------------------------------------------------
@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, END),  # keep nothing: truncate at the end
        (1, CUTS[3]),  # 600 kept is the least that is >= 1
        (600, CUTS[3]),  # exactly 600 kept
        (601, CUTS[2]),  # 600 is too little: the next cut down keeps 750
        (750, CUTS[2]),
        (751, CUTS[1]),
        (900, CUTS[1]),
        (901, CUTS[0]),
        (1000, CUTS[0]),  # everything kept: truncating at the first cut removes nothing
        (1001, None),  # no cut keeps that much: nothing is trimmed
        (10**12, None),
    ],
)
def test_size_rule_picks_the_lowest_upper_bound(size: int, expected: Cut | None) -> None:
    assert choose(retention_size_bytes=size) == expected


@pytest.mark.parametrize("size", range(0, 1002))
def test_size_rule_keeps_the_least_that_is_enough(size: int) -> None:
    """Every S: the chosen cut keeps >= S, and no other cut keeps less while still >= S."""
    chosen = choose(retention_size_bytes=size)
    enough = [c for c in ALL if END.offset_bytes - c.offset_bytes >= size]
    if not enough:
        assert chosen is None
        return
    assert chosen is not None
    kept = END.offset_bytes - chosen.offset_bytes
    assert kept >= size
    assert all(END.offset_bytes - c.offset_bytes >= kept for c in enough)


def test_cuts_at_the_same_offset_pick_the_latest_position() -> None:
    """An empty ledger between two cuts leaves them at the same offset: same bytes kept,
    the later position trims the empty ledger too."""
    same = [Cut(1, 0, 1000, 0), Cut(2, 0, 2000, 100), Cut(3, 0, 2500, 100)]
    assert lowest_upper_bound(same, 100) == same[2]
    assert lowest_upper_bound(same, 99) == same[0]
    assert lowest_upper_bound([], 100) is None


# --- time: the newest cut older than T -------------------------------------------------------
@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, END),  # keep nothing: the newest cut at or before now
        (0.5, CUTS[3]),
        (1, CUTS[3]),  # taken exactly T ago: what it removes is T old (inclusive)
        (1.001, CUTS[2]),
        (2, CUTS[2]),
        (3.5, CUTS[0]),
        (4, CUTS[0]),
        (4.001, None),  # no cut is that old: nothing is trimmed
        (86400, None),
    ],
)
def test_time_rule_picks_the_newest_cut_older_than_t(seconds: float, expected) -> None:
    assert choose(retention_time_seconds=seconds) == expected


def test_time_rule_on_an_unsorted_list() -> None:
    shuffled = [CUTS[2], END, CUTS[0], CUTS[3], CUTS[1]]
    assert newest_by_time(shuffled, 3999) == CUTS[2]
    assert newest_by_time(shuffled, 999) is None


# --- both: the stricter (the one that keeps more) wins ---------------------------------------
@pytest.mark.parametrize(
    ("seconds", "size", "expected"),
    [
        (1, 750, CUTS[2]),  # time -> cut 4 (keeps 600), size -> cut 3 (750): size wins
        (3, 100, CUTS[1]),  # time -> cut 2 (keeps 900), size -> cut 4 (600): time wins
        (2, 750, CUTS[2]),  # both pick cut 3
        (10, 0, None),  # time finds no cut: nothing is trimmed whatever size says
        (0, 5000, None),  # size finds no cut: nothing is trimmed whatever time says
    ],
)
def test_both_rules_the_stricter_wins(seconds: float, size: int, expected) -> None:
    chosen = choose(retention_time_seconds=seconds, retention_size_bytes=size)
    assert chosen == expected
    for alone in (
        choose(retention_time_seconds=seconds),
        choose(retention_size_bytes=size),
    ):
        # truncating at the stricter cut satisfies each rule: it keeps at least as much
        if chosen is not None:
            assert alone is not None
            assert chosen.offset_bytes <= alone.offset_bytes


@pytest.mark.parametrize(
    ("seconds", "size"),
    list(itertools.product([0, 0.5, 1, 2, 3, 4, 5], [0, 1, 300, 600, 999, 1001])),
)
def test_both_rules_keep_what_each_asks_for(seconds: float, size: int) -> None:
    chosen = choose(retention_time_seconds=seconds, retention_size_bytes=size)
    if chosen is None:
        return
    assert END.offset_bytes - chosen.offset_bytes >= size
    assert chosen.created_ms <= END.created_ms - seconds * 1000  # all removed is >= T old


def test_no_rule_trims_nothing() -> None:
    bounds = retention_bounds(policy(), 5000, 1000)
    assert bounds == RetentionBounds(created_at_most_ms=None, offset_at_most=None)
    assert not bounds.active
    assert choose_cut(bounds, in_list(ALL)) is None


def test_bounds_are_computed_from_the_database_time_and_the_end() -> None:
    bounds = retention_bounds(
        policy(retention_time_seconds=1.5, retention_size_bytes=300), 10_000, 1000
    )
    assert bounds == RetentionBounds(created_at_most_ms=8500, offset_at_most=700)
    assert bounds.active


# --- the policy fields and PIP-17 ------------------------------------------------------------
def test_retention_defaults_keep_forever() -> None:
    assert OffloadPolicy().retention_time_seconds is None
    assert OffloadPolicy().retention_size_bytes is None


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        (
            {"offload_threshold_bytes": 1000, "retention_size_bytes": 1000},
            "offload_threshold_bytes (1000) must be below retention_size_bytes (1000)",
        ),
        (
            {"offload_threshold_bytes": 2000, "retention_size_bytes": 1000},
            "offload_threshold_bytes (2000) must be below retention_size_bytes (1000)",
        ),
        (
            {"offload_age_seconds": 60, "retention_time_seconds": 30},
            "offload_age_seconds (60.0) must be below retention_time_seconds (30.0)",
        ),
        ({"retention_size_bytes": -1}, "retention_size_bytes: Input should be greater"),
        ({"retention_time_seconds": -5}, "retention_time_seconds: Input should be greater"),
    ],
)
def test_policies_breaking_pip17_are_refused(fields: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        OffloadPolicy(**fields)
    message = describe_validation_error(info.value)
    assert fragment in message
    if "below" in fragment:
        assert "PIP-17" in message


@pytest.mark.parametrize(
    "fields",
    [
        {"offload_threshold_bytes": 999, "retention_size_bytes": 1000},
        {"offload_age_seconds": 29.9, "retention_time_seconds": 30},
        {"offload_threshold_bytes": 10**9, "retention_time_seconds": 30},  # different rules
        {"retention_size_bytes": 0, "retention_time_seconds": 0},
    ],
)
def test_policies_keeping_offload_below_retention_are_accepted(fields: dict) -> None:
    made = OffloadPolicy(**fields)
    for name, value in fields.items():
        assert getattr(made, name) == value


def test_updated_checks_the_whole_policy() -> None:
    """Raising the offload threshold past an existing retention size is refused too."""
    current = OffloadPolicy().updated({"retention_size_bytes": "1000"})
    assert current.retention_size_bytes == 1000
    with pytest.raises(ValidationError, match="PIP-17"):
        current.updated({"offload_threshold_bytes": "5000"})
    assert current.updated({"retention_size_bytes": None}).retention_size_bytes is None


@pytest.mark.parametrize(
    ("seconds", "ms"),
    [
        (0.0004, 1),  # a fraction of a millisecond keeps a whole one more, not less
        (0.0010000001, 1),  # below a nanosecond is float noise: 1 ms, not 2
    ],
)
def test_the_time_bound_is_in_whole_milliseconds_rounded_up(seconds: float, ms: int) -> None:
    bounds = retention_bounds(policy(retention_time_seconds=seconds), 10_000, 1000)
    assert bounds.created_at_most_ms == 10_000 - ms

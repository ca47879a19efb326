"""Which ledgers are due for offload: candidates, the explicit prefix, the size and age rules.

The planner is a pure function of the ledger records, the policy and the time, so these
tests hand it records directly; every boundary of a rule is checked from both sides.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from fixtures.metadata import ledger_record as ledger
from offloader.metadata import HotState, Ledger, LedgerState, OffloadState
from offloader.offload.planner import CreationWindow, due_ledgers, is_retirable_empty
from offloader.policy import OffloadPolicy

NOW_MS = 1_000_000_000


def ids(ledgers: list[Ledger]) -> list[int]:
    return [x.ledger_id for x in ledgers]


NO_RULES = OffloadPolicy()


def test_up_to_takes_every_candidate_up_to_and_including_the_id_whatever_the_policy() -> None:
    ledgers = [ledger(3), ledger(1), ledger(4), ledger(2)]
    assert ids(due_ledgers(ledgers, NO_RULES, NOW_MS, up_to=3)) == [1, 2, 3]
    assert ids(due_ledgers(ledgers, NO_RULES, NOW_MS, up_to=0)) == []


def test_sealed_empty_ledgers_are_due_in_id_order_to_be_retired() -> None:
    empty = ledger(2, entry_count=0, size_bytes=0)
    ledgers = [ledger(3), empty, ledger(1)]
    assert ids(due_ledgers(ledgers, NO_RULES, NOW_MS, up_to=3)) == [1, 2, 3]
    assert ids(due_ledgers(ledgers, NO_RULES, NOW_MS)) == [2]  # no rule needed


def test_up_to_ignores_the_rules_that_would_say_no() -> None:
    policy = OffloadPolicy(offload_threshold_bytes=10**9, offload_age_seconds=10**6)
    assert ids(due_ledgers([ledger(1), ledger(2)], policy, NOW_MS, up_to=2)) == [1, 2]


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (dict(state=LedgerState.OPEN, sealed_ms=None), "open"),
        (dict(entry_count=0, size_bytes=0, hot_state=HotState.DELETED), "empty, retired"),
        (dict(offload_state=OffloadState.OFFLOADED), "offloaded"),
        (dict(hot_state=HotState.DELETING), "hot copy being deleted"),
        (dict(hot_state=HotState.DELETED), "hot copy deleted"),
    ],
)
def test_only_sealed_non_empty_hot_ledgers_not_yet_offloaded_are_candidates(
    fields: dict[str, object], why: str
) -> None:
    ledgers = [ledger(1), ledger(2, **fields), ledger(3)]
    assert ids(due_ledgers(ledgers, NO_RULES, NOW_MS, up_to=3)) == [1, 3], why
    by_age = OffloadPolicy(offload_age_seconds=0)
    assert ids(due_ledgers(ledgers, by_age, NOW_MS)) == [1, 3], why


def test_a_one_entry_ledger_and_an_attempt_in_flight_are_candidates() -> None:
    ledgers = [ledger(1, entry_count=1), ledger(2, offload_state=OffloadState.OFFLOADING)]
    assert ids(due_ledgers(ledgers, NO_RULES, NOW_MS, up_to=2)) == [1, 2]


def test_no_rule_no_prefix_nothing_is_due() -> None:
    assert due_ledgers([ledger(1), ledger(2)], NO_RULES, NOW_MS) == []


def test_size_rule_moves_the_oldest_until_at_most_the_threshold_stays_hot() -> None:
    ledgers = [ledger(4, 100), ledger(2, 100), ledger(3, 100), ledger(1, 100)]
    # 400 hot: 250 allowed -> the two oldest go (400 -> 300 -> 200)
    policy = OffloadPolicy(offload_threshold_bytes=250)
    assert ids(due_ledgers(ledgers, policy, NOW_MS)) == [1, 2]


def test_size_rule_stops_when_exactly_the_threshold_stays_hot() -> None:
    ledgers = [ledger(1, 100), ledger(2, 100), ledger(3, 100)]
    assert ids(due_ledgers(ledgers, OffloadPolicy(offload_threshold_bytes=200), NOW_MS)) == [1]
    assert due_ledgers(ledgers, OffloadPolicy(offload_threshold_bytes=300), NOW_MS) == []
    assert ids(due_ledgers(ledgers, OffloadPolicy(offload_threshold_bytes=0), NOW_MS)) == [
        1,
        2,
        3,
    ]


def test_size_rule_counts_the_open_ledger_but_cannot_move_it() -> None:
    ledgers = [ledger(1, 100), ledger(2, 300, state=LedgerState.OPEN, sealed_ms=None)]
    # 400 hot, 150 allowed: ledger 1 goes, the open ledger stays although still above
    policy = OffloadPolicy(offload_threshold_bytes=150)
    assert ids(due_ledgers(ledgers, policy, NOW_MS)) == [1]


def test_size_rule_does_not_count_bytes_that_are_no_longer_only_hot() -> None:
    already = ledger(1, 1000, offload_state=OffloadState.OFFLOADED)  # hot copy awaits the lag
    gone = ledger(2, 1000, hot_state=HotState.DELETED)
    ledgers = [already, gone, ledger(3, 100), ledger(4, 100)]
    # only 200 bytes count: at a threshold of 200 nothing is due, at 150 ledger 3 is
    assert due_ledgers(ledgers, OffloadPolicy(offload_threshold_bytes=200), NOW_MS) == []
    assert ids(due_ledgers(ledgers, OffloadPolicy(offload_threshold_bytes=150), NOW_MS)) == [3]


def test_age_rule_takes_ledgers_sealed_at_least_the_age_ago() -> None:
    policy = OffloadPolicy(offload_age_seconds=1.5)
    cutoff = NOW_MS - 1500
    ledgers = [
        ledger(1, sealed_ms=cutoff - 1),
        ledger(2, sealed_ms=cutoff),
        ledger(3, sealed_ms=cutoff + 1),
        ledger(4, sealed_ms=NOW_MS),
    ]
    assert ids(due_ledgers(ledgers, policy, NOW_MS)) == [1, 2]


def test_age_rule_skips_a_sealed_ledger_without_a_seal_time() -> None:
    policy = OffloadPolicy(offload_age_seconds=0)
    assert ids(due_ledgers([ledger(1, sealed_ms=None), ledger(2)], policy, NOW_MS)) == [2]


def test_either_rule_makes_a_ledger_due_oldest_first() -> None:
    ledgers = [
        ledger(1, 100, sealed_ms=NOW_MS),  # size rule only
        ledger(2, 100, sealed_ms=NOW_MS),
        ledger(3, 100, sealed_ms=0),  # age rule only
        ledger(4, 100, sealed_ms=NOW_MS),
    ]
    policy = OffloadPolicy(offload_threshold_bytes=300, offload_age_seconds=60)
    assert ids(due_ledgers(ledgers, policy, NOW_MS)) == [1, 3]


@pytest.mark.parametrize(
    ("fields", "retirable"),
    [
        (dict(), True),
        (dict(hot_state=HotState.DELETING), True),  # a retirement a crash interrupted
        (dict(hot_state=HotState.DELETED), False),  # retired already
        (dict(state=LedgerState.OPEN, sealed_ms=None), False),  # the writer's current one
        (dict(offload_state=OffloadState.OFFLOADING, attempt_id="a"), False),
        (dict(attempt_id="a"), False),
        (dict(offload_state=OffloadState.OFFLOADED), False),
    ],
    ids=["sealed", "deleting", "deleted", "open", "offloading", "attempt", "offloaded"],
)
def test_which_empty_ledgers_are_retired(fields: dict[str, object], retirable: bool) -> None:
    empty = ledger(2, entry_count=0, size_bytes=0, **fields)
    assert is_retirable_empty(empty) is retirable
    expected = [1, 2] if retirable else [1]
    assert ids(due_ledgers([ledger(1), empty], NO_RULES, NOW_MS, up_to=2)) == expected
    assert ids(due_ledgers([empty], NO_RULES, NOW_MS)) == expected[1:]


DAY_MS = 86_400_000
WINDOW = CreationWindow(10 * DAY_MS, 11 * DAY_MS)


def test_a_window_takes_the_candidates_created_inside_it_whatever_the_policy() -> None:
    policy = OffloadPolicy(offload_threshold_bytes=10**9, offload_age_seconds=10**6)
    ledgers = [
        ledger(1, created_ms=WINDOW.start_ms - 1),
        ledger(2, created_ms=WINDOW.start_ms),  # the start is inside
        ledger(3, created_ms=WINDOW.end_ms - 1),
        ledger(4, created_ms=WINDOW.end_ms),  # the end is not
        ledger(5, entry_count=0, size_bytes=0, created_ms=WINDOW.start_ms + 1),  # retired
    ]
    assert ids(due_ledgers(ledgers, policy, NOW_MS, window=WINDOW)) == [2, 3, 5]
    assert ids(due_ledgers(ledgers, NO_RULES, NOW_MS, window=WINDOW)) == [2, 3, 5]
    # with a prefix too, a ledger must pass both
    assert ids(due_ledgers(ledgers, NO_RULES, NOW_MS, up_to=2, window=WINDOW)) == [2]


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (dict(state=LedgerState.OPEN, sealed_ms=None), "open"),
        (dict(offload_state=OffloadState.OFFLOADED), "offloaded"),
        (dict(hot_state=HotState.DELETING), "hot copy being deleted"),
        (dict(hot_state=HotState.DELETED), "hot copy deleted"),
        (dict(entry_count=0, size_bytes=0, hot_state=HotState.DELETED), "empty, retired"),
    ],
)
def test_a_window_refuses_what_the_planner_always_refuses(
    fields: dict[str, object], why: str
) -> None:
    inside = WINDOW.start_ms + 5
    ledgers = [ledger(1, created_ms=inside), ledger(2, created_ms=inside, **fields)]
    assert ids(due_ledgers(ledgers, NO_RULES, NOW_MS, window=WINDOW)) == [1], why


def test_a_window_is_built_from_timezone_aware_datetimes_to_the_millisecond() -> None:
    utc = CreationWindow.between(datetime(2026, 3, 1, tzinfo=UTC), datetime(2026, 3, 2, tzinfo=UTC))
    assert utc == CreationWindow(1_772_323_200_000, 1_772_409_600_000)
    plus_two = timezone(timedelta(hours=2))
    same = CreationWindow.between(
        datetime(2026, 3, 1, 2, tzinfo=plus_two), datetime(2026, 3, 2, 2, tzinfo=plus_two)
    )
    assert same == utc  # the same instants, written in another zone
    odd = CreationWindow.between(
        datetime(2026, 3, 1, 0, 0, 0, 1999, tzinfo=UTC),
        datetime(2026, 3, 1, 0, 0, 1, tzinfo=UTC),
    )
    assert odd == CreationWindow(1_772_323_200_001, 1_772_323_201_000)  # floored, not rounded
    before_epoch_ms = datetime(1969, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
    with pytest.raises(ValueError, match="start_ms must be epoch milliseconds >= 0, got -1"):
        CreationWindow.between(before_epoch_ms, datetime(1970, 1, 2, tzinfo=UTC))


def test_a_window_from_airflow_pendulum_datetimes() -> None:
    """Airflow hands a run's data interval over as pendulum DateTimes."""
    import pendulum

    window = CreationWindow.between(
        pendulum.datetime(2026, 3, 1, 1, tz="Europe/Paris"),
        pendulum.datetime(2026, 3, 2, tz="UTC"),
    )
    assert window == CreationWindow(1_772_323_200_000, 1_772_409_600_000)


def test_the_epoch_itself_may_start_a_window() -> None:
    assert CreationWindow(0, 1).contains(ledger(1, created_ms=0))


@pytest.mark.parametrize(
    ("start", "end", "error", "message"),
    [
        (
            5,
            5,
            ValueError,
            r"^the creation window \[5, 5\) is empty: its start must be before its end "
            r"\(a zero-length data interval selects nothing\)$",
        ),
        (6, 5, ValueError, "is empty"),
        (-1, 5, ValueError, "start_ms must be epoch milliseconds"),
        (True, 5, ValueError, "start_ms"),
        (0, "9", ValueError, "end_ms"),
    ],
)
def test_a_bad_window_is_refused_naming_what_is_wrong(
    start: object, end: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        CreationWindow(start, end)  # type: ignore[arg-type]


def test_a_window_from_naive_or_non_datetimes_is_refused() -> None:
    aware = datetime(2026, 3, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="window end 2026-03-02T00:00:00 has no timezone"):
        CreationWindow.between(aware, datetime(2026, 3, 2))
    with pytest.raises(TypeError, match="window start must be a datetime"):
        CreationWindow.between("2026-03-01", aware)  # type: ignore[arg-type]

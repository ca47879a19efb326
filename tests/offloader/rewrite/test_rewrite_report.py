"""The rewrite report's text as the CLI and the task log print it (docs/OPERATIONS.md), for
the cases test_rewrite_parts.py leaves out: a dry run's group lines, groups of more than
two ledgers, a detail, no group at all, several recovered rewrites, totals over groups of
mixed outcomes; and the --ledgers range of the CLI at its lower bound."""

from __future__ import annotations

import pytest

from offloader.exceptions import RewriteFailedError
from offloader.metadata import Position
from offloader.params import parse_ledger_range
from offloader.rewrite.plan import LEDGER, SEGMENT, RewriteGroup, Source
from offloader.rewrite.report import (
    CHANGED,
    FAILED,
    PLANNED,
    REWRITTEN,
    GroupResult,
    RewriteReport,
)


def _group(*ledger_ids: int) -> RewriteGroup:
    """A group of one 100-byte v1 object per ledger."""
    return RewriteGroup(
        "orders",
        LEDGER,
        tuple(Source(Position(ledger_id=i, entry_id=0), 100, ledger_ids=(i,)) for i in ledger_ids),
    )


def test_a_dry_run_names_each_group_it_would_rewrite_by_its_first_and_last_ledger() -> None:
    """Three ledgers: the line names the first and the last, not the second."""
    dry = RewriteReport("compact", True, [GroupResult.of(_group(5, 6, 9), PLANNED)])
    assert str(dry).splitlines() == [
        "orders: 3 ledger object(s) of ledgers 5..9 (6 objects, 300 bytes): would be rewritten",
        "compact: would rewrite 1 group(s): objects 6 -> 2, bytes 300",
    ]


def test_a_group_line_says_why_it_was_not_rewritten() -> None:
    """The detail (the error, or why a source moved) follows the outcome; a group without
    ledgers (nothing left to name) still gets its line."""
    changed = GroupResult.of(_group(1, 2), CHANGED, detail="source 2 moved")
    assert str(changed).endswith(": changed (source 2 moved)")
    plain = GroupResult.of(_group(1, 2), CHANGED)
    assert str(plain).endswith(": changed")
    empty = GroupResult("orders", SEGMENT, [], 1, 2, 10, CHANGED)
    assert str(empty) == "orders: 1 segment object(s) of ledgers - (2 objects, 10 bytes): changed"


def test_an_empty_run_says_so_and_lists_every_recovered_rewrite() -> None:
    report = RewriteReport("to-v2", False, recovered=["seg-a", "seg-b"])
    assert str(report).splitlines() == [
        "(nothing to rewrite)",
        "to-v2: rewrote 0 group(s): objects 0 -> 0, bytes 0 -> 0",
        "dead rewrites recovered: seg-a, seg-b",
    ]


def test_the_failure_names_the_first_failed_group_s_whole_ledger_range() -> None:
    report = RewriteReport(
        "compact",
        False,
        [
            GroupResult.of(_group(1, 2), CHANGED),
            GroupResult.of(_group(3, 4, 8), FAILED, detail="OSError: disk"),
            GroupResult.of(_group(10, 11), FAILED, detail="OSError: again"),
        ],
    )
    with pytest.raises(RewriteFailedError) as caught:
        report.raise_for_failure()
    assert str(caught.value) == (
        "2 rewrite group(s) failed; the first, of orders ledgers 3..8: OSError: disk"
    )


def test_the_totals_add_up_what_each_rewritten_group_reports() -> None:
    """After a run the objects written are each group's own count (2, a dry run's estimate
    per group, is not assumed); groups changed or failed count for nothing."""
    report = RewriteReport(
        "compact",
        False,
        [
            GroupResult.of(
                _group(1, 2), REWRITTEN, segment_id="a", objects_after=3, bytes_after=150
            ),
            GroupResult.of(_group(3), REWRITTEN, segment_id="b", objects_after=2, bytes_after=90),
            GroupResult.of(_group(4, 5), CHANGED, detail="source 4 moved"),
            GroupResult.of(_group(6), FAILED, detail="OSError: disk"),
        ],
    )
    assert report.totals() == {
        "groups": 2,
        "objects_before": 6,
        "objects_after": 5,
        "bytes_before": 300,
        "bytes_after": 240,
    }


def test_a_ledger_range_may_start_and_end_at_ledger_0() -> None:
    """Ledger ids start at 0: ``0:0`` is the first ledger alone, not an error."""
    assert parse_ledger_range("0:0") == (0, 0)
    assert parse_ledger_range("0:7") == (0, 7)
    for bad in ("0:-1", "1:2:3", ":"):
        with pytest.raises(ValueError, match=rf"ledgers '{bad}': expected FIRST:LAST"):
            parse_ledger_range(bad)

"""The concurrency case's judge of CLI failures: only the fencing the design intends
passes as fencing; any other error line (or no error line) is a failure to report."""

from __future__ import annotations

import pytest

from fixtures.concurrency import fenced_line_kind


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (
            "error: topic 'streamed': a streaming pass (cli:h:1, epoch 3) holds the stream "
            "until 1765000000000 ms (database clock); this pass does nothing",
            "busy",
        ),
        ("error: topic 'streamed': another pass claimed the stream at the same time", "busy"),
        (
            "error: topic 'streamed': this pass (epoch 2) lost the stream to cli:h:2 (epoch 3); "
            "it commits nothing more",
            "fenced",
        ),
        ("error: topic ledgers changed since version 4: someone else moved", "lost-cas"),
        ("error: could not trim topic 'ledgers': too much contention", "lost-cas"),
        ("error: ledger ledgers/3 is deleting: trimmed", "lost-cas"),
        ("error: attempt 1f (epoch 2) no longer owns ledger ledgers/3", "lost-cas"),
    ],
)
def test_intended_fencing_is_named(line: str, kind: str) -> None:
    assert fenced_line_kind(line) == kind


@pytest.mark.parametrize(
    "line",
    [
        "error: unexpected KeyError: 'x' (run with --debug for the traceback)",
        "error: topic 'ledgers' ledger 3 object k offset 0: bad CRC",
        "Traceback (most recent call last):",  # not the one-line contract: never fencing
        "",
    ],
)
def test_anything_else_is_not_fencing(line: str) -> None:
    assert fenced_line_kind(line) is None

"""The rewrite's smaller parts in process: the params' form schema (what the bulk_rewrite
DAG's form is made of), the part size, the lease keeper, the v1 re-encoding when the
topic's block size shrank since the offload, the report's text and error."""

from __future__ import annotations

import logging
import time
from unittest import mock

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.inspect import checksum
from fixtures.rewrites import T, check_one_copy, rewrite
from offloader.exceptions import CommitFailedError, RewriteFailedError
from offloader.metadata import OffloadMode, Position, Segment
from offloader.objectstore import Capabilities
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.params import form_schema
from offloader.rewrite.encode import part_size
from offloader.rewrite.lease import RewriteLease
from offloader.rewrite.params import RewriteParams
from offloader.rewrite.plan import LEDGER, RewriteGroup, Source
from offloader.rewrite.report import FAILED, PLANNED, REWRITTEN, GroupResult, RewriteReport
from offloader.runtime import Runtime

KiB = 1024


def test_the_form_schema_has_every_field_with_its_default_and_the_modes() -> None:
    schema = form_schema(RewriteParams)
    assert list(schema) == [
        "mode",
        "topics",
        "first_ledger",
        "last_ledger",
        "target_bytes",
        "small_bytes",
        "max_groups",
        "dry_run",
    ]
    assert schema["mode"]["enum"] == ["compact", "to-v2", "to-v1"]
    assert schema["mode"]["default"] == "compact"
    assert schema["small_bytes"]["type"] == ["null", "integer"]
    assert schema["target_bytes"]["default"] == 128 * 1024 * 1024
    defaults = {name: field["default"] for name, field in schema.items()}
    assert RewriteParams.parse(defaults) == RewriteParams()


class _Store:
    def __init__(self, min_part: int, max_parts: int) -> None:
        self.capabilities = Capabilities(
            multipart=True,
            conditional_create=True,
            ranged_read=True,
            part_copy=False,
            min_part_size=min_part,
            max_part_size=5 * 1024 * 1024 * 1024,
            max_parts=max_parts,
            max_delete_batch=1000,
        )


def test_parts_are_the_topic_s_part_size_at_least_the_store_s_and_fit_its_count() -> None:
    mib = 1024 * 1024
    s3 = _Store(5 * mib, 10_000)
    assert part_size(s3, 128 * mib, 8 * mib) == 8 * mib  # type: ignore[arg-type]
    assert part_size(s3, 128 * mib, 1) == 5 * mib  # type: ignore[arg-type]
    assert part_size(_Store(1, 10_000), 50_000, 1) == 10  # type: ignore[arg-type]
    assert part_size(_Store(1, 100), 1000, 1) == 20  # type: ignore[arg-type]  # twice the room


def _leased_segment(rt: Runtime) -> Segment:
    """Rewrite segment ``r`` begun over one offloaded ledger, with a 1 s lease."""
    make_topic(rt, T)
    (ledger_id,) = produce_ledgers(rt, T, [(5, 100)])
    LedgerOffloader(rt).offload_topic(T, up_to=ledger_id)
    ledger = rt.metadata.get_ledger(T, ledger_id)
    return rt.metadata.rewrites.begin(
        T,
        segment_id="r",
        data_key="r",
        index_key="r-index",
        store_id=rt.stores.default_id(),
        owner="t",
        lease_ms=1000,
        ledgers=[ledger],
    )


def test_the_lease_keeper_renews_and_reports_a_lost_segment(runtime: Runtime) -> None:
    rt = runtime
    segment = _leased_segment(rt)
    with pytest.raises(ValueError, match="lease_seconds must be positive"):
        RewriteLease(rt.metadata, segment, 0)
    with RewriteLease(rt.metadata, segment, 1.0) as lease:
        time.sleep(2.5)  # more than two lease lengths: only the renewals keep it
        lease.check()
        assert rt.metadata.rewrites.recover_stale() == []
        rt.metadata.rewrites.fail(segment, "taken away")
        deadline = time.monotonic() + 10
        while True:
            try:
                lease.check()
            except CommitFailedError as err:
                assert "rewrite segment r lost its lease" in str(err)
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_renewal_that_finds_the_segment_lost_stops_the_renewals(runtime: Runtime) -> None:
    segment = _leased_segment(runtime)
    lease = RewriteLease(runtime.metadata, segment, 1.0)  # not entered: renewals by hand
    assert lease._renew_once() is True
    lease.check()
    runtime.metadata.rewrites.fail(segment, "taken away")
    assert lease._renew_once() is False  # nothing left to renew: the thread ends
    with pytest.raises(CommitFailedError, match="rewrite segment r lost its lease"):
        lease.check()


def test_a_renewal_that_raises_is_logged_and_retried(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A database hiccup is not a lost lease: a warning with the error, and the next
    renewal tries again."""
    segment = _leased_segment(runtime)
    hiccup = ConnectionError("the database went away")
    metadata = mock.Mock()
    metadata.rewrites.renew.side_effect = hiccup
    lease = RewriteLease(metadata, segment, 1.0)
    with caplog.at_level(logging.WARNING, logger="offloader.rewrite.lease"):
        assert lease._renew_once() is True
    lease.check()  # not lost
    metadata.rewrites.renew.assert_called_once_with(segment, 1000)
    (record,) = [r for r in caplog.records if r.name == "offloader.rewrite.lease"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "renewing the lease of r failed"
    assert record.exc_info is not None and record.exc_info[1] is hiccup


def test_entries_of_blocks_bigger_than_the_policy_s_now_are_still_rewritten(
    runtime: Runtime,
) -> None:
    """The topic's max_block_size shrank below the blocks (and entries) its ledgers were
    offloaded with: a v2 block as big as the largest v1 one still takes every entry."""
    rt = runtime
    make_topic(rt, T, read_buffer_size=16 * KiB)
    ids = produce_ledgers(rt, T, [(4, 200 * KiB)] * 2, seed=3)
    LedgerOffloader(rt).offload_topic(T, up_to=ids[-1])
    delete_hot_copies(rt.metadata, rt.hot, T)
    before = checksum(rt, T)
    topic = rt.metadata.get_topic(T)
    rt.metadata.set_policy(topic, topic.policy.updated({"max_block_size": 64 * KiB}))
    report = rewrite(rt, target_bytes=10 * 1024 * 1024, small_bytes=10 * 1024 * 1024)
    assert [g.outcome for g in report.groups] == [REWRITTEN]
    assert {x.offload_mode for x in rt.metadata.list_ledgers(T)} == {OffloadMode.STREAM}
    check_one_copy(rt)
    assert checksum(rt, T) == before


def test_the_report_reads_as_one_line_a_group_and_fails_naming_the_first_failure() -> None:
    group = RewriteGroup(
        "orders",
        LEDGER,
        tuple(Source(_pos(i), 100, ledger_ids=(i,)) for i in (3, 4)),
    )
    done = GroupResult.of(group, REWRITTEN, segment_id="s", objects_after=2, bytes_after=190)
    report = RewriteReport("compact", False, [done], left=2, recovered=["dead"])
    assert str(report).splitlines() == [
        "orders: 2 ledger object(s) of ledgers 3..4 (4 objects, 200 bytes) -> segment s "
        "(2 objects, 190 bytes): rewritten",
        "compact: rewrote 1 group(s): objects 4 -> 2, bytes 200 -> 190",
        "2 more group(s) left for the next run (max_groups)",
        "dead rewrites recovered: dead",
    ]
    report.raise_for_failure()  # nothing failed
    report.groups.append(GroupResult.of(group, FAILED, detail="OSError: disk"))
    with pytest.raises(
        RewriteFailedError,
        match=r"1 rewrite group\(s\) failed; the first, "
        r"of orders ledgers 3..4: OSError: disk",
    ) as caught:
        report.raise_for_failure()
    assert caught.value.report is report
    dry = RewriteReport("to-v2", True, [GroupResult.of(group, PLANNED)])
    assert str(dry).splitlines()[-1] == (
        "to-v2: would rewrite 1 group(s): objects 4 -> 2, bytes 200"
    )
    assert dry.to_json()["totals"] == {
        "groups": 1,
        "objects_before": 4,
        "objects_after": 2,
        "bytes_before": 200,
        "bytes_after": 0,
    }


def _pos(ledger_id: int) -> Position:
    return Position(ledger_id=ledger_id, entry_id=0)

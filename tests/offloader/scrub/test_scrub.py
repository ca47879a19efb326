"""Scrub on both backends: a clean store reports nothing with exact counts; every kind of
planted damage is reported with its ledger, object, offset and reason, and a scrub without
repair changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.damage import overwrite_object
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.pulsar_v1 import pulsar_write_blocks, pulsar_write_index
from fixtures.scrub import DAMAGES, expected_counts, index_of, offloaded_topic, store_as_pulsar
from offloader.exceptions import NotFoundError, ScrubFailedError
from offloader.format import decode_index
from offloader.metadata import Ledger
from offloader.runtime import Runtime
from offloader.scrub import (
    Action,
    Counts,
    FindingKind,
    plan_scrub,
    run_scrub,
    scrub_ledger,
)


def state(rt: Runtime) -> tuple[object, ...]:
    """Everything a scrub without repair must leave as it was."""
    ledgers = [rt.metadata.list_ledgers(t.name) for t in rt.metadata.list_topics()]
    objects = {info.key: rt.objects.get(info.key) for info in rt.objects.list()}
    return ledgers, list_attempts(rt.metadata), pending_deletions(rt.metadata), objects


def test_a_clean_store_reports_nothing_with_exact_counts(runtime: Runtime, tmp_path: Path) -> None:
    ledgers = offloaded_topic(runtime)
    assert len(index_of(runtime, ledgers[0]).blocks) == 2
    audit = offloaded_topic(runtime, "audit", [(50, 1000)])
    before = state(runtime)
    (tmp_path / "r").mkdir()
    report = run_scrub(runtime, report_path=tmp_path / "r" / "report.json")
    assert report.counts == expected_counts(runtime, ledgers + audit)
    assert report.counts.entries == 90 + 400 + 300 + 50 and report.counts.blocks == 5
    assert report.damaged == [] and report.findings == [] and not report.failed
    report.raise_for_failure()
    assert state(runtime) == before
    written = json.loads((tmp_path / "r" / "report.json").read_text())
    assert written["format"] == "offloader-scrub-report" and written["format_version"] == 1
    assert written["counts"] == {
        "ledgers": 4,
        "objects": 8,
        "blocks": 5,
        "bytes": report.counts.bytes,
        "entries": 840,
    }
    assert (written["failed"], written["damaged_ledgers"], written["topics"]) == (False, [], None)
    only = run_scrub(runtime, ["audit"])
    assert only.counts == expected_counts(runtime, audit) and only.topics == ["audit"]


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_planted_damage_is_reported_and_nothing_changes(runtime: Runtime, kind: str) -> None:
    ledgers = offloaded_topic(runtime)
    victim = ledgers[0]
    planted = DAMAGES[kind](runtime, victim)
    before = state(runtime)
    report = run_scrub(runtime, repair=False)
    assert state(runtime) == before  # no repair: nothing changed
    (verdict,) = report.damaged
    assert (verdict.topic, verdict.ledger_id) == ("orders", victim.ledger_id)
    assert verdict.offload_uuid == victim.offload_attempt_id
    assert verdict.action is Action.NOT_REPAIRED and report.failed
    first = verdict.findings[0]
    assert (first.topic, first.ledger_id, first.key, first.offset, first.kind) == (
        "orders",
        victim.ledger_id,
        planted.key,
        planted.offset,
        planted.kind,
    )
    assert planted.reason in first.reason
    assert {f.ledger_id for f in report.findings} == {victim.ledger_id}
    # the other ledgers were read whole and are clean
    assert report.counts.entries >= sum(x.entry_count for x in ledgers[1:])
    with pytest.raises(ScrubFailedError, match=rf"1 damaged ledger.*orders/{victim.ledger_id}"):
        report.raise_for_failure()


def test_an_index_that_disagrees_is_reported_everywhere_it_disagrees(runtime: Runtime) -> None:
    victim = offloaded_topic(runtime)[1]
    DAMAGES["index-missing-the-last-entry"](runtime, victim)
    (verdict,) = run_scrub(runtime, repair=False).damaged
    kinds = {f.kind for f in verdict.findings}
    reasons = " | ".join(f.reason for f in verdict.findings)
    assert kinds == {FindingKind.METADATA_MISMATCH}, reasons
    assert "payload bytes, the metadata store" in reasons or victim.size_bytes == 0
    assert "the metadata store recorded" in reasons  # the data object's length
    assert f"holds {victim.entry_count - 1} entries, the metadata store says" in reasons


def as_pulsar_objects(rt: Runtime, ledger: Ledger) -> list[tuple[int, bytes]]:
    """Replace an offloaded ledger's objects by the reference Pulsar writer's (64 KiB
    blocks, foreign metadata: no CRCs, no entry count); the metadata store records the new
    length as it would have at commit. The blocks."""
    entries = list(rt.hot.read(ledger.topic, ledger.ledger_id))
    blocks = pulsar_write_blocks(entries, 64 * 1024)
    store_as_pulsar(rt, ledger, blocks, bytes.fromhex("0801100218c8012203666f6f"))
    return blocks


def test_pulsar_objects_are_checked_as_far_as_v1_allows(runtime: Runtime) -> None:
    victim = offloaded_topic(runtime)[1]
    blocks = as_pulsar_objects(runtime, victim)
    assert len(blocks) >= 4
    (target,) = [t for t in plan_scrub(runtime.metadata) if t.ledger_id == victim.ledger_id]
    clean = scrub_ledger(runtime.objects, target)
    assert clean.findings == ()
    assert (clean.blocks, clean.entries) == (len(blocks), victim.entry_count)
    # an index whose second block offset moved: the blocks no longer start where it says
    assert victim.index_key is not None
    raw = runtime.objects.get(victim.index_key)
    moved = decode_index(raw).blocks[1].offset + 12
    entry_at = 32 + 12 + 20 + 12  # head, 12 metadata bytes, entry 0, then entry 1's offset
    edited = raw[:entry_at] + moved.to_bytes(8, "big") + raw[entry_at + 8 :]
    overwrite_object(runtime.objects, victim.index_key, lambda _: edited)
    report = run_scrub(runtime, repair=False)
    (verdict,) = report.damaged
    at_moved = [f for f in verdict.findings if f.offset == moved]
    assert at_moved and "bad block magic" in at_moved[0].reason, verdict.findings
    assert {f.kind for f in verdict.findings} == {FindingKind.DAMAGED_BLOCK}
    # and the first block, longer by 12 bytes, no longer ends where its header says
    (first,) = [f for f in verdict.findings if f.offset == moved - 12]
    assert "block length mismatch: header says block_len 65536, got 65548" in first.reason


def test_a_lost_last_entry_in_a_pulsar_object_disagrees_with_the_metadata_store(
    runtime: Runtime,
) -> None:
    """A foreign index does not say how many entries the last block holds: the scan stops
    at the padding, and the count is held against the metadata store's."""
    victim = offloaded_topic(runtime)[2]
    entries = list(runtime.hot.read(victim.topic, victim.ledger_id))[:-1]
    blocks = pulsar_write_blocks(entries, 64 * 1024)
    data = b"".join(raw for _, raw in blocks)
    assert victim.data_key is not None and victim.index_key is not None
    overwrite_object(runtime.objects, victim.data_key, lambda _: data)
    index = pulsar_write_index(blocks, b"\x08\x01")
    overwrite_object(runtime.objects, victim.index_key, lambda _: index)
    report = run_scrub(runtime, ["orders"], repair=False)
    (verdict,) = report.damaged
    reasons = [f.reason for f in verdict.findings]
    assert (
        f"data object holds {len(entries)} entries, the metadata store says {len(entries) + 1}"
        in reasons
    )


def test_unknown_and_deleted_topics_are_refused_before_anything_is_read(runtime: Runtime) -> None:
    offloaded_topic(runtime, "audit", [(5, 100)])
    with pytest.raises(NotFoundError, match="nope"):
        run_scrub(runtime, ["audit", "nope"])
    from offloader.retention.trim import delete_topic

    delete_topic(runtime, "audit")
    with pytest.raises(ValueError, match="topic 'audit' was deleted"):
        run_scrub(runtime, ["audit"])
    assert run_scrub(runtime).counts == Counts()  # a deleted topic is not scrubbed

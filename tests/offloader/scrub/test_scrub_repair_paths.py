"""What a repair from the hot copy reports, word for word, for a damaged ledger and for each
ledger of a damaged streaming segment: repaired (the new attempt and its bytes), no hot
copy (deleted as recorded, or gone from disk behind the metadata's back), the new upload
failing, the new objects damaged too; a segment's ledger already on objects of its own or
still being streamed; a row that names no object store. The operator acts on these words
(the report's JSON, its summary, the run's error), so they are compared whole."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import pytest

from fixtures.damage import flip, overwrite_object
from fixtures.faults import ServerErrors, with_objects
from fixtures.scrub import DAMAGES, expected_counts, offloaded_topic
from fixtures.streamed import (
    flip_a_payload_byte,
    ledgers_by_segment,
    shared_segment,
    streamed_open_ledger,
    streamed_topic,
)
from fixtures.takeover import OnPut
from offloader.format import decode_segment_index
from offloader.metadata import Ledger, OffloadMode, Segment, schema
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.runtime import Runtime
from offloader.scrub import (
    Action,
    Finding,
    FindingKind,
    LedgerVerdict,
    plan_scrub,
    run_scrub,
    scrub_targets,
)
from offloader.scrub.report import LedgerRepair
from offloader.scrub.spread import scrub_partition

T = "events"
SMALL = [(40, 2000), (30, 2000)]  # single-block ledgers: the index is the last put
NO_STORE = (
    "names no object store (written before revision 0002 and not upgraded): run "
    "`offloader db upgrade`"
)
PUT_FAILED = (
    "S3 put failed: An error occurred (InternalError) when calling the put operation "
    "(reached max retries: 9): We encountered an internal error."
)


def _keep(rt: Runtime, topic: str, ledger_id: int) -> None:
    """The hot copy stays: the repair can read it."""


def _hot_copy_deleted(rt: Runtime, topic: str, ledger_id: int) -> None:
    """Hot deletion ran for the ledger: the metadata says so."""
    ledger = rt.metadata.mark_hot_deleting(rt.metadata.get_ledger(topic, ledger_id))
    rt.hot.delete(topic, ledger_id)
    rt.metadata.mark_hot_deleted(ledger)


def _hot_file_lost(rt: Runtime, topic: str, ledger_id: int) -> None:
    """The hot copy is gone from disk while the metadata still says present."""
    rt.hot.delete(topic, ledger_id)


def _as_is(rt: Runtime) -> Runtime:
    return rt


def _puts_fail(rt: Runtime) -> Runtime:
    """Every PUT of the repair's upload answers a 500 (the index is always a PUT)."""
    return with_objects(rt, ServerErrors(rt.objects, ["put"]))


def _indexes_damaged_once_written(rt: Runtime) -> Runtime:
    """A bad writer: each new index object gets a byte flipped right after its PUT."""

    def damage(key: str) -> None:
        if key.endswith("-index"):
            size = rt.objects.stat(key).size
            overwrite_object(rt.objects, key, flip(size - 20))

    return with_objects(rt, OnPut(rt.objects, after=damage))


def _offloaded_again(rt: Runtime, topic: str, ledger_id: int) -> Ledger:
    """The ledger as the repair left it: on v1 objects of its own."""
    ledger = rt.metadata.get_ledger(topic, ledger_id)
    assert (
        ledger.offload_mode is OffloadMode.LEDGER and ledger.offload_attempt_id and ledger.data_key
    )
    return ledger


def _repaired(rt: Runtime, topic: str, ledger_id: int, damaged: str) -> LedgerRepair:
    new = _offloaded_again(rt, topic, ledger_id)
    size = rt.objects.stat(new.data_key or "").size
    detail = (
        f"offloaded again from the hot copy as attempt {new.offload_attempt_id} ({size} bytes); "
        "the damaged objects are queued for deletion"
    )
    return LedgerRepair(ledger_id, Action.REPAIRED, detail, new.offload_attempt_id)


def _damaged_too(rt: Runtime, topic: str, ledger_id: int, damaged: str) -> LedgerRepair:
    """The new objects' findings are what a scrub of them finds now."""
    new = _offloaded_again(rt, topic, ledger_id)
    (target,) = [
        t for t in plan_scrub(rt.metadata, [topic]) if t.offload_uuid == new.offload_attempt_id
    ]
    (result,) = scrub_targets(rt.stores, [target])
    assert [f.kind for f in result.findings] == [FindingKind.DAMAGED_INDEX]
    detail = f"offloaded again as {new.offload_attempt_id}, but the new objects are damaged too"
    return LedgerRepair(
        ledger_id, Action.REPAIR_FAILED, detail, new.offload_attempt_id, result.findings
    )


def _upload_failed(rt: Runtime, topic: str, ledger_id: int, damaged: str) -> LedgerRepair:
    return LedgerRepair(ledger_id, Action.REPAIR_FAILED, f"offloading again failed: {PUT_FAILED}")


def _no_hot_copy(rt: Runtime, topic: str, ledger_id: int, damaged: str) -> LedgerRepair:
    return LedgerRepair(ledger_id, Action.NO_HOT_COPY, f"hot copy deleted: {damaged} the only copy")


def _hot_copy_missing(rt: Runtime, topic: str, ledger_id: int, damaged: str) -> LedgerRepair:
    detail = (
        f"ledger {topic}/{ledger_id} has no hot copy (hot state present): its damaged "
        "objects cannot be offloaded again"
    )
    return LedgerRepair(ledger_id, Action.NO_HOT_COPY, detail)


@dataclass(frozen=True)
class Fate:
    """How the repair of each damaged ledger goes: what is done to the ledger before the
    scrub, the runtime the scrub runs in, and what the report must say about the ledger
    (given the words naming what was damaged)."""

    before: Callable[[Runtime, str, int], None]
    scrub_in: Callable[[Runtime], Runtime]
    expected: Callable[[Runtime, str, int, str], LedgerRepair]


FATES = {
    "repaired": Fate(_keep, _as_is, _repaired),
    "hot-copy-deleted": Fate(_hot_copy_deleted, _as_is, _no_hot_copy),
    "hot-file-lost": Fate(_hot_file_lost, _as_is, _hot_copy_missing),
    "upload-fails": Fate(_keep, _puts_fail, _upload_failed),
    "new-objects-damaged-too": Fate(_keep, _indexes_damaged_once_written, _damaged_too),
}


def segment_name(rt: Runtime, segment: Segment) -> str:
    """How the report names a segment: its id and the ranges its index holds."""
    index = decode_segment_index(rt.objects.get(segment.index_key))
    held = ", ".join(
        f"{n}:{x.first_entry_id}..{n}:{x.last_entry_id}"
        for n, x in zip(index.ledger_ids, index.ledgers, strict=True)
    )
    return f"segment {segment.segment_id} (entries {held})"


@pytest.mark.parametrize("fate", list(FATES))
def test_a_damaged_ledgers_repair_is_reported_word_for_word(runtime: Runtime, fate: str) -> None:
    """The verdict carries the repair's action, detail, new attempt and the new objects'
    findings after the old ones; only a repair whose new objects scrub clean passes."""
    rt = runtime
    victim, other = offloaded_topic(rt, shapes=SMALL)
    FATES[fate].before(rt, "orders", victim.ledger_id)
    planted = DAMAGES["missing-data-object"](rt, victim)
    found = Finding("orders", victim.ledger_id, planted.key, None, planted.kind, planted.reason)

    report = run_scrub(FATES[fate].scrub_in(rt), ["orders"])

    repair = FATES[fate].expected(rt, "orders", victim.ledger_id, "the damaged objects are")
    assert report.damaged == [
        LedgerVerdict(
            "orders",
            victim.ledger_id,
            victim.offload_attempt_id or "",
            repair.action,
            repair.detail,
            (found, *repair.findings),
            repair.replaced_by,
        )
    ]
    assert report.failed is (repair.action is not Action.REPAIRED)
    assert rt.metadata.get_ledger("orders", other.ledger_id) == other


@pytest.mark.parametrize("fate", list(FATES))
def test_each_ledger_of_a_damaged_segment_is_reported_word_for_word(
    runtime: Runtime, fate: str
) -> None:
    """Every ledger with entries in the damaged segment meets the same fate; the verdict
    lists each by id with the words of its own repair, the segment named by its ranges."""
    rt = runtime
    streamed_topic(rt, T, 3)
    victim = shared_segment(rt, T)
    name = segment_name(rt, victim)
    (target,) = [t for t in plan_scrub(rt.metadata, [T]) if t.segment_id == victim.segment_id]
    ids = sorted({n for n, _, _ in target.pieces})
    for n in ids:
        FATES[fate].before(rt, T, n)
    flip_a_payload_byte(rt, victim)

    report = run_scrub(FATES[fate].scrub_in(rt), [T])

    (verdict,) = report.damaged
    expected = tuple(FATES[fate].expected(rt, T, n, f"{name} is") for n in ids)
    assert (verdict.offload_uuid, verdict.ledgers) == (victim.segment_id, expected)
    assert verdict.action is expected[0].action
    assert report.failed is (verdict.action is not Action.REPAIRED)


def test_a_segment_ledger_already_on_objects_of_its_own_is_not_repaired_again(
    runtime: Runtime,
) -> None:
    """A ledger of the damaged segment was moved to v1 objects of its own before the scrub:
    the segment's damage no longer concerns it, and the report says which objects it
    names now; the others are repaired."""
    rt = runtime
    streamed_topic(rt, T, 3)
    victim = shared_segment(rt, T)
    (target,) = [t for t in plan_scrub(rt.metadata, [T]) if t.segment_id == victim.segment_id]
    moved, *rest = sorted({n for n, _, _ in target.pieces})
    LedgerOffloader(rt).replace_ledger(T, moved, None, "back to v1")
    own = _offloaded_again(rt, T, moved)
    flip_a_payload_byte(rt, victim)

    report = run_scrub(rt, [T])

    (verdict,) = [v for v in report.damaged if v.offload_uuid == victim.segment_id]
    changed = LedgerRepair(
        moved,
        Action.CHANGED,
        f"the ledger names other objects now (attempt {own.offload_attempt_id}); these are no "
        "longer read",
    )
    assert verdict.ledgers == (changed, *(_repaired(rt, T, n, "") for n in rest))
    assert verdict.action is Action.REPAIRED and not report.failed
    assert rt.metadata.get_ledger(T, moved) == own


def test_a_ledger_still_being_streamed_is_told_to_wait_for_its_offload(runtime: Runtime) -> None:
    """The open ledger's entries are in a damaged segment and nowhere else in the tier: the
    report says so and tells the operator when to scrub again."""
    rt = runtime
    streamed_topic(rt, T, 2)
    with streamed_open_ledger(rt, T) as open_id:
        held = ledgers_by_segment(rt, T)
        (victim,) = [s for s in rt.metadata.segments.of_topic(T) if held[s.segment_id] == {open_id}]
        flip_a_payload_byte(rt, victim)

        report = run_scrub(rt, [T])

    (verdict,) = report.damaged
    waiting = LedgerRepair(
        open_id,
        Action.NOT_OFFLOADED,
        f"still being streamed (open, offload none): its entries in segment "
        f"{victim.segment_id} (entries {open_id}:0..{open_id}:5) are read from nowhere else "
        "once its hot copy goes; run the scrub again once it is offloaded",
    )
    assert verdict.ledgers == (waiting,)
    assert verdict.action is Action.NOT_OFFLOADED and report.failed


def test_a_ledger_row_naming_no_store_is_unreadable_and_the_report_says_how_to_fix_it(
    runtime: Runtime,
) -> None:
    """A row written before revision 0002 has no store: the run reads the other ledgers,
    reports this one unreadable with the command that records its store, and fails; the
    report's times are the database's, the start before the end."""
    rt = runtime
    victim, *others = offloaded_topic(rt, shapes=SMALL)
    L = schema.ledgers
    with rt.metadata.engine.begin() as conn:
        conn.execute(
            L.update()
            .where(L.c.topic == "orders", L.c.ledger_id == victim.ledger_id)
            .values(store_id=None)
        )
    before = rt.metadata.db_now_ms()

    report = run_scrub(rt, ["orders"])

    after = rt.metadata.db_now_ms()
    doc = report.to_json()
    assert before <= doc["started_ms"] <= doc["finished_ms"] <= after
    reason = f"ledger orders/{victim.ledger_id} {NO_STORE}"
    finding = {"key": victim.data_key, "offset": None, "kind": "unreadable", "reason": reason}
    counts = expected_counts(rt, others)
    assert doc == {
        "format": "offloader-scrub-report",
        "format_version": 1,
        "topics": ["orders"],
        "repair": True,
        "started_ms": doc["started_ms"],
        "finished_ms": doc["finished_ms"],
        "counts": {**asdict(counts), "ledgers": len(others) + 1},
        "failed": True,
        "damaged_ledgers": [
            {
                "topic": "orders",
                "ledger_id": victim.ledger_id,
                "offload_uuid": victim.offload_attempt_id,
                "action": "unreadable",
                "failed": True,
                "detail": "the store could not be read; nothing was changed",
                "replaced_by": None,
                "findings": [finding],
                "ledgers": [],
            }
        ],
    }


def test_a_segment_target_naming_no_store_is_named_as_a_segment(runtime: Runtime) -> None:
    """Targets come from anywhere (``scrub_targets`` is public): one for a segment without
    a store is named as the segment, not as a ledger, in process and on a Spark executor
    alike."""
    rt = runtime
    streamed_topic(rt, T, 2)
    (target, *_) = plan_scrub(rt.metadata, [T])
    assert target.segment_id is not None

    (in_process,) = scrub_targets(rt.stores, [replace(target, store_id=None)])
    settings = rt.settings.for_object_stores()
    (on_executor,) = scrub_partition([replace(target, location=None)], settings)

    for result in (in_process, on_executor):
        assert result.findings == (
            Finding(
                T,
                target.ledger_id,
                target.data_key,
                None,
                FindingKind.UNREADABLE,
                f"{T}/segment {target.segment_id} {NO_STORE}",
            ),
        )
        assert (result.objects, result.blocks, result.bytes, result.entries) == (0, 0, 0, 0)

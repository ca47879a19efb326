"""A repair that finds the ledger moved between the scrub's look at it and its own start
(another scrub replaced it, another attempt holds it, retention moved the topic's start):
nothing is swapped and the verdict of each ledger of the damaged segment says why, by
ledger id. In-process: the competitor runs inside ``replace_ledger``, just before ours."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from fixtures.streamed import (
    flip_a_payload_byte,
    ledgers_by_segment,
    shared_segment,
    streamed_topic,
)
from offloader.keys import ledger_object_keys
from offloader.metadata import Position
from offloader.offload.ledger_offloader import LedgerOffloader, OffloadResult, owner_id
from offloader.runtime import Runtime
from offloader.scrub import Action, run_scrub
from offloader.scrub.report import LedgerRepair

T = "events"
Competitor = Callable[[LedgerOffloader, int], str | None]
REAL_REPLACE = LedgerOffloader.replace_ledger  # before any test patches it


def _replaced_first(offloader: LedgerOffloader, ledger_id: int) -> str | None:
    """Another scrub repaired the ledger first: it is mode ``ledger`` on new objects."""
    done = REAL_REPLACE(offloader, T, ledger_id, None, "another scrub")
    assert done.attempt_id is not None
    return done.attempt_id


def _held_by_another_attempt(offloader: LedgerOffloader, ledger_id: int) -> str | None:
    """Another repair began and holds the ledger's lease (its upload still running)."""
    rt = offloader.runtime
    ledger = rt.metadata.get_ledger(T, ledger_id)
    attempt_id = str(uuid.uuid4())
    data_key, index_key = ledger_object_keys(attempt_id, ledger_id)
    rt.metadata.attempts.begin(
        ledger,
        attempt_id,
        data_key,
        index_key,
        owner_id(),
        600_000,
        store_id=rt.stores.default_id(),
        replace=True,
    )
    return attempt_id


def _start_moved_past(offloader: LedgerOffloader, ledger_id: int) -> str | None:
    """Retention moved the topic's start past the ledger and has not marked it yet."""
    metadata = offloader.runtime.metadata
    metadata.retention.move_start(
        metadata.get_topic(T), Position(ledger_id=ledger_id + 1, entry_id=0)
    )
    return None


def _expected(name: str, ledger_id: int, competitor_attempt: str | None) -> LedgerRepair:
    if name == "replaced":
        detail = (
            f"the ledger names other objects now (attempt {competitor_attempt}); these are "
            "no longer read"
        )
        return LedgerRepair(ledger_id, Action.CHANGED, detail)
    if name == "in-progress":
        return LedgerRepair(
            ledger_id, Action.IN_PROGRESS, f"attempt {competitor_attempt} is replacing it"
        )
    return LedgerRepair(
        ledger_id,
        Action.REPAIR_FAILED,
        "the ledger moved while its repair began (trimmed); nothing was changed: "
        "run the scrub again",
    )


COMPETITORS: dict[str, Competitor] = {
    "replaced": _replaced_first,
    "in-progress": _held_by_another_attempt,
    "start-moved": _start_moved_past,
}


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
@pytest.mark.parametrize("race", list(COMPETITORS))
def test_a_segment_ledger_that_moved_before_its_repair_is_named_with_why(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, race: str
) -> None:
    """Each ledger of the damaged segment meets the race just before its own repair; the
    report names every one by id with the action and the operator-facing reason."""
    rt = runtime
    streamed_topic(rt, T, 3)
    victim = shared_segment(rt, T)
    ids = sorted(ledgers_by_segment(rt, T)[victim.segment_id])
    flip_a_payload_byte(rt, victim)
    seen: dict[int, str | None] = {}

    def replace_ledger(
        self: LedgerOffloader, topic: str, ledger_id: int, *args: object, **kw: object
    ) -> OffloadResult:
        seen[ledger_id] = COMPETITORS[race](self, ledger_id)
        return REAL_REPLACE(self, topic, ledger_id, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(LedgerOffloader, "replace_ledger", replace_ledger)
    report = run_scrub(rt, [T])

    (verdict,) = report.damaged
    assert verdict.offload_uuid == victim.segment_id and sorted(seen) == ids
    assert list(verdict.ledgers) == [_expected(race, n, seen[n]) for n in ids]
    failed = race != "replaced"
    assert report.failed is failed and verdict.action is verdict.ledgers[0].action
    entries = report.to_json()["damaged_ledgers"][0]["ledgers"]
    assert [(x["ledger_id"], x["action"], x["detail"]) for x in entries] == [
        (x.ledger_id, x.action.value, x.detail) for x in verdict.ledgers
    ]

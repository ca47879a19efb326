"""Trim (PDP-19 ``trimStream``): move a topic's start, then delete what falls below it.

The start moves first, by CAS on the topic's version, so reads below it fail at once
(invariant 4); only then are ledgers wholly below it marked ``deleting`` and their hot
copies and objects sent on their way (offloader.retention.deletion). A ledger partly below
stays, its head hidden by the start. A trim at or below the start moves nothing but still
finishes what a killed trim left undone, so repeating a trim is idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from offloader import failpoints
from offloader.exceptions import CommitFailedError, TopicDeletedError
from offloader.metadata import LedgerState, MetadataStore, Position, Topic
from offloader.results import fields_json
from offloader.retention.deletion import Marked, delete_marked_hot_copies, mark_below_start
from offloader.retention.start_record import record_start
from offloader.runtime import Runtime

log = logging.getLogger(__name__)

MAX_TRIES = 20  # CAS retries against writers bumping the topic's version


@dataclass(frozen=True)
class TrimResult:
    topic: str
    start_before: Position
    start_after: Position
    ledgers_deleting: list[int]  # marked by this run (dry run: that would be)
    queued_keys: int
    hot_deleted: list[int]
    changed: bool
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        verb = "would mark" if self.dry_run else "marked"
        deleting = self.ledgers_deleting
        return (
            f"topic {self.topic}: start {self.start_before} -> {self.start_after}; "
            f"{verb} {len(deleting)} ledgers deleting "
            f"{deleting[:20]}{' ...' if len(deleting) > 20 else ''}, "
            f"{self.queued_keys} object keys queued"
            + ("" if self.dry_run else f", {len(self.hot_deleted)} hot copies removed")
            + ("" if self.changed or self.dry_run else " (nothing to do)")
        )


def trim_topic(rt: Runtime, topic: str, position: Position, *, dry_run: bool = False) -> TrimResult:
    """Trim ``topic`` at ``position``; with ``dry_run``, only report what would go.

    Beyond the end of the sealed data, or past a ledger's last entry, is a ValueError
    that changes nothing; a deleted topic is TopicDeletedError.
    """

    def target(current: Topic) -> Position:
        if current.is_deleted:
            raise TopicDeletedError(f"topic {topic!r} was deleted; it cannot be trimmed")
        return normalize(rt.metadata, current, position)

    if dry_run:
        current = rt.metadata.get_topic(topic)
        return _dry_run(rt, current, max(target(current), current.start))

    def move(current: Topic) -> Topic | None:
        wanted = target(current)
        if wanted <= current.start:
            return None
        record_start(rt, topic, wanted)  # before the database: a rebuild never reads below
        return rt.metadata.retention.move_start(current, wanted)

    return _finish(rt, *_commit_start(rt, topic, move, "move the start of"))


def delete_topic(rt: Runtime, topic: str) -> TrimResult:
    """`offloader topic delete`: fence the writer and move the start past every ledger
    (one CAS), then delete every ledger as a trim does. A deleted topic's name is not
    reused; deleting it again only finishes what a killed run left."""

    def move(current: Topic) -> Topic | None:
        if current.is_deleted:
            return None
        record_start(rt, topic, Position(ledger_id=current.next_ledger_id, entry_id=0))
        return rt.metadata.retention.delete_topic(current)

    return _finish(rt, *_commit_start(rt, topic, move, "delete"))


def _commit_start(
    rt: Runtime, topic: str, move: Callable[[Topic], Topic | None], what: str
) -> tuple[Topic, Position]:
    """Step one of a trim: ``move`` the topic's start by CAS (None: nothing to move),
    reading the topic again when a writer or another trim moved it first. Returns the
    topic as it is now and its start before."""
    for _ in range(MAX_TRIES):
        current = rt.metadata.get_topic(topic)
        try:
            moved = move(current)
        except CommitFailedError:
            continue
        if moved is None:
            return current, current.start
        log.info("topic %s start moved from %s to %s", topic, current.start, moved.start)
        failpoints.reach("after-trim-start-moved")
        return moved, current.start
    raise CommitFailedError(f"could not {what} topic {topic!r}: too much contention")


def _finish(rt: Runtime, topic: Topic, before: Position) -> TrimResult:
    """Steps two and three: mark what lies below the start, remove its hot copies (after
    the start's record is raised to the database's start, should a race or an older release
    have left it behind)."""
    record_start(rt, topic.name, topic.start)
    done = finish_trim(rt, topic)
    return TrimResult(
        topic=topic.name,
        start_before=before,
        start_after=topic.start,
        ledgers_deleting=done.ledgers_deleting,
        queued_keys=done.queued_keys,
        hot_deleted=done.hot_deleted,
        changed=topic.start != before or bool(done.ledgers_deleting or done.hot_deleted),
    )


def finish_trim(rt: Runtime, topic: Topic) -> Marked:
    """Mark what lies below the start and remove its hot copies (idempotent)."""
    done = mark_below_start(rt, topic)
    done.hot_deleted = delete_marked_hot_copies(rt, topic.name)
    return done


def normalize(metadata: MetadataStore, topic: Topic, position: Position) -> Position:
    """``position`` checked against the topic, in its canonical form: a position past a
    sealed ledger's last entry is the next ledger's entry 0 (so that ledger is wholly
    below). At or below the start it is returned as is (a no-op, not checked)."""
    if position <= topic.start:
        return position
    end = metadata.retention.end_of_sealed(topic.name)
    if position > end:
        raise ValueError(
            f"position {position} is beyond the end of topic {topic.name!r} ({end}: the "
            "sealed data ends there)"
        )
    while position < end:
        ledger = metadata.get_ledger(topic.name, position.ledger_id)
        if ledger.state is not LedgerState.SEALED or position.entry_id < ledger.entry_count:
            break
        if position.entry_id > ledger.entry_count:
            raise ValueError(
                f"position {position} is beyond the end of ledger {ledger.ledger_id} of topic "
                f"{topic.name!r} ({ledger.entry_count} entries, ids 0..{ledger.entry_count - 1})"
            )
        position = Position(ledger_id=position.ledger_id + 1, entry_id=0)
    return position


def _dry_run(rt: Runtime, topic: Topic, target: Position) -> TrimResult:
    """What a trim to ``target`` would mark and queue; changes nothing."""
    below = target.ledger_id
    ids = rt.metadata.retention.ledgers_to_trim(topic.name, below)
    return TrimResult(
        topic=topic.name,
        start_before=topic.start,
        start_after=target,
        ledgers_deleting=ids,
        queued_keys=rt.metadata.retention.count_keys_to_trim(topic.name, below),
        hot_deleted=[],
        changed=False,
        dry_run=True,
    )


def resolve_target(
    rt: Runtime, topic: str, *, cut_id: int | None = None, position: str | Position | None = None
) -> Position:
    """The position a trim names: exactly one of a cut id (NotFoundError if unknown) or a
    ``L:E`` position."""
    if (cut_id is None) == (position is None):
        raise ValueError("a trim takes exactly one of a cut id or a position L:E")
    if cut_id is not None:
        return rt.metadata.retention.get_cut(topic, cut_id).position
    return position if isinstance(position, Position) else Position.parse(str(position))

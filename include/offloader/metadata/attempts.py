"""Offload attempts: the intent to offload a ledger as v1 objects of its own, from its
record (keys, store, lease) before the first byte moves (invariant 1) to its commit, its
failure, or its takeover by another attempt once its lease ran out (invariants 2 and 6).

One ledger at a time (:meth:`AttemptStore.begin` ... :meth:`~AttemptStore.commit`), or many
ledgers of one topic with one transaction a step (``*_batch``); a replacement (scrub's
repair, the way back to v1) swaps an offloaded ledger onto new objects
(:meth:`~AttemptStore.commit_replacement`). Whatever an attempt leaves behind is queued
for deletion in the transaction that retires it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader import failpoints
from offloader.exceptions import CommitFailedError, NotFoundError
from offloader.metadata import schema
from offloader.metadata._rows import (
    cas,
    cas_ledger_if,
    lease_over,
    ledger_key,
    one_topic,
    read_ledger,
)
from offloader.metadata.clock import db_now, db_now_ms
from offloader.metadata.deletions import queue_keys
from offloader.metadata.engine import Database
from offloader.metadata.pieces import release_moved
from offloader.metadata.records import (
    Attempt,
    AttemptState,
    DeletionState,
    HotState,
    Ledger,
    OffloadMode,
    OffloadState,
)

L, A = schema.ledgers, schema.offload_attempts


@dataclass(frozen=True)
class AttemptIntent:
    """What :meth:`AttemptStore.begin_batch` records for one ledger: a fresh attempt id
    and its object keys, against the ledger as last read (its version is the CAS guard)."""

    ledger: Ledger
    attempt_id: str
    data_key: str
    index_key: str


class AttemptStore:
    """Offload attempts of the metadata store (``metadata.attempts``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- one ledger ---------------------------------------------------------------------
    def begin(
        self,
        ledger: Ledger,
        attempt_id: str,
        data_key: str,
        index_key: str,
        owner: str,
        lease_ms: int,
        *,
        store_id: int,
        replace: bool = False,
        from_tier: bool = False,
    ) -> tuple[Ledger, Attempt]:
        """Record the intent (attempt id, keys, store) before the first byte is uploaded.

        A stale attempt still named by the ledger (its lease ran out) is superseded here
        and its objects are queued for deletion in the same transaction. Whether the lease
        ran out is decided by the database's clock inside the conditional update, so the
        check and the takeover are one step and a worker's clock has no say.

        ``replace``: a second offload of an offloaded ledger, as v1 objects of its own:
        its objects are damaged (scrub's repair), or it is a stream-mode ledger going back
        to v1 (``offloader/rewrite/to_v1.py``). The ledger stays ``offloaded`` on its
        current objects or segments until :meth:`commit_replacement` swaps them; hot
        deletion waits while the attempt lives. Its hot copy must still be present (the
        new objects are written from it) unless ``from_tier``: the entries are read from
        the ledger's current objects in the tier.
        """
        epoch = ledger.offload_epoch + 1
        if not ledger.is_live:
            raise CommitFailedError(
                f"ledger {ledger.topic}/{ledger.ledger_id} is {ledger.deletion_state}: trimmed"
            )
        if replace and not (ledger.is_offloaded and (from_tier or ledger.has_hot_copy)):
            raise ValueError(
                f"ledger {ledger.topic}/{ledger.ledger_id} cannot be offloaded again: it is "
                f"{ledger.offload_state} with its hot copy {ledger.hot_state} (a replacement "
                "needs an offloaded ledger"
                + ("" if from_tier else " whose hot copy is present")
                + ")"
            )
        replaceable = sa.and_(
            L.c.offload_state == OffloadState.OFFLOADED,
            sa.true() if from_tier else L.c.hot_state == HotState.PRESENT,
        )
        with self.db.transaction() as conn:
            cas_ledger_if(
                conn,
                ledger,
                sa.and_(
                    L.c.deletion_state == DeletionState.NONE,
                    lease_over() if ledger.attempt_id is not None else sa.true(),
                    replaceable if replace else sa.true(),
                ),
                f"has attempt {ledger.attempt_id} in flight until its lease ends"
                if ledger.attempt_id is not None
                else "was trimmed: it is below its topic's start",
                offload_state=OffloadState.OFFLOADED if replace else OffloadState.OFFLOADING,
                offload_epoch=epoch,
                attempt_id=attempt_id,
                attempt_lease_ms=db_now() + lease_ms,
            )
            if ledger.attempt_id is not None:
                retire(
                    conn,
                    ledger.attempt_id,
                    AttemptState.SUPERSEDED,
                    "lease expired; superseded by " + attempt_id,
                )
            conn.execute(
                A.insert().values(
                    attempt_id=attempt_id,
                    topic=ledger.topic,
                    ledger_id=ledger.ledger_id,
                    epoch=epoch,
                    data_key=data_key,
                    index_key=index_key,
                    state=AttemptState.STARTED,
                    owner=owner[:255],
                    created_ms=db_now(),
                    store_id=store_id,
                )
            )
            return read_ledger(conn, ledger.topic, ledger.ledger_id), read_attempt(conn, attempt_id)

    def renew(self, attempt: Attempt, lease_ms: int) -> bool:
        """Extend the attempt's lease (from the database's now); False once another
        attempt owns the ledger."""
        with self.db.transaction() as conn:
            result = conn.execute(
                L.update()
                .where(
                    _owned_by(attempt),
                )
                .values(attempt_lease_ms=db_now() + lease_ms)
            )
            return result.rowcount == 1

    def commit(self, attempt: Attempt, data_len: int) -> Ledger:
        """Make ``attempt`` the ledger's offload, if the ledger still names it (CAS)."""
        with self.db.transaction() as conn:
            result = conn.execute(
                L.update()
                .where(
                    _owned_by(attempt),
                    L.c.offload_state == OffloadState.OFFLOADING,
                )
                .values(version=L.c.version + 1, **_committed(attempt, data_len))
            )
            if result.rowcount != 1:
                raise CommitFailedError(
                    f"attempt {attempt.attempt_id} (epoch {attempt.epoch}) no longer owns "
                    f"ledger {attempt.topic}/{attempt.ledger_id}"
                )
            conn.execute(
                A.update()
                .where(A.c.attempt_id == attempt.attempt_id)
                .values(state=AttemptState.COMMITTED, finished_ms=db_now())
            )
            return read_ledger(conn, attempt.topic, attempt.ledger_id)

    def commit_replacement(
        self, attempt: Attempt, data_len: int, reason: str, *, grace_ms: int = 0
    ) -> Ledger:
        """Swap an offloaded ledger onto a replacement ``attempt`` (see ``begin``'s
        ``replace``), if the ledger still names it (CAS on its attempt, epoch and version).
        The ledger is then offloaded in mode ``ledger`` on the attempt's keys.

        In the same transaction the replaced objects are queued for deletion with
        ``reason``, due ``grace_ms`` later (a reader that looked them up before the swap
        still finds them), and the attempt that wrote them becomes ``superseded``, so the
        ledger keeps exactly one committed attempt and no object is left unaccounted for.
        A ledger that was offloaded in mode ``stream`` has no objects or attempt of its
        own: instead every segment holding it that no ledger needs any more is released
        (its keys queued, due ``grace_ms`` later: see ``pieces.release_deleted``).
        """
        what = f"attempt {attempt.attempt_id} (epoch {attempt.epoch})"
        with self.db.transaction() as conn:
            # the row stays locked from this read to the swap: on PostgreSQL a writer that
            # changed it in between (a hot deletion recording its end) would fail the CAS
            # and waste a whole re-upload (SQLite's BEGIN IMMEDIATE holds every writer off)
            row = (
                conn.execute(
                    sa.select(L)
                    .where(_owned_by(attempt), L.c.offload_state == OffloadState.OFFLOADED)
                    .with_for_update()
                )
                .mappings()
                .first()
            )
            if row is None:
                raise CommitFailedError(
                    f"{what} no longer owns offloaded ledger {attempt.topic}/{attempt.ledger_id}"
                )
            old = Ledger.model_validate(dict(row))
            cas(conn, L, _owned_by(attempt), old.version, what, **_committed(attempt, data_len))
            failpoints.reach("mid-replacement-commit")
            if old.offload_mode is OffloadMode.STREAM:
                release_moved(conn, old.topic, old.ledger_id, reason, grace_ms)
            else:
                _supersede_replaced(conn, old, attempt, reason, grace_ms)
            conn.execute(
                A.update()
                .where(A.c.attempt_id == attempt.attempt_id)
                .values(state=AttemptState.COMMITTED, finished_ms=db_now())
            )
            return read_ledger(conn, attempt.topic, attempt.ledger_id)

    def fail(self, attempt: Attempt, detail: str) -> None:
        """Give up an attempt: queue its objects for deletion, free the ledger if still ours
        (a failed replacement leaves the ledger offloaded on the objects it had)."""
        offloading = L.c.offload_state == OffloadState.OFFLOADING
        with self.db.transaction() as conn:
            retire(conn, attempt.attempt_id, AttemptState.FAILED, detail, requeue_superseded=True)
            conn.execute(
                L.update()
                .where(
                    _owned_by(attempt),
                )
                .values(
                    version=L.c.version + 1,
                    offload_state=sa.case((offloading, OffloadState.NONE), else_=L.c.offload_state),
                    attempt_id=None,
                    attempt_lease_ms=None,
                )
            )

    def get(self, attempt_id: str) -> Attempt:
        with self.db.engine.connect() as conn:
            return read_attempt(conn, attempt_id)

    # --- many ledgers of one topic, one transaction a step --------------------------------
    def begin_batch(
        self, intents: Sequence[AttemptIntent], owner: str, lease_ms: int, *, store_id: int
    ) -> dict[int, Attempt]:
        """Record the intents of many ledgers of one topic in one transaction, before any
        byte moves.

        Each ledger is still a compare-and-set on its own row: one UPDATE whose condition
        pairs every ledger with the version it was read at, so a ledger that moved since
        (or whose attempt in flight still holds its lease) is skipped and absent from the
        result while the others start. A stale attempt is superseded and its objects
        queued, as in :meth:`begin`. Whether a lease ran out is decided by the
        database's clock inside the UPDATE (invariant 6).
        """
        if not intents:
            return {}
        topic = one_topic(i.ledger.topic for i in intents)
        free = {i.ledger.ledger_id: i for i in intents}
        by_ledger = L.c.ledger_id
        with self.db.transaction() as conn:
            now = db_now_ms(conn)  # the attempts' creation time; leases are decided in SQL
            updated = conn.execute(
                L.update()
                .where(
                    L.c.topic == topic,
                    sa.tuple_(L.c.ledger_id, L.c.version).in_(
                        [(n, i.ledger.version) for n, i in free.items()]
                    ),
                    sa.or_(L.c.attempt_id.is_(None), lease_over()),
                    L.c.deletion_state == DeletionState.NONE,
                )
                .values(
                    version=L.c.version + 1,
                    offload_state=OffloadState.OFFLOADING,
                    offload_epoch=L.c.offload_epoch + 1,
                    attempt_id=sa.case({n: i.attempt_id for n, i in free.items()}, value=by_ledger),
                    attempt_lease_ms=db_now() + lease_ms,
                )
                .returning(L.c.ledger_id)
            )
            started_ids = sorted(updated.scalars())
            failpoints.reach("mid-batch-begin")
            started = {}
            for ledger_id in started_ids:
                intent = free[ledger_id]
                if intent.ledger.attempt_id is not None:
                    retire(
                        conn,
                        intent.ledger.attempt_id,
                        AttemptState.SUPERSEDED,
                        "lease expired; superseded by " + intent.attempt_id,
                    )
                started[ledger_id] = Attempt(
                    attempt_id=intent.attempt_id,
                    topic=topic,
                    ledger_id=ledger_id,
                    epoch=intent.ledger.offload_epoch + 1,  # the version pinned the old epoch
                    data_key=intent.data_key,
                    index_key=intent.index_key,
                    state=AttemptState.STARTED,
                    owner=owner[:255],
                    created_ms=now,
                    finished_ms=None,
                    detail=None,
                    store_id=store_id,
                )
            if started:
                conn.execute(
                    A.insert(),
                    [a.model_dump(exclude={"finished_ms", "detail"}) for a in started.values()],
                )
        return started

    def renew_batch(self, attempts: Iterable[Attempt], lease_ms: int) -> set[str]:
        """Extend many attempts' leases in one statement; the ids of those that lost."""
        attempts = list(attempts)
        if not attempts:
            return set()
        with self.db.transaction() as conn:
            renewed = conn.execute(
                L.update()
                .where(_owned_by_any(attempts))
                .values(attempt_lease_ms=db_now() + lease_ms)
                .returning(L.c.attempt_id)
            )
            alive = set(renewed.scalars())
        return {a.attempt_id for a in attempts} - alive

    def commit_batch(self, finished: Sequence[tuple[Attempt, int]]) -> set[str]:
        """Commit many finished attempts of one topic in one transaction; the ids of those
        committed.

        One UPDATE whose condition pairs every ledger with its attempt id and epoch
        (invariants 2 and 6): an attempt that no longer owns its ledger is retired alone,
        its objects queued for deletion in this same transaction, and the others commit.
        """
        if not finished:
            return set()
        one_topic(a.topic for a, _ in finished)  # before keying by ledger id: ids repeat
        attempts = {a.ledger_id: a for a, _ in finished}
        lengths = {a.ledger_id: n for a, n in finished}
        by_ledger = L.c.ledger_id
        with self.db.transaction() as conn:
            updated = conn.execute(
                L.update()
                .where(
                    _owned_by_any(attempts.values()), L.c.offload_state == OffloadState.OFFLOADING
                )
                .values(
                    version=L.c.version + 1,
                    offload_state=OffloadState.OFFLOADED,
                    attempt_id=None,
                    attempt_lease_ms=None,
                    offload_uuid=sa.case(
                        {n: a.attempt_id for n, a in attempts.items()}, value=by_ledger
                    ),
                    data_key=sa.case({n: a.data_key for n, a in attempts.items()}, value=by_ledger),
                    index_key=sa.case(
                        {n: a.index_key for n, a in attempts.items()}, value=by_ledger
                    ),
                    data_len=sa.case(lengths, value=by_ledger),
                    offloaded_ms=db_now(),
                    store_id=sa.case({n: a.store_id for n, a in attempts.items()}, value=by_ledger),
                )
                .returning(L.c.ledger_id)
            )
            committed = {attempts[n].attempt_id for n in updated.scalars()}
            failpoints.reach("mid-batch-commit")
            for attempt in attempts.values():
                if attempt.attempt_id in committed:
                    continue
                retire(
                    conn,
                    attempt.attempt_id,
                    AttemptState.FAILED,
                    f"lost: attempt {attempt.attempt_id} (epoch {attempt.epoch}) no longer "
                    f"owns ledger {attempt.topic}/{attempt.ledger_id}",
                    requeue_superseded=True,
                )
            if committed:
                conn.execute(
                    A.update()
                    .where(A.c.attempt_id.in_(sorted(committed)))
                    .values(state=AttemptState.COMMITTED, finished_ms=db_now())
                )
        return committed


def retire(
    conn: Connection,
    attempt_id: str,
    state: AttemptState,
    detail: str,
    *,
    requeue_superseded: bool = False,
) -> None:
    """Retire a started attempt and queue its objects; idempotent.

    ``requeue_superseded``: a zombie that finds itself superseded queues its keys again,
    because it may have written objects after the first deletion ran.
    """
    row = conn.execute(sa.select(A).where(A.c.attempt_id == attempt_id)).mappings().first()
    if row is None:
        return
    if row["state"] == AttemptState.SUPERSEDED and requeue_superseded:
        queue_keys(
            conn,
            [row["data_key"], row["index_key"]],
            "late objects of a superseded attempt",
            attempt_id,
            row["store_id"],
        )
        return
    if row["state"] != AttemptState.STARTED:
        return  # committed or already retired
    conn.execute(
        A.update()
        .where(A.c.attempt_id == attempt_id, A.c.state == AttemptState.STARTED)
        .values(state=state, finished_ms=db_now(), detail=detail[:2000])
    )
    keys = [row["data_key"], row["index_key"]]
    queue_keys(conn, keys, f"attempt {state}", attempt_id, row["store_id"])


def _supersede_replaced(
    conn: Connection, old: Ledger, attempt: Attempt, reason: str, grace_ms: int
) -> None:
    """Queue the objects a replacement swapped out and supersede the attempt that wrote
    them (``commit_replacement`` of a ledger offloaded in mode ``ledger``)."""
    detail = f"replaced by {attempt.attempt_id}: {reason}"
    keys = [k for k in (old.data_key, old.index_key) if k is not None]
    queue_keys(conn, keys, f"replaced: {reason}", old.offload_attempt_id, old.store_id, grace_ms)
    conn.execute(
        A.update()
        .where(A.c.attempt_id == old.offload_attempt_id, A.c.state == AttemptState.COMMITTED)
        .values(state=AttemptState.SUPERSEDED, detail=detail[:2000])
    )


def read_attempt(conn: Connection, attempt_id: str) -> Attempt:
    row = conn.execute(sa.select(A).where(A.c.attempt_id == attempt_id)).mappings().first()
    if row is None:
        raise NotFoundError(f"offload attempt {attempt_id} does not exist")
    return Attempt.model_validate(dict(row))


def _committed(attempt: Attempt, data_len: int) -> dict[str, object]:
    """The ledger columns that make ``attempt`` its offload (invariant 7: with its store)."""
    return dict(
        offload_state=OffloadState.OFFLOADED,
        offload_mode=OffloadMode.LEDGER,
        attempt_id=None,
        attempt_lease_ms=None,
        offload_uuid=attempt.attempt_id,
        data_key=attempt.data_key,
        index_key=attempt.index_key,
        data_len=data_len,
        offloaded_ms=db_now(),
        store_id=attempt.store_id,
    )


def _owned_by(attempt: Attempt) -> sa.ColumnElement[bool]:
    """The ledger row still names this attempt at this epoch (invariants 2 and 6)."""
    return sa.and_(
        ledger_key(attempt.topic, attempt.ledger_id),
        L.c.attempt_id == attempt.attempt_id,
        L.c.offload_epoch == attempt.epoch,
        L.c.deletion_state == DeletionState.NONE,  # a trimmed ledger takes no commit
    )


def _owned_by_any(attempts: Iterable[Attempt]) -> sa.ColumnElement[bool]:
    """:func:`_owned_by` for many attempts of one topic, as one condition."""
    attempts = list(attempts)
    return sa.and_(
        L.c.topic == one_topic(a.topic for a in attempts),
        sa.tuple_(L.c.ledger_id, L.c.attempt_id, L.c.offload_epoch).in_(
            [(a.ledger_id, a.attempt_id, a.epoch) for a in attempts]
        ),
        L.c.deletion_state == DeletionState.NONE,
    )

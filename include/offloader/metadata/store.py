"""The metadata store: every state change is a compare-and-set on a version, in one transaction.

SQLite (the embedded default) and PostgreSQL behave the same here: writes on SQLite take
the database lock at BEGIN (``BEGIN IMMEDIATE``) so concurrent writers queue instead of
failing, and CAS is ``UPDATE ... WHERE version = :expected`` with the row count checked.
Every timestamp written and every lease or age compared is the database's clock
(``clock.db_now()``), evaluated in the statement itself. Creates rely on the primary key,
not on a check before the insert: a racing duplicate becomes ``AlreadyExistsError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from offloader import failpoints
from offloader.exceptions import (
    AlreadyExistsError,
    CommitFailedError,
    NotFoundError,
    TopicDeletedError,
)
from offloader.metadata import schema
from offloader.metadata.clock import db_now, db_now_ms
from offloader.metadata.clock import now_ms as now_ms  # re-exported: the worker's clock
from offloader.metadata.locations import load_location, record_location
from offloader.metadata.migrate import check_revision
from offloader.metadata.records import (
    Attempt,
    AttemptState,
    Deletion,
    DeletionBacklog,
    DeletionState,
    HotState,
    Ledger,
    LedgerState,
    OffloadMode,
    OffloadState,
    Position,
    StreamCut,
    Topic,
    TopicState,
)
from offloader.metadata.rewrites import RewriteStore
from offloader.metadata.segments import SegmentStore
from offloader.objectstore.location import StoreLocation
from offloader.policy import OffloadPolicy

T, L, A, D = schema.topics, schema.ledgers, schema.offload_attempts, schema.deletion_queue
C = schema.stream_cuts


def create_metadata_engine(url: str) -> Engine:
    """An engine with the settings the CAS protocol relies on."""
    if url.startswith("sqlite"):
        database = sa.engine.make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn) -> None:  # type: ignore[no-untyped-def]
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


def _cas(
    conn: Connection,
    table: sa.Table,
    where: sa.ColumnElement[bool],
    expected: int,
    what: str,
    **values: object,
) -> None:
    result = conn.execute(
        table.update()
        .where(where, table.c.version == expected)
        .values(version=table.c.version + 1, **values)
    )
    if result.rowcount != 1:
        raise CommitFailedError(f"{what} changed since version {expected}: someone else moved")


def _cas_ledger(conn: Connection, ledger: Ledger, **values: object) -> None:
    where = _ledger_key(ledger.topic, ledger.ledger_id)
    what = f"ledger {ledger.topic}/{ledger.ledger_id}"
    _cas(conn, L, where, ledger.version, what, **values)


def _cas_ledger_if(
    conn: Connection,
    ledger: Ledger,
    condition: sa.ColumnElement[bool],
    refusal: str,
    **values: object,
) -> None:
    """CAS on the ledger that also requires ``condition``; an unchanged ledger that fails
    it raises CommitFailedError with ``refusal`` (what the condition protects)."""
    where = sa.and_(_ledger_key(ledger.topic, ledger.ledger_id), condition)
    what = f"ledger {ledger.topic}/{ledger.ledger_id}"
    try:
        _cas(conn, L, where, ledger.version, what, **values)
    except CommitFailedError:
        key = _ledger_key(ledger.topic, ledger.ledger_id)
        current = conn.execute(sa.select(L.c.version).where(key)).scalar()
        if current == ledger.version:
            raise CommitFailedError(f"{what} {refusal}") from None
        raise


@dataclass(frozen=True)
class AttemptIntent:
    """What :meth:`MetadataStore.begin_attempts` records for one ledger: a fresh attempt id
    and its object keys, against the ledger as last read (its version is the CAS guard)."""

    ledger: Ledger
    attempt_id: str
    data_key: str
    index_key: str


class MetadataStore:
    """Topics, ledgers, offload attempts and the deletion queue."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def open(cls, url: str) -> MetadataStore:
        """Open a database at the head revision; SchemaOutOfDateError otherwise."""
        engine = create_metadata_engine(url)
        try:
            check_revision(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    @cached_property
    def segments(self) -> SegmentStore:
        """Streaming offload's streams, segments and parts (metadata/segments.py)."""
        return SegmentStore(self)

    @cached_property
    def rewrites(self) -> RewriteStore:
        """Compaction's and format migration's rewrite segments (metadata/rewrites.py)."""
        return RewriteStore(self)

    def db_now_ms(self) -> int:
        """The database's clock, the one leases and ages are measured on (invariant 6)."""
        with self.engine.connect() as conn:
            return db_now_ms(conn)

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    # --- topics --------------------------------------------------------------------------
    def create_topic(self, name: str, policy: OffloadPolicy) -> Topic:
        if not name or len(name) > 512:
            raise ValueError("topic name must be 1 to 512 characters")
        try:
            with self.transaction() as conn:
                conn.execute(
                    T.insert().values(
                        name=name,
                        version=1,
                        policy=policy.model_dump_json(),
                        created_ms=db_now(),
                        next_ledger_id=1,
                        writer_epoch=0,
                    )
                )
                return self._topic(conn, name)
        except IntegrityError as exc:  # the primary key: a concurrent create won
            with self.engine.connect() as conn:
                state = conn.execute(sa.select(T.c.state).where(T.c.name == name)).scalar()
            if state == TopicState.DELETED:
                raise AlreadyExistsError(
                    f"topic {name!r} was deleted; a deleted topic's name is not reused (its "
                    "ledgers, cuts and queued deletions keep naming it)"
                ) from exc
            raise AlreadyExistsError(f"topic {name!r} exists already") from exc

    def get_topic(self, name: str) -> Topic:
        with self.engine.connect() as conn:
            return self._topic(conn, name)

    def list_topics(self) -> list[Topic]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(T).order_by(T.c.name)).mappings()
            return [_topic_from_row(r) for r in rows]

    def set_policy(self, topic: Topic, policy: OffloadPolicy) -> Topic:
        with self.transaction() as conn:
            _cas(
                conn,
                T,
                T.c.name == topic.name,
                topic.version,
                f"topic {topic.name!r}",
                policy=policy.model_dump_json(),
            )
            return self._topic(conn, topic.name)

    def claim_writer(self, topic: str) -> Topic:
        """Take ownership of the topic's hot tail; an older writer's epoch stops working."""
        for _ in range(100):
            current = self.get_topic(topic)
            _refuse_deleted(current, "written to")
            try:
                with self.transaction() as conn:
                    _cas(
                        conn,
                        T,
                        T.c.name == topic,
                        current.version,
                        f"topic {topic!r}",
                        writer_epoch=current.writer_epoch + 1,
                    )
                    return self._topic(conn, topic)
            except CommitFailedError:
                continue
        raise CommitFailedError(f"could not claim the writer of topic {topic!r}")

    # --- ledgers -------------------------------------------------------------------------
    def allocate_ledger(self, topic: str, writer_epoch: int) -> Ledger:
        """A new open ledger; fails if ``writer_epoch`` no longer owns the topic."""
        with self.transaction() as conn:
            current = self._topic(conn, topic)
            _refuse_deleted(current, "written to")
            if current.writer_epoch != writer_epoch:
                raise CommitFailedError(
                    f"writer epoch {writer_epoch} of topic {topic!r} was fenced by "
                    f"epoch {current.writer_epoch}"
                )
            ledger_id = current.next_ledger_id
            _cas(
                conn,
                T,
                T.c.name == topic,
                current.version,
                f"topic {topic!r}",
                next_ledger_id=ledger_id + 1,
            )
            conn.execute(
                L.insert().values(
                    topic=topic,
                    ledger_id=ledger_id,
                    version=1,
                    state=LedgerState.OPEN,
                    entry_count=0,
                    size_bytes=0,
                    created_ms=db_now(),
                    offload_state=OffloadState.NONE,
                    offload_epoch=0,
                    hot_state=HotState.PRESENT,
                )
            )
            return self._ledger(conn, topic, ledger_id)

    def seal_ledger(
        self, ledger: Ledger, entry_count: int, size_bytes: int, writer_epoch: int | None
    ) -> Ledger:
        """Record the sealed length; ``writer_epoch`` None is recovery by a new owner."""
        with self.transaction() as conn:
            if writer_epoch is not None:
                owner = self._topic(conn, ledger.topic).writer_epoch
                if owner != writer_epoch:
                    raise CommitFailedError(
                        f"writer epoch {writer_epoch} of topic {ledger.topic!r} was fenced "
                        f"by epoch {owner}"
                    )
            _cas_ledger(
                conn,
                ledger,
                state=LedgerState.SEALED,
                entry_count=entry_count,
                size_bytes=size_bytes,
                sealed_ms=db_now(),
            )
            return self._ledger(conn, ledger.topic, ledger.ledger_id)

    def get_ledger(self, topic: str, ledger_id: int) -> Ledger:
        with self.engine.connect() as conn:
            return self._ledger(conn, topic, ledger_id)

    def list_ledgers(self, topic: str, *, live: bool = False) -> list[Ledger]:
        """The topic's ledgers by id; ``live``: only those at or above its start that no
        trim marked (selected in SQL, so trimmed history is never loaded)."""
        with self.engine.connect() as conn:
            current = self._topic(conn, topic)
            query = sa.select(L).where(L.c.topic == topic)
            if live:
                query = query.where(
                    L.c.ledger_id >= current.start_ledger_id,
                    L.c.deletion_state == DeletionState.NONE,
                )
            rows = conn.execute(query.order_by(L.c.ledger_id)).mappings()
            return [Ledger.model_validate(dict(r)) for r in rows]

    def ledgers_with_hot_copy(
        self,
        topic: str,
        *,
        offloaded: bool | None = None,
        created: tuple[int, int] | None = None,
    ) -> list[Ledger]:
        """The topic's live ledgers (at or above its start, not marked by a trim) whose hot
        copy is not deleted, optionally only offloaded or only not offloaded ones, oldest
        first. Planning and hot deletion look at no others, so they never load the topic's
        offloaded history (selected in SQL, as IN lists that ``ix_ledgers_hot`` serves).

        ``created`` (``[from_ms, to_ms)``) keeps only ledgers created in that window: a
        backfill of a past period reads that period's ledgers, not the topic's hot set.
        """
        hot = [s.value for s in HotState if s is not HotState.DELETED]
        where = [L.c.topic == topic, L.c.hot_state.in_(hot)]
        if offloaded is not None:
            states = [s.value for s in OffloadState if (s is OffloadState.OFFLOADED) == offloaded]
            where.append(L.c.offload_state.in_(states))
        if created is not None:
            where += [L.c.created_ms >= created[0], L.c.created_ms < created[1]]
        with self.engine.connect() as conn:
            current = self._topic(conn, topic)
            # what a trim removes takes retention's path, never the planner's or hot deletion's
            where += [
                L.c.ledger_id >= current.start_ledger_id,
                L.c.deletion_state == DeletionState.NONE,
            ]
            rows = conn.execute(sa.select(L).where(*where).order_by(L.c.ledger_id)).mappings()
            return [Ledger.model_validate(dict(r)) for r in rows]

    # --- object stores (invariant 7) -----------------------------------------------------
    def record_location(self, location: StoreLocation) -> int:
        """The id of ``location`` in the metadata, recorded on first use."""
        with self.transaction() as conn:
            return record_location(conn, location)

    def get_location(self, store_id: int) -> StoreLocation:
        with self.engine.connect() as conn:
            return load_location(conn, store_id)

    # --- offload attempts ----------------------------------------------------------------
    def begin_attempt(
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
        with self.transaction() as conn:
            _cas_ledger_if(
                conn,
                ledger,
                sa.and_(
                    L.c.deletion_state == DeletionState.NONE,
                    _lease_over() if ledger.attempt_id is not None else sa.true(),
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
                self._retire_attempt(
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
            return self._ledger(conn, ledger.topic, ledger.ledger_id), self._attempt(
                conn, attempt_id
            )

    def renew_lease(self, attempt: Attempt, lease_ms: int) -> bool:
        """Extend the attempt's lease (from the database's now); False once another
        attempt owns the ledger."""
        with self.transaction() as conn:
            result = conn.execute(
                L.update()
                .where(
                    _owned_by(attempt),
                )
                .values(attempt_lease_ms=db_now() + lease_ms)
            )
            return result.rowcount == 1

    def commit_offload(self, attempt: Attempt, data_len: int) -> Ledger:
        """Make ``attempt`` the ledger's offload, if the ledger still names it (CAS)."""
        with self.transaction() as conn:
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
            return self._ledger(conn, attempt.topic, attempt.ledger_id)

    def commit_replacement(
        self, attempt: Attempt, data_len: int, reason: str, *, grace_ms: int = 0
    ) -> Ledger:
        """Swap an offloaded ledger onto a replacement ``attempt`` (see ``begin_attempt``'s
        ``replace``), if the ledger still names it (CAS on its attempt, epoch and version).
        The ledger is then offloaded in mode ``ledger`` on the attempt's keys.

        In the same transaction the replaced objects are queued for deletion with
        ``reason``, due ``grace_ms`` later (a reader that looked them up before the swap
        still finds them), and the attempt that wrote them becomes ``superseded``, so the
        ledger keeps exactly one committed attempt and no object is left unaccounted for.
        A ledger that was offloaded in mode ``stream`` has no objects or attempt of its
        own: instead every segment holding it that no ledger needs any more is released
        (its keys queued, due ``grace_ms`` later: see ``SegmentStore.release_deleted``).
        """
        what = f"attempt {attempt.attempt_id} (epoch {attempt.epoch})"
        with self.transaction() as conn:
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
            _cas(conn, L, _owned_by(attempt), old.version, what, **_committed(attempt, data_len))
            failpoints.reach("mid-replacement-commit")
            if old.offload_mode is OffloadMode.STREAM:
                self.segments.release_moved(conn, old.topic, old.ledger_id, reason, grace_ms)
            else:
                self._supersede_replaced(conn, old, attempt, reason, grace_ms)
            conn.execute(
                A.update()
                .where(A.c.attempt_id == attempt.attempt_id)
                .values(state=AttemptState.COMMITTED, finished_ms=db_now())
            )
            return self._ledger(conn, attempt.topic, attempt.ledger_id)

    def _supersede_replaced(
        self, conn: Connection, old: Ledger, attempt: Attempt, reason: str, grace_ms: int
    ) -> None:
        """Queue the objects a replacement swapped out and supersede the attempt that wrote
        them (``commit_replacement`` of a ledger offloaded in mode ``ledger``)."""
        detail = f"replaced by {attempt.attempt_id}: {reason}"
        keys = [k for k in (old.data_key, old.index_key) if k is not None]
        self._enqueue(conn, keys, f"replaced: {reason}", old.offload_uuid, old.store_id, grace_ms)
        conn.execute(
            A.update()
            .where(A.c.attempt_id == old.offload_uuid, A.c.state == AttemptState.COMMITTED)
            .values(state=AttemptState.SUPERSEDED, detail=detail[:2000])
        )

    def fail_attempt(self, attempt: Attempt, detail: str) -> None:
        """Give up an attempt: queue its objects for deletion, free the ledger if still ours
        (a failed replacement leaves the ledger offloaded on the objects it had)."""
        offloading = L.c.offload_state == OffloadState.OFFLOADING
        with self.transaction() as conn:
            self._retire_attempt(
                conn, attempt.attempt_id, AttemptState.FAILED, detail, requeue_superseded=True
            )
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

    def get_attempt(self, attempt_id: str) -> Attempt:
        with self.engine.connect() as conn:
            return self._attempt(conn, attempt_id)

    # --- batched offload attempts (many ledgers of one topic, one transaction a step) ---
    def get_ledgers(self, topic: str, ledger_ids: Iterable[int]) -> dict[int, Ledger]:
        """Several ledgers of ``topic`` in one query; NotFoundError names any that is missing."""
        wanted = set(ledger_ids)
        with self.engine.connect() as conn:
            self._topic(conn, topic)
            rows = conn.execute(
                sa.select(L).where(L.c.topic == topic, L.c.ledger_id.in_(sorted(wanted)))
            ).mappings()
            found = {r["ledger_id"]: Ledger.model_validate(dict(r)) for r in rows}
        missing = sorted(wanted - found.keys())
        if missing:
            raise NotFoundError(f"ledgers {missing} of topic {topic!r} do not exist")
        return found

    def begin_attempts(
        self, intents: Sequence[AttemptIntent], owner: str, lease_ms: int, *, store_id: int
    ) -> dict[int, Attempt]:
        """Record the intents of many ledgers of one topic in one transaction, before any
        byte moves.

        Each ledger is still a compare-and-set on its own row: one UPDATE whose condition
        pairs every ledger with the version it was read at, so a ledger that moved since
        (or whose attempt in flight still holds its lease) is skipped and absent from the
        result while the others start. A stale attempt is superseded and its objects
        queued, as in :meth:`begin_attempt`. Whether a lease ran out is decided by the
        database's clock inside the UPDATE (invariant 6).
        """
        if not intents:
            return {}
        topic = _one_topic(i.ledger.topic for i in intents)
        free = {i.ledger.ledger_id: i for i in intents}
        by_ledger = L.c.ledger_id
        with self.transaction() as conn:
            now = db_now_ms(conn)  # the attempts' creation time; leases are decided in SQL
            updated = conn.execute(
                L.update()
                .where(
                    L.c.topic == topic,
                    sa.tuple_(L.c.ledger_id, L.c.version).in_(
                        [(n, i.ledger.version) for n, i in free.items()]
                    ),
                    sa.or_(L.c.attempt_id.is_(None), _lease_over()),
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
                    self._retire_attempt(
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

    def renew_leases(self, attempts: Iterable[Attempt], lease_ms: int) -> set[str]:
        """Extend many attempts' leases in one statement; the ids of those that lost."""
        attempts = list(attempts)
        if not attempts:
            return set()
        with self.transaction() as conn:
            renewed = conn.execute(
                L.update()
                .where(_owned_by_any(attempts))
                .values(attempt_lease_ms=db_now() + lease_ms)
                .returning(L.c.attempt_id)
            )
            alive = set(renewed.scalars())
        return {a.attempt_id for a in attempts} - alive

    def commit_offloads(self, finished: Sequence[tuple[Attempt, int]]) -> set[str]:
        """Commit many finished attempts of one topic in one transaction; the ids of those
        committed.

        One UPDATE whose condition pairs every ledger with its attempt id and epoch
        (invariants 2 and 6): an attempt that no longer owns its ledger is retired alone,
        its objects queued for deletion in this same transaction, and the others commit.
        """
        if not finished:
            return set()
        _one_topic(a.topic for a, _ in finished)  # before keying by ledger id: ids repeat
        attempts = {a.ledger_id: a for a, _ in finished}
        lengths = {a.ledger_id: n for a, n in finished}
        by_ledger = L.c.ledger_id
        with self.transaction() as conn:
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
                self._retire_attempt(
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

    def _retire_attempt(
        self,
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
            self._enqueue(
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
        self._enqueue(conn, keys, f"attempt {state}", attempt_id, row["store_id"])

    # --- hot copies (mark first, delete second) ------------------------------------------
    def mark_hot_deleting(self, ledger: Ledger, deletion_lag_ms: int = 0) -> Ledger:
        """Mark the hot copy for deletion: of an offloaded ledger once ``deletion_lag_ms``
        has passed since the commit on the database's clock (checked in the conditional
        update itself), or of a sealed empty ledger at once (nothing to offload)."""
        empty = ledger.state is LedgerState.SEALED and ledger.entry_count == 0
        if not (ledger.is_offloaded or empty):
            raise ValueError(
                f"ledger {ledger.topic}/{ledger.ledger_id} is not offloaded; its hot copy "
                "is the only one"
            )
        # a replacement in flight (scrub's repair) writes from the hot copy: it stays until
        # that attempt commits or its lease runs out (then the attempt is retired here)
        stale = ledger.attempt_id is not None
        refusal = (
            f"has replacement attempt {ledger.attempt_id} in flight until its lease ends, or "
            if stale
            else ""
        ) + (
            f"was offloaded less than its deletion lag of {deletion_lag_ms} ms ago "
            "(database clock); its hot copy stays"
        )
        with self.transaction() as conn:
            _cas_ledger_if(
                conn,
                ledger,
                sa.and_(
                    sa.true() if empty else L.c.offloaded_ms + deletion_lag_ms <= db_now(),
                    _lease_over() if stale else sa.true(),
                ),
                refusal,
                hot_state=HotState.DELETING,
                attempt_id=None,
                attempt_lease_ms=None,
            )
            if stale:
                assert ledger.attempt_id is not None
                self._retire_attempt(
                    conn,
                    ledger.attempt_id,
                    AttemptState.SUPERSEDED,
                    "lease expired; its ledger's hot copy is being deleted",
                )
            return self._ledger(conn, ledger.topic, ledger.ledger_id)

    def mark_hot_deleted(self, ledger: Ledger) -> Ledger:
        with self.transaction() as conn:
            _cas_ledger(
                conn,
                ledger,
                hot_state=HotState.DELETED,
                hot_deleted_ms=db_now(),
            )
            return self._ledger(conn, ledger.topic, ledger.ledger_id)

    # --- deletion queue ------------------------------------------------------------------
    def enqueue_deletions(
        self, keys: Iterable[str], reason: str, *, store_id: int, attempt_id: str | None = None
    ) -> None:
        """Queue ``keys`` of the store ``store_id`` (see record_location) for deletion."""
        with self.transaction() as conn:
            self._enqueue(conn, keys, reason, attempt_id, store_id)

    def due_deletions(self, limit: int, at_ms: int | None = None) -> list[Deletion]:
        """Pending deletions whose retry time has come: now on the database's clock, or
        ``at_ms`` when given. Read in the order of the index on (state, next_try_ms), so a
        batch costs ``limit`` rows however long the queue's history."""
        at = db_now() if at_ms is None else sa.literal(at_ms, sa.BigInteger)
        with self.engine.connect() as conn:
            rows = conn.execute(due_deletions_query(limit, at)).mappings()
            return [Deletion.model_validate(dict(r)) for r in rows]

    def complete_deletions(self, ids: Iterable[int]) -> None:
        ids = list(ids)
        if not ids:
            return
        with self.transaction() as conn:
            conn.execute(
                D.update()
                .where(D.c.id.in_(ids), D.c.state == "pending")
                .values(state="done", done_ms=db_now())
            )

    def retry_deletions_later(
        self, failures: Sequence[tuple[Deletion, str, int]], not_before_ms: int = 0
    ) -> None:
        """Record failed tries (row, error, delay in ms) in one transaction: each row's
        tries and last error, and its next try ``delay`` after the database's now but never
        before ``not_before_ms`` (a pass uses this so it does not retry a row it just tried).
        """
        if not failures:
            return
        next_try = db_now() + sa.bindparam("delay", type_=sa.BigInteger)
        floor = sa.literal(not_before_ms, sa.BigInteger)
        with self.transaction() as conn:
            conn.execute(
                D.update()
                .where(D.c.id == sa.bindparam("row_id"), D.c.state == "pending")
                .values(
                    tries=D.c.tries + 1,
                    last_error=sa.bindparam("error"),
                    next_try_ms=sa.case((next_try < floor, floor), else_=next_try),
                ),
                [
                    {"row_id": row.id, "error": error[:2000], "delay": delay}
                    for row, error, delay in failures
                ],
            )

    def count_pending_deletions(self) -> int:
        """How many keys the queue still holds (a COUNT, served by the index)."""
        with self.engine.connect() as conn:
            query = sa.select(sa.func.count()).select_from(D).where(D.c.state == "pending")
            return int(conn.execute(query).scalar_one())

    def deletion_backlog(self, failing_tries: int, failing_shown: int = 20) -> DeletionBacklog:
        """The queue's backlog, oldest item (age on the database's clock) and the items
        that keep failing (``tries >= failing_tries``, at most ``failing_shown`` listed)."""
        pending = D.c.state == "pending"
        failing = sa.and_(pending, D.c.tries >= failing_tries)
        with self.engine.connect() as conn:
            now = db_now_ms(conn)
            counts = conn.execute(
                sa.select(
                    sa.func.count(),
                    sa.func.count().filter(D.c.next_try_ms <= now),
                    sa.func.count().filter(D.c.tries >= failing_tries),
                    sa.func.min(D.c.enqueued_ms),
                ).where(pending)
            ).one()
            rows = conn.execute(
                sa.select(D).where(failing).order_by(D.c.tries.desc(), D.c.id).limit(failing_shown)
            ).mappings()
            shown = [Deletion.model_validate(dict(r)) for r in rows]
        oldest = counts[3]
        return DeletionBacklog(
            pending=counts[0],
            due=counts[1],
            oldest_enqueued_ms=oldest,
            oldest_age_ms=None if oldest is None else max(0, now - oldest),
            failing_tries=failing_tries,
            failing_count=counts[2],
            failing=shown,
        )

    def _enqueue(
        self,
        conn: Connection,
        keys: Iterable[str],
        reason: str,
        attempt_id: str | None,
        store_id: int | None,
        delay_ms: int = 0,
    ) -> None:
        """Queue ``keys`` for deletion, due ``delay_ms`` after the database's now."""
        rows = [
            dict(
                object_key=k,
                reason=reason[:255],
                attempt_id=attempt_id,
                state="pending",
                tries=0,
                store_id=store_id,
            )
            for k in keys
        ]
        self._queue_rows(conn, rows, delay_ms)

    @staticmethod
    def _queue_rows(conn: Connection, rows: list[dict[str, object]], delay_ms: int) -> None:
        """Insert deletion rows due ``delay_ms`` after the database's now, read once: two
        readings of PostgreSQL's clock_timestamp() in one row can differ by a millisecond."""
        if rows:
            now = db_now_ms(conn)
            conn.execute(D.insert().values(enqueued_ms=now, next_try_ms=now + delay_ms), rows)

    # --- retention: stream cuts, the topic's start, ledger deletion -------------------
    def create_cut(self, topic: str) -> StreamCut:
        """A cut at the current end of the topic's sealed data (the open ledger's entries
        have no recorded length yet), taken at the database's now, with the bytes of every
        ledger below it, deleted ones included (their rows stay). The bytes are the
        previous cut's plus those of the ledgers sealed since, so the cost follows what
        is new, not the topic's history."""
        with self.transaction() as conn:
            current = self._topic(conn, topic)
            _refuse_deleted(current, "cut")
            end, offset = _end_and_offset(conn, current)
            cut_id = conn.execute(
                C.insert()
                .values(
                    topic=topic,
                    ledger_id=end.ledger_id,
                    entry_id=end.entry_id,
                    created_ms=db_now(),
                    offset_bytes=int(offset),
                )
                .returning(C.c.cut_id)
            ).scalar_one()
            return self._cut(conn, topic, cut_id)

    def end_cut(self, topic: str) -> StreamCut:
        """The cut :meth:`create_cut` would take now, not stored (``cut_id`` 0): what a
        dry run of retention measures against."""
        with self.engine.connect() as conn:
            current = self._topic(conn, topic)
            _refuse_deleted(current, "cut")
            end, offset = _end_and_offset(conn, current)
            return StreamCut(
                topic=topic,
                cut_id=0,
                ledger_id=end.ledger_id,
                entry_id=end.entry_id,
                created_ms=db_now_ms(conn),
                offset_bytes=offset,
            )

    def newest_cut(self, topic: str, field: str, at_most: int) -> StreamCut | None:
        """The topic's newest cut whose ``field`` (``created_ms`` or ``offset_bytes``) is
        at most ``at_most`` (retention's rules). Cuts of a topic grow in id, time, offset
        and position together, so this walks the topic's cut index back from the newest
        and stops at the first match: it reads the cuts newer than the bound, not the
        topic's history."""
        if field not in ("created_ms", "offset_bytes"):
            raise ValueError(f"cuts are selected by created_ms or offset_bytes, not {field!r}")
        with self.engine.connect() as conn:
            return _newest_cut(conn, topic, C.c[field] <= at_most)

    def list_cuts(self, topic: str) -> list[StreamCut]:
        """The topic's cuts, oldest first."""
        with self.engine.connect() as conn:
            self._topic(conn, topic)
            rows = conn.execute(
                sa.select(C).where(C.c.topic == topic).order_by(C.c.cut_id)
            ).mappings()
            return [StreamCut.model_validate(dict(r)) for r in rows]

    def get_cut(self, topic: str, cut_id: int) -> StreamCut:
        with self.engine.connect() as conn:
            self._topic(conn, topic)
            return self._cut(conn, topic, cut_id)

    def end_of_sealed(self, topic: str) -> Position:
        """The position just past the topic's last sealed entry (see create_cut)."""
        with self.engine.connect() as conn:
            return _end_of_sealed(conn, self._topic(conn, topic))

    def move_start(self, topic: Topic, position: Position) -> Topic:
        """Move the topic's start to ``position`` by CAS on the version ``topic`` was read
        at: reads below it fail from this commit on (invariant 4). Only forward."""
        if position <= topic.start:
            raise ValueError(f"start {topic.start} of topic {topic.name!r} only moves forward")
        return self._cas_active_topic(
            topic, start_ledger_id=position.ledger_id, start_entry_id=position.entry_id
        )

    def delete_topic(self, topic: Topic) -> Topic:
        """Mark the topic deleted by CAS: its start moves past every ledger (open ones
        too) and its writer epoch moves on, so a live writer is fenced."""
        return self._cas_active_topic(
            topic,
            state=TopicState.DELETED,
            deleted_ms=db_now(),
            writer_epoch=T.c.writer_epoch + 1,
            start_ledger_id=T.c.next_ledger_id,
            start_entry_id=0,
        )

    def _cas_active_topic(self, topic: Topic, **values: object) -> Topic:
        """CAS on a topic that must still be active (a deleted topic never changes)."""
        with self.transaction() as conn:
            where = sa.and_(T.c.name == topic.name, T.c.state == TopicState.ACTIVE)
            _cas(conn, T, where, topic.version, f"topic {topic.name!r}", **values)
            return self._topic(conn, topic.name)

    def ledgers_to_trim(self, topic: str, below: int) -> list[int]:
        """Ids of the live ledgers below ``below`` (what a trim there would mark)."""
        query = sa.select(L.c.ledger_id).where(_unmarked_below(topic, below))
        with self.engine.connect() as conn:
            return list(conn.execute(query.order_by(L.c.ledger_id)).scalars())

    def count_keys_to_trim(self, topic: str, below: int) -> int:
        """How many object keys a trim below ``below`` would queue (committed and in flight)."""
        with self.engine.connect() as conn:
            return 2 * int(
                conn.execute(
                    sa.select(
                        sa.func.count(L.c.offload_uuid) + sa.func.count(L.c.attempt_id)
                    ).where(_unmarked_below(topic, below))
                ).scalar_one()
            )

    def mark_ledgers_deleting(self, topic: str, below: int, limit: int) -> tuple[list[int], int]:
        """Mark up to ``limit`` live ledgers below ``below`` as deleting, in one transaction
        with their intent: committed objects and any attempt in flight queued for deletion
        (its attempt superseded, so a zombie that wrote late requeues its keys), hot copies
        marked deleting (mark first). Set-based: a few statements, whatever the count.
        Returns (marked ledger ids, keys queued)."""
        with self.transaction() as conn:
            last = conn.execute(
                sa.select(sa.func.max(sa.literal_column("ledger_id"))).select_from(
                    sa.select(L.c.ledger_id)
                    .where(_unmarked_below(topic, below))
                    .order_by(L.c.ledger_id)
                    .limit(limit)
                    .subquery()
                )
            ).scalar()
            if last is None:
                return [], 0
            hot = sa.case(
                (L.c.hot_state == HotState.PRESENT, HotState.DELETING), else_=L.c.hot_state
            )
            ids = sorted(
                conn.execute(
                    L.update()
                    .where(_unmarked_below(topic, last + 1))
                    .values(
                        version=L.c.version + 1,
                        deletion_state=DeletionState.DELETING,
                        deleting_ms=db_now(),
                        hot_state=hot,
                    )
                    .returning(L.c.ledger_id)
                ).scalars()
            )
            chunk = sa.and_(L.c.topic == topic, L.c.ledger_id.in_(ids))
            in_flight = sa.and_(
                chunk, A.c.attempt_id == L.c.attempt_id, A.c.state == AttemptState.STARTED
            )
            # (reason, the two keys, attempt, store, which rows): committed objects and
            # those of an attempt in flight, each queued with its store and its ledger
            sources = (
                (
                    "ledger trimmed",
                    L,
                    L.c.offload_uuid,
                    sa.and_(chunk, L.c.offload_uuid.is_not(None)),
                ),
                ("attempt of a trimmed ledger", A, A.c.attempt_id, in_flight),
            )
            queued = 0
            for reason, table, attempt, where in sources:
                for key in (table.c.data_key, table.c.index_key):
                    columns = (key, sa.literal(reason), attempt, table.c.store_id)
                    selected = sa.select(*columns, L.c.topic, L.c.ledger_id).where(where)
                    queued += self._enqueue_select(conn, selected)
            conn.execute(
                A.update()
                .where(
                    A.c.attempt_id.in_(sa.select(L.c.attempt_id).where(chunk)),
                    A.c.state == AttemptState.STARTED,
                )
                .values(
                    state=AttemptState.SUPERSEDED,
                    finished_ms=db_now(),
                    detail="its ledger was trimmed",
                )
            )
            offloading = L.c.offload_state == OffloadState.OFFLOADING
            conn.execute(
                L.update()
                .where(chunk, L.c.attempt_id.is_not(None))
                .values(
                    attempt_id=None,
                    attempt_lease_ms=None,
                    offload_state=sa.case((offloading, OffloadState.NONE), else_=L.c.offload_state),
                )
            )
            return ids, queued

    def hot_copies_of_deleting(self, limit: int, topic: str | None = None) -> list[Ledger]:
        """Deleting ledgers whose hot copy is marked but not yet gone."""
        query = sa.select(L).where(
            L.c.deletion_state == DeletionState.DELETING, L.c.hot_state == HotState.DELETING
        )
        if topic is not None:
            query = query.where(L.c.topic == topic)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(L.c.topic, L.c.ledger_id).limit(limit)).mappings()
            return [Ledger.model_validate(dict(r)) for r in rows]

    def mark_hot_copies_deleted(self, topic: str, ledger_ids: Iterable[int]) -> None:
        """Second step of mark-first for trimmed ledgers whose hot files are gone."""
        ids = sorted(ledger_ids)
        if not ids:
            return
        with self.transaction() as conn:
            conn.execute(
                L.update()
                .where(
                    L.c.topic == topic,
                    L.c.ledger_id.in_(ids),
                    L.c.hot_state == HotState.DELETING,
                    L.c.deletion_state == DeletionState.DELETING,
                )
                .values(
                    version=L.c.version + 1, hot_state=HotState.DELETED, hot_deleted_ms=db_now()
                )
            )

    def topics_with_unmarked_ledgers(self) -> list[Topic]:
        """Topics whose start moved past ledgers not yet marked (a trim cut short)."""
        below = (
            sa.select(L.c.ledger_id)
            .where(
                L.c.topic == T.c.name,
                L.c.ledger_id < T.c.start_ledger_id,
                L.c.deletion_state == DeletionState.NONE,
            )
            .exists()
        )
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(T).where(below).order_by(T.c.name)).mappings()
            return [_topic_from_row(r) for r in rows]

    def finish_deleted_ledgers(self, grace_ms: int = 0) -> int:
        """Deleting ledgers whose hot copy is gone and whose queued keys are all done become
        ``deleted``; how many did. Segments no ledger needs any more are released in the
        same transaction (``grace_ms``: see ``SegmentStore.release_deleted``)."""
        pending = (
            sa.select(D.c.id)
            .where(D.c.topic == L.c.topic, D.c.ledger_id == L.c.ledger_id, D.c.state == "pending")
            .exists()
        )
        with self.transaction() as conn:
            result = conn.execute(
                L.update()
                .where(
                    L.c.deletion_state == DeletionState.DELETING,
                    L.c.hot_state == HotState.DELETED,
                    ~pending,
                )
                .values(
                    version=L.c.version + 1,
                    deletion_state=DeletionState.DELETED,
                    deleted_ms=db_now(),
                )
                .returning(L.c.topic, L.c.ledger_id)
            )
            deleted = [(topic, ledger_id) for topic, ledger_id in result.all()]
            # streamed ledgers own no objects: a segment goes once no ledger in it needs it,
            # every one deleted (PIP-76) or moved to objects of its own
            if deleted:
                topics = {topic for topic, _ in deleted}
                self.segments.release_deleted(conn, topics, grace_ms, changed=deleted)
            return len(deleted)

    def _enqueue_select(self, conn: Connection, rows: sa.Select) -> int:  # type: ignore[type-arg]
        """Queue the keys a SELECT yields as (key, reason, attempt id, store, topic, ledger)."""
        columns = ["object_key", "reason", "attempt_id", "store_id", "topic", "ledger_id"]
        source = rows.add_columns(sa.literal("pending"), sa.literal(0), db_now(), db_now())
        columns += ["state", "tries", "enqueued_ms", "next_try_ms"]
        return int(conn.execute(D.insert().from_select(columns, source)).rowcount)

    def _cut(self, conn: Connection, topic: str, cut_id: int) -> StreamCut:
        # cut ids are a 32-bit column: a larger one cannot exist (and PostgreSQL would
        # refuse to compare it)
        row = (
            conn.execute(sa.select(C).where(C.c.topic == topic, C.c.cut_id == cut_id))
            .mappings()
            .first()
            if 0 <= cut_id < 2**31
            else None
        )
        if row is None:
            raise NotFoundError(f"cut {cut_id} of topic {topic!r} does not exist")
        return StreamCut.model_validate(dict(row))

    # --- status --------------------------------------------------------------------------
    def counts(self) -> dict[str, object]:
        with self.engine.connect() as conn:

            def grouped(*cols: sa.Column) -> dict[str, int]:
                query = sa.select(*cols, sa.func.count()).group_by(*cols)
                return {"/".join(str(v) for v in row[:-1]): row[-1] for row in conn.execute(query)}

            oldest = conn.execute(
                sa.select(sa.func.min(D.c.enqueued_ms)).where(D.c.state == "pending")
            ).scalar()
            return {
                "topics": conn.execute(sa.select(sa.func.count()).select_from(T)).scalar(),
                "ledgers_by_state": grouped(L.c.state, L.c.offload_state, L.c.hot_state),
                "attempts_by_state": grouped(A.c.state),
                "deletions_by_state": grouped(D.c.state),
                "oldest_pending_deletion_ms": oldest,
                # streaming segments (PIP-76); streamed ledgers are in ledgers_by_state as
                # offloaded, like the ones offloaded ledger by ledger
                "segments_by_state": grouped(schema.segments.c.state),
                # who wrote them: the stream, or a rewrite (compaction, format migration)
                "segments_by_origin": grouped(schema.segments.c.origin, schema.segments.c.state),
            }

    # --- row helpers ---------------------------------------------------------------------
    def _topic(self, conn: Connection, name: str) -> Topic:
        row = conn.execute(sa.select(T).where(T.c.name == name)).mappings().first()
        if row is None:
            raise NotFoundError(f"topic {name!r} does not exist")
        return _topic_from_row(row)

    def _ledger(self, conn: Connection, topic: str, ledger_id: int) -> Ledger:
        row = conn.execute(sa.select(L).where(_ledger_key(topic, ledger_id))).mappings().first()
        if row is None:
            raise NotFoundError(f"ledger {ledger_id} of topic {topic!r} does not exist")
        return Ledger.model_validate(dict(row))

    def _attempt(self, conn: Connection, attempt_id: str) -> Attempt:
        row = conn.execute(sa.select(A).where(A.c.attempt_id == attempt_id)).mappings().first()
        if row is None:
            raise NotFoundError(f"offload attempt {attempt_id} does not exist")
        return Attempt.model_validate(dict(row))


def due_deletions_query(limit: int, at: sa.ColumnElement[int]) -> sa.Select[tuple[object, ...]]:
    """Due rows in index order (state, next_try_ms): no sort, no scan of done rows."""
    return (
        sa.select(D)
        .where(D.c.state == "pending", D.c.next_try_ms <= at)
        .order_by(D.c.next_try_ms)
        .limit(limit)
    )


def _ledger_key(topic: str, ledger_id: int) -> sa.ColumnElement[bool]:
    return sa.and_(L.c.topic == topic, L.c.ledger_id == ledger_id)


def _unmarked_below(topic: str, below: int) -> sa.ColumnElement[bool]:
    """Live ledgers of ``topic`` with an id below ``below``: a range of the primary key."""
    return sa.and_(
        L.c.topic == topic, L.c.ledger_id < below, L.c.deletion_state == DeletionState.NONE
    )


def _lease_over() -> sa.ColumnElement[bool]:
    """The attempt's lease has run out by the database's clock (invariant 6)."""
    return sa.or_(L.c.attempt_lease_ms.is_(None), L.c.attempt_lease_ms <= db_now())


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
        _ledger_key(attempt.topic, attempt.ledger_id),
        L.c.attempt_id == attempt.attempt_id,
        L.c.offload_epoch == attempt.epoch,
        L.c.deletion_state == DeletionState.NONE,  # a trimmed ledger takes no commit
    )


def _owned_by_any(attempts: Iterable[Attempt]) -> sa.ColumnElement[bool]:
    """:func:`_owned_by` for many attempts of one topic, as one condition."""
    attempts = list(attempts)
    return sa.and_(
        L.c.topic == _one_topic(a.topic for a in attempts),
        sa.tuple_(L.c.ledger_id, L.c.attempt_id, L.c.offload_epoch).in_(
            [(a.ledger_id, a.attempt_id, a.epoch) for a in attempts]
        ),
        L.c.deletion_state == DeletionState.NONE,
    )


def _one_topic(topics: Iterable[str]) -> str:
    names = set(topics)
    if len(names) != 1:
        raise ValueError(f"a batch belongs to exactly one topic, got {sorted(names)}")
    return names.pop()


def _refuse_deleted(topic: Topic, what: str) -> None:
    if topic.is_deleted:
        raise TopicDeletedError(f"topic {topic.name!r} was deleted; it cannot be {what}")


def _end_and_offset(conn: Connection, topic: Topic) -> tuple[Position, int]:
    """The end of the topic's sealed data and its committed bytes from the first entry
    (each ledger's recorded size once; nothing of an upload in flight).

    Incremental from the topic's newest cut: every ledger below a cut was sealed when it
    was taken, and sealed sizes never change, so only the ledgers since then are summed
    and the cost does not grow with the topic's history."""
    newest = _newest_cut(conn, topic.name)
    since, base = (0, 0) if newest is None else (newest.ledger_id, newest.offset_bytes)
    end = _end_of_sealed(conn, topic)
    offset = conn.execute(
        sa.select(sa.func.coalesce(sa.func.sum(L.c.size_bytes), 0)).where(
            L.c.topic == topic.name, L.c.ledger_id >= since, L.c.ledger_id < end.ledger_id
        )
    ).scalar_one()
    return end, base + int(offset)


def _newest_cut(
    conn: Connection, topic: str, *conditions: sa.ColumnElement[bool]
) -> StreamCut | None:
    """The topic's newest cut meeting ``conditions``, walking its cut index back."""
    query = sa.select(C).where(C.c.topic == topic, *conditions)
    row = conn.execute(query.order_by(C.c.cut_id.desc()).limit(1)).mappings().first()
    return None if row is None else StreamCut.model_validate(dict(row))


def _end_of_sealed(conn: Connection, topic: Topic) -> Position:
    """Where the topic's sealed data ends: the first open ledger at entry 0, or the next
    ledger id to be allocated. Every ledger below it is sealed, its length recorded."""
    first_open = conn.execute(
        sa.select(sa.func.min(L.c.ledger_id)).where(
            L.c.topic == topic.name, L.c.state == LedgerState.OPEN
        )
    ).scalar()
    end = topic.next_ledger_id if first_open is None else first_open
    return Position(ledger_id=end, entry_id=0)


def _topic_from_row(row: sa.RowMapping) -> Topic:
    data = dict(row)
    data["policy"] = OffloadPolicy.model_validate(json.loads(data["policy"]))
    return Topic.model_validate(data)

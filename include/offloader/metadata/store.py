"""The metadata store: every state change is a compare-and-set on a version, in one transaction.

SQLite (the embedded default) and PostgreSQL behave the same here: writes on SQLite take
the database lock at BEGIN (``BEGIN IMMEDIATE``) so concurrent writers queue instead of
failing, and CAS is ``UPDATE ... WHERE version = :expected`` with the row count checked.
Every timestamp written and every lease or age compared is the database's clock
(``clock.db_now()``), evaluated in the statement itself. Creates rely on the primary key,
not on a check before the insert: a racing duplicate becomes ``AlreadyExistsError``.

:class:`MetadataStore` is the facade: the engine and its transactions (metadata/engine.py),
topics, ledgers and the marks of their hot copies, the store locations they name
(metadata/locations.py), the totals people look at (metadata/totals.py) and the questions
the orphan sweep asks. Each further concern is a store of its own that it hands out,
sharing its engine:

- ``attempts``: offload attempts, one ledger or a batch (metadata/attempts.py);
- ``deletions``: the deletion queue (metadata/deletions.py);
- ``retention``: cuts, the topic's start, topic and ledger deletion (metadata/retention.py);
- ``segments``: streaming offload's segments (metadata/segments.py, metadata/streams.py);
- ``rewrites``: compaction's and format migration's segments (metadata/rewrites.py);
- ``observations``: the tier metrics' figures, a few aggregates (metadata/observations.py).

The helpers they share (the CAS itself, reading a row) are in metadata/_rows.py; a ledger's
pieces in segments, and the settling and release that follow from them, in
metadata/pieces.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from offloader.exceptions import AlreadyExistsError, CommitFailedError, NotFoundError
from offloader.metadata import schema, totals
from offloader.metadata._rows import (
    cas,
    cas_ledger,
    cas_ledger_if,
    lease_over,
    read_ledger,
    read_topic,
    refuse_deleted,
    topic_from_row,
)
from offloader.metadata.attempts import AttemptStore, retire
from offloader.metadata.clock import db_now
from offloader.metadata.clock import now_ms as now_ms  # re-exported: the worker's clock
from offloader.metadata.deletions import DeletionQueue
from offloader.metadata.engine import Database, DatabaseDeadlines, create_metadata_engine
from offloader.metadata.locations import (
    StoreUsage,
    list_locations,
    load_location,
    record_location,
    retire_location,
    store_usage,
)
from offloader.metadata.migrate import check_revision
from offloader.metadata.observations import ObservationStore
from offloader.metadata.records import (
    AttemptState,
    DeletionState,
    HotState,
    Ledger,
    LedgerState,
    OffloadState,
    SegmentState,
    Topic,
    TopicState,
    TopicTiers,
)
from offloader.metadata.retention import RetentionStore
from offloader.metadata.rewrites import RewriteStore
from offloader.metadata.segments import OPEN_STATES, SegmentStore
from offloader.objectstore.location import StoreLocation
from offloader.policy import OffloadPolicy

T, L, A, D = schema.topics, schema.ledgers, schema.offload_attempts, schema.deletion_queue
G = schema.segments
# segments whose keys are references: failed, replaced and deleted ones queued theirs
REFERENCING_SEGMENTS = (SegmentState.ASSIGNED, SegmentState.CLOSING, SegmentState.OFFLOADED)


class MetadataStore(Database):
    """Topics, ledgers and their store locations; every other concern is a sub-store."""

    @classmethod
    def open(cls, url: str, deadlines: DatabaseDeadlines | None = None) -> MetadataStore:
        """Open a database at the head revision; SchemaOutOfDateError otherwise."""
        engine = create_metadata_engine(url, deadlines)
        try:
            check_revision(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    # --- the sub-stores ------------------------------------------------------------------
    @cached_property
    def attempts(self) -> AttemptStore:
        """Offload attempts, one ledger or a batch (metadata/attempts.py)."""
        return AttemptStore(self)

    @cached_property
    def deletions(self) -> DeletionQueue:
        """The deletion queue (metadata/deletions.py)."""
        return DeletionQueue(self)

    @cached_property
    def retention(self) -> RetentionStore:
        """Cuts, the topic's start, topic and ledger deletion (metadata/retention.py)."""
        return RetentionStore(self)

    @cached_property
    def segments(self) -> SegmentStore:
        """Streaming offload's streams, segments and parts (metadata/segments.py)."""
        return SegmentStore(self)

    @cached_property
    def rewrites(self) -> RewriteStore:
        """Compaction's and format migration's rewrite segments (metadata/rewrites.py)."""
        return RewriteStore(self)

    @cached_property
    def observations(self) -> ObservationStore:
        """The tier metrics' figures, a few aggregate reads (metadata/observations.py)."""
        return ObservationStore(self)

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
                return read_topic(conn, name)
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
            return read_topic(conn, name)

    def list_topics(self) -> list[Topic]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(T).order_by(T.c.name)).mappings()
            return [topic_from_row(r) for r in rows]

    def set_policy(self, topic: Topic, policy: OffloadPolicy) -> Topic:
        with self.transaction() as conn:
            cas(
                conn,
                T,
                T.c.name == topic.name,
                topic.version,
                f"topic {topic.name!r}",
                policy=policy.model_dump_json(),
            )
            return read_topic(conn, topic.name)

    def claim_writer(self, topic: str) -> Topic:
        """Take ownership of the topic's hot tail; an older writer's epoch stops working."""
        for _ in range(100):
            current = self.get_topic(topic)
            refuse_deleted(current, "written to")
            try:
                with self.transaction() as conn:
                    cas(
                        conn,
                        T,
                        T.c.name == topic,
                        current.version,
                        f"topic {topic!r}",
                        writer_epoch=current.writer_epoch + 1,
                    )
                    return read_topic(conn, topic)
            except CommitFailedError:
                continue
        raise CommitFailedError(f"could not claim the writer of topic {topic!r}")

    # --- ledgers -------------------------------------------------------------------------
    def allocate_ledger(self, topic: str, writer_epoch: int) -> Ledger:
        """A new open ledger; fails if ``writer_epoch`` no longer owns the topic."""
        with self.transaction() as conn:
            current = read_topic(conn, topic)
            refuse_deleted(current, "written to")
            _check_writer(current, writer_epoch)
            ledger_id = current.next_ledger_id
            cas(
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
            return read_ledger(conn, topic, ledger_id)

    def seal_ledger(
        self, ledger: Ledger, entry_count: int, size_bytes: int, writer_epoch: int | None
    ) -> Ledger:
        """Record the sealed length; ``writer_epoch`` None is recovery by a new owner."""
        with self.transaction() as conn:
            if writer_epoch is not None:
                _check_writer(read_topic(conn, ledger.topic), writer_epoch)
            cas_ledger(
                conn,
                ledger,
                state=LedgerState.SEALED,
                entry_count=entry_count,
                size_bytes=size_bytes,
                sealed_ms=db_now(),
            )
            return read_ledger(conn, ledger.topic, ledger.ledger_id)

    def get_ledger(self, topic: str, ledger_id: int) -> Ledger:
        with self.engine.connect() as conn:
            return read_ledger(conn, topic, ledger_id)

    def get_ledgers(self, topic: str, ledger_ids: Iterable[int]) -> dict[int, Ledger]:
        """Several ledgers of ``topic`` in one query; NotFoundError names any that is missing."""
        wanted = set(ledger_ids)
        with self.engine.connect() as conn:
            read_topic(conn, topic)
            rows = conn.execute(
                sa.select(L).where(L.c.topic == topic, L.c.ledger_id.in_(sorted(wanted)))
            ).mappings()
            found = {r["ledger_id"]: Ledger.model_validate(dict(r)) for r in rows}
        missing = sorted(wanted - found.keys())
        if missing:
            raise NotFoundError(f"ledgers {missing} of topic {topic!r} do not exist")
        return found

    def list_ledgers(self, topic: str, *, live: bool = False) -> list[Ledger]:
        """The topic's ledgers by id; ``live``: only those at or above its start that no
        trim marked (selected in SQL, so trimmed history is never loaded)."""
        with self.engine.connect() as conn:
            current = read_topic(conn, topic)
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
            current = read_topic(conn, topic)
            # what a trim removes takes retention's path, never the planner's or hot deletion's
            where += [
                L.c.ledger_id >= current.start_ledger_id,
                L.c.deletion_state == DeletionState.NONE,
            ]
            rows = conn.execute(sa.select(L).where(*where).order_by(L.c.ledger_id)).mappings()
            return [Ledger.model_validate(dict(r)) for r in rows]

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
            cas_ledger_if(
                conn,
                ledger,
                sa.and_(
                    sa.true() if empty else L.c.offloaded_ms + deletion_lag_ms <= db_now(),
                    lease_over() if stale else sa.true(),
                ),
                refusal,
                hot_state=HotState.DELETING,
                attempt_id=None,
                attempt_lease_ms=None,
            )
            if stale:
                assert ledger.attempt_id is not None
                retire(
                    conn,
                    ledger.attempt_id,
                    AttemptState.SUPERSEDED,
                    "lease expired; its ledger's hot copy is being deleted",
                )
            return read_ledger(conn, ledger.topic, ledger.ledger_id)

    def mark_hot_deleted(self, ledger: Ledger) -> Ledger:
        with self.transaction() as conn:
            cas_ledger(
                conn,
                ledger,
                hot_state=HotState.DELETED,
                hot_deleted_ms=db_now(),
            )
            return read_ledger(conn, ledger.topic, ledger.ledger_id)

    # --- recorded store locations (invariant 7) ------------------------------------------
    def record_location(self, location: StoreLocation) -> int:
        """The id of ``location`` in the metadata, recorded on first use."""
        with self.transaction() as conn:
            return record_location(conn, location)

    def get_location(self, store_id: int) -> StoreLocation:
        with self.engine.connect() as conn:
            return load_location(conn, store_id)

    def get_locations(self, store_ids: Iterable[int]) -> list[StoreLocation]:
        """The distinct locations of ``store_ids``, by URL: where a task's data went."""
        with self.engine.connect() as conn:
            found = {load_location(conn, i) for i in set(store_ids)}
        return sorted(found, key=str)

    def list_locations(self) -> list[tuple[int, StoreLocation]]:
        """Every recorded store location not retired, by id: what the orphan sweep walks."""
        with self.engine.connect() as conn:
            return list_locations(conn)

    def store_usage(self) -> list[StoreUsage]:
        """Every recorded store, retired ones too, with the counts of what names it."""
        with self.engine.connect() as conn:
            return store_usage(conn)

    def retire_store(self, store_id: int) -> int:
        """Retire a store no committed data names; its queued deletions dropped (how many).
        The check and the change are one transaction."""
        with self.transaction() as conn:
            return retire_location(conn, store_id)

    # --- for people: totals, each topic's tiers, the tiers' history (metadata/totals.py) --
    def counts(self) -> dict[str, object]:
        """Rows by state, table by table, and the oldest pending deletion."""
        with self.engine.connect() as conn:
            return totals.counts(conn)

    def topic_tiers(self) -> list[TopicTiers]:
        """Per topic (deleted ones too) its bytes and ledgers in each tier, and its
        pending deletions."""
        with self.engine.connect() as conn:
            return totals.topic_tiers(conn)

    def tier_changes(self) -> list[tuple[int, int, int]]:
        """Every change of bytes per tier as (at_ms, hot delta, offloaded delta)."""
        with self.engine.connect() as conn:
            return totals.tier_changes(conn)

    def lag_changes(self) -> list[tuple[int, int, int]]:
        """Every change of the lags as (at_ms, offload lag bytes delta, backlog delta)."""
        with self.engine.connect() as conn:
            return totals.lag_changes(conn)

    # --- for the orphan sweep ------------------------------------------------------------
    def referenced_keys(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` the metadata references, in one statement: a ledger's data or
        index key; an attempt's while it is started or committed; a segment's while it is
        assigned, closing or offloaded, whoever wrote it; a pending deletion's. Keys of
        failed and superseded attempts, and of failed, replaced and deleted segments, are
        not references: those queued their keys (gc/sweep.py's module doc says why)."""
        keys = list(keys)
        if not keys:
            return set()
        kept = (AttemptState.STARTED, AttemptState.COMMITTED)
        segments = [s.value for s in REFERENCING_SEGMENTS]
        query = sa.union_all(
            sa.select(L.c.data_key.label("k")).where(L.c.data_key.in_(keys)),
            sa.select(L.c.index_key).where(L.c.index_key.in_(keys)),
            sa.select(A.c.data_key).where(A.c.data_key.in_(keys), A.c.state.in_(kept)),
            sa.select(A.c.index_key).where(A.c.index_key.in_(keys), A.c.state.in_(kept)),
            sa.select(G.c.data_key).where(G.c.data_key.in_(keys), G.c.state.in_(segments)),
            sa.select(G.c.index_key).where(G.c.index_key.in_(keys), G.c.state.in_(segments)),
            sa.select(D.c.object_key).where(D.c.object_key.in_(keys), D.c.state == "pending"),
        )
        with self.engine.connect() as conn:
            return set(conn.execute(query).scalars())

    def live_attempt_keys(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` belong to a live attempt: started, still named by its ledger, and
        its lease not over on the database's clock (invariant 6)."""
        keys = list(keys)
        if not keys:
            return set()
        live = sa.and_(
            A.c.state == AttemptState.STARTED,
            L.c.attempt_id == A.c.attempt_id,
            L.c.attempt_lease_ms > db_now(),
        )
        joined = A.join(L, sa.and_(L.c.topic == A.c.topic, L.c.ledger_id == A.c.ledger_id))
        selected = sa.select(A.c.data_key.label("k")).select_from(joined)
        query = sa.union_all(
            selected.where(live, A.c.data_key.in_(keys)),
            sa.select(A.c.index_key).select_from(joined).where(live, A.c.index_key.in_(keys)),
        )
        with self.engine.connect() as conn:
            return set(conn.execute(query).scalars())

    def open_segment_uploads(self, keys: Iterable[str]) -> set[tuple[str, str]]:
        """(data key, upload id) of the assigned or closing segments among ``keys``: the
        multipart uploads a streaming pass still adds parts to or completes."""
        keys = list(keys)
        if not keys:
            return set()
        query = sa.select(G.c.data_key, G.c.upload_id).where(
            G.c.data_key.in_(keys), G.c.state.in_(OPEN_STATES), G.c.upload_id.is_not(None)
        )
        with self.engine.connect() as conn:
            return {(key, upload_id) for key, upload_id in conn.execute(query)}


def _check_writer(topic: Topic, writer_epoch: int) -> None:
    """CommitFailedError unless ``writer_epoch`` still owns ``topic``'s hot tail."""
    if topic.writer_epoch != writer_epoch:
        raise CommitFailedError(
            f"writer epoch {writer_epoch} of topic {topic.name!r} was fenced by "
            f"epoch {topic.writer_epoch}"
        )

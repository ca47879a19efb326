"""Row helpers every store of the metadata shares: the compare-and-set on a row's version
(the protocol: metadata/store.py), the conditions several stores guard with, and reading
one row as its record (NotFoundError when it is missing)."""

from __future__ import annotations

import json
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader.exceptions import CommitFailedError, NotFoundError, TopicDeletedError
from offloader.metadata import schema
from offloader.metadata.clock import db_now
from offloader.metadata.records import Ledger, Segment, Topic
from offloader.policy import OffloadPolicy

T, L, G = schema.topics, schema.ledgers, schema.segments


# --- compare-and-set --------------------------------------------------------------------
def cas(
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


def cas_ledger(conn: Connection, ledger: Ledger, **values: object) -> None:
    where = ledger_key(ledger.topic, ledger.ledger_id)
    what = f"ledger {ledger.topic}/{ledger.ledger_id}"
    cas(conn, L, where, ledger.version, what, **values)


def cas_ledger_if(
    conn: Connection,
    ledger: Ledger,
    condition: sa.ColumnElement[bool],
    refusal: str,
    **values: object,
) -> None:
    """CAS on the ledger that also requires ``condition``; an unchanged ledger that fails
    it raises CommitFailedError with ``refusal`` (what the condition protects)."""
    where = sa.and_(ledger_key(ledger.topic, ledger.ledger_id), condition)
    what = f"ledger {ledger.topic}/{ledger.ledger_id}"
    try:
        cas(conn, L, where, ledger.version, what, **values)
    except CommitFailedError:
        key = ledger_key(ledger.topic, ledger.ledger_id)
        current = conn.execute(sa.select(L.c.version).where(key)).scalar()
        if current == ledger.version:
            raise CommitFailedError(f"{what} {refusal}") from None
        raise


# --- conditions and checks --------------------------------------------------------------
def ledger_key(topic: str, ledger_id: int) -> sa.ColumnElement[bool]:
    return sa.and_(L.c.topic == topic, L.c.ledger_id == ledger_id)


def lease_over() -> sa.ColumnElement[bool]:
    """The attempt's lease has run out by the database's clock (invariant 6)."""
    return sa.or_(L.c.attempt_lease_ms.is_(None), L.c.attempt_lease_ms <= db_now())


def one_topic(topics: Iterable[str]) -> str:
    names = set(topics)
    if len(names) != 1:
        raise ValueError(f"a batch belongs to exactly one topic, got {sorted(names)}")
    return names.pop()


def refuse_deleted(topic: Topic, what: str) -> None:
    if topic.is_deleted:
        raise TopicDeletedError(f"topic {topic.name!r} was deleted; it cannot be {what}")


# --- one row as its record --------------------------------------------------------------
def read_topic(conn: Connection, name: str) -> Topic:
    row = conn.execute(sa.select(T).where(T.c.name == name)).mappings().first()
    if row is None:
        raise NotFoundError(f"topic {name!r} does not exist")
    return topic_from_row(row)


def read_ledger(conn: Connection, topic: str, ledger_id: int) -> Ledger:
    row = conn.execute(sa.select(L).where(ledger_key(topic, ledger_id))).mappings().first()
    if row is None:
        raise NotFoundError(f"ledger {ledger_id} of topic {topic!r} does not exist")
    return Ledger.model_validate(dict(row))


def read_segment(conn: Connection, segment_id: str) -> Segment:
    row = conn.execute(sa.select(G).where(G.c.segment_id == segment_id)).mappings().first()
    if row is None:
        raise NotFoundError(f"segment {segment_id} does not exist")
    return Segment.model_validate(dict(row))


def topic_from_row(row: sa.RowMapping) -> Topic:
    data = dict(row)
    data["policy"] = OffloadPolicy.model_validate(json.loads(data["policy"]))
    return Topic.model_validate(data)


def next_seq(conn: Connection, topic: str) -> int:
    """The next segment number of ``topic`` (stream and rewrite segments share the
    sequence). The topic's row is locked first, so a pass assigning a segment and a
    rewrite beginning one at the same time queue instead of taking the same number."""
    conn.execute(sa.select(T.c.name).where(T.c.name == topic).with_for_update())
    seq = conn.execute(
        sa.select(sa.func.coalesce(sa.func.max(G.c.seq), 0)).where(G.c.topic == topic)
    ).scalar_one()
    return int(seq) + 1

"""A topic's stream (PIP-76): the claim a streaming pass holds on it (the ``streams``
table), one pass at a time.

A pass claims the topic's stream and gets a new epoch (PDP-34 fencing); every commit it
makes renews the claim's lease only if the epoch is still the stream's (:func:`fence`), in
the same transaction as the change, so a pass that lost the stream (a timed-out task still
running beside its retry) can never advance a segment.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from offloader.exceptions import StreamBusyError, StreamFencedError
from offloader.metadata import schema
from offloader.metadata._rows import read_topic
from offloader.metadata.clock import db_now
from offloader.metadata.records import StreamClaim

S = schema.streams


def claim_stream(conn: Connection, topic: str, owner: str, lease_ms: int) -> StreamClaim:
    """Take the topic's stream with a new epoch, unless a pass holds a live lease
    (StreamBusyError naming it). The previous holder is fenced from here on."""
    if lease_ms <= 0:
        raise ValueError(f"lease_ms must be positive, got {lease_ms}")
    owner = owner[:255]
    read_topic(conn, topic)  # NotFoundError for an unknown topic
    row = conn.execute(sa.select(S).where(S.c.topic == topic)).mappings().first()
    if row is None:
        try:
            with conn.begin_nested():
                conn.execute(
                    S.insert().values(
                        topic=topic,
                        version=1,
                        epoch=1,
                        owner=owner,
                        lease_ms=lease_ms,
                        lease_until_ms=db_now() + lease_ms,
                        claimed_ms=db_now(),
                        created_ms=db_now(),
                    )
                )
        except IntegrityError:
            raise StreamBusyError(
                f"topic {topic!r}: another pass claimed the stream at the same time"
            ) from None
        return StreamClaim(topic=topic, epoch=1, owner=owner, lease_ms=lease_ms)
    free = sa.or_(S.c.lease_until_ms.is_(None), S.c.lease_until_ms <= db_now())
    result = conn.execute(
        S.update()
        .where(S.c.topic == topic, S.c.version == row["version"], free)
        .values(
            version=S.c.version + 1,
            epoch=S.c.epoch + 1,
            owner=owner,
            lease_ms=lease_ms,
            lease_until_ms=db_now() + lease_ms,
            claimed_ms=db_now(),
        )
    )
    if result.rowcount != 1:
        raise StreamBusyError(
            f"topic {topic!r}: a streaming pass ({row['owner']}, epoch {row['epoch']}) "
            f"holds the stream until {row['lease_until_ms']} ms (database clock); "
            "this pass does nothing"
        )
    previous = row["claimed_ms"]
    now = conn.execute(sa.select(S.c.claimed_ms).where(S.c.topic == topic)).scalar_one()
    return StreamClaim(
        topic=topic,
        epoch=int(row["epoch"]) + 1,
        owner=owner,
        lease_ms=lease_ms,
        pass_interval_ms=None if previous is None else max(0, int(now) - int(previous)),
    )


def fence(conn: Connection, claim: StreamClaim) -> None:
    """Renew the claim's lease if its epoch is still the stream's (PDP-34 fencing)."""
    result = conn.execute(
        S.update()
        .where(S.c.topic == claim.topic, S.c.epoch == claim.epoch)
        .values(version=S.c.version + 1, lease_until_ms=db_now() + claim.lease_ms)
    )
    if result.rowcount != 1:
        current = conn.execute(sa.select(S.c.epoch, S.c.owner).where(S.c.topic == claim.topic))
        row = current.first()
        holder = "nobody" if row is None else f"{row[1]} (epoch {row[0]})"
        raise StreamFencedError(
            f"topic {claim.topic!r}: this pass (epoch {claim.epoch}) lost the stream to "
            f"{holder}; it commits nothing more"
        )


def release_stream(conn: Connection, claim: StreamClaim) -> bool:
    """Let the next pass start at once; False if the claim was already fenced."""
    result = conn.execute(
        S.update()
        .where(S.c.topic == claim.topic, S.c.epoch == claim.epoch)
        .values(version=S.c.version + 1, lease_until_ms=None)
    )
    return result.rowcount == 1

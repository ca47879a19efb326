"""Recording a topic's start in the object store (``_metadata/starts/``, docs/FORMAT.md), so
that a rebuild from the objects alone never makes trimmed entries readable again.

Order (invariant 4, crash-safe): the record is raised to the trim's target *before* the
start moves in the database, and raised to the database's start again after. A crash
between the two leaves the record at or ahead of the database, never behind: a rebuild
then hides at most what the operator asked to trim. The record only ever moves forward
(read, compare, write), and a trim that finds nothing to move still raises it to the
database's start, so repeating a trim repairs a record that a lost race or an older
release left behind. A trim that gives up (CommitFailedError: too much contention) leaves
the record at its target, ahead of the database: a rebuild then hides what it was asked
to trim (the safe side); a later trim there moves the database to it. It is written to
the configured store and to every store holding an offloaded ledger or segment of the
topic: each store can be rebuilt on its own.
"""

from __future__ import annotations

import logging

from offloader import failpoints
from offloader.exceptions import ObjectNotFoundError
from offloader.format.topic_start import RecordedStart, decode_start, encode_start
from offloader.keys import topic_start_key
from offloader.metadata import Position
from offloader.objectstore import ObjectStore
from offloader.runtime import Runtime

log = logging.getLogger(__name__)


def read_recorded_start(store: ObjectStore, topic: str) -> RecordedStart | None:
    """The start recorded for ``topic`` in ``store``; None when none is (ValueError if the
    object is damaged)."""
    try:
        data = store.get(topic_start_key(topic))
    except ObjectNotFoundError:
        return None
    return decode_start(data)


def record_start(rt: Runtime, topic: str, start: Position) -> None:
    """Raise the recorded start of ``topic`` to ``start`` in each store that needs it (a
    topic never trimmed needs no record)."""
    if start == Position(ledger_id=0, entry_id=0):
        return
    now_ms = rt.metadata.db_now_ms()
    ids = {rt.stores.default_id(), *rt.metadata.retention.stores_holding(topic)}
    wrote = False
    for store_id in sorted(ids):
        store = rt.stores.get(store_id, f"store {store_id}")
        record = RecordedStart(topic, start.ledger_id, start.entry_id, now_ms)
        wrote = raise_recorded_start(store, record) or wrote
    if wrote:
        failpoints.reach("after-start-recorded")


def raise_recorded_start(store: ObjectStore, start: RecordedStart) -> bool:
    """Write ``start`` unless the store already records one at or beyond it (a damaged
    record is replaced). Returns whether it wrote."""
    try:
        known = read_recorded_start(store, start.topic)
    except ValueError:
        log.warning("recorded start of topic %s is damaged; rewriting it", start.topic)
        known = None
    if known is not None and known.position >= start.position:
        return False
    store.put(topic_start_key(start.topic), encode_start(start))
    return True

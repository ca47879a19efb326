"""Promises 1, 2 and 7 of `offloader verify`: one LIST pass of each recorded store, merged
page by page with what the metadata says must be there.

A LIST returns keys in byte order, and so does :func:`expected_objects` for a key range, so
each page is judged with a constant number of statements whatever the store holds: the
sweep's own page judgement (``judge_page``: which keys are referenced, one statement), the
recorded objects whose keys fall between the previous page's last key and this page's
(missing or of the wrong size), and, only for keys nothing references, whether any row ever
named them (awaiting the sweep) or none did (an orphan). No object is read or HEADed.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from offloader.gc.sweep import count_stale_uploads, judge_page, list_objects, protected_snapshots
from offloader.keys import is_metadata_key
from offloader.metadata.promises import ExpectedObject, expected_objects, recorded_keys
from offloader.objectstore import ObjectInfo, ObjectStore
from offloader.objectstore.location import StoreLocation
from offloader.runtime import Runtime
from offloader.verify.report import BreachKind, VerifyReport

log = logging.getLogger(__name__)


@dataclass
class ObjectsSeen:
    """What the LIST passes leave for the later checks: the keys found missing and the
    stores that could not be listed (their objects are neither present nor absent)."""

    missing: set[str] = field(default_factory=set)
    wrong_size: set[str] = field(default_factory=set)  # present: readable up to the damage
    unavailable: set[int] = field(default_factory=set)


def check_stores(
    rt: Runtime, report: VerifyReport, *, started_ms: int, topic: str | None
) -> ObjectsSeen:
    """List every recorded store once and judge it; a store that cannot be opened or
    listed is one ``store_unavailable`` breach and the others are still checked."""
    seen = ObjectsSeen()
    for store_id, location in rt.metadata.list_locations():
        report.counts.stores += 1
        try:
            store = rt.stores.get(store_id, f"store {store_id}")
            _check_store(rt, store, store_id, location, report, seen, started_ms, topic)
        except Exception as exc:  # one store's trouble must not stop the others
            log.warning("verify of %s failed", location, exc_info=True)
            seen.unavailable.add(store_id)
            report.add(
                BreachKind.STORE_UNAVAILABLE,
                f"store {location} could not be opened or listed: {type(exc).__name__}: {exc}",
                store=str(location),
            )
    return seen


def _check_store(
    rt: Runtime,
    store: ObjectStore,
    store_id: int,
    location: StoreLocation,
    report: VerifyReport,
    seen: ObjectsSeen,
    started_ms: int,
    topic: str | None,
) -> None:
    snapshots = protected_snapshots(store)
    previous: str | None = None
    found: list[tuple[ExpectedObject, ObjectInfo | None]] = []
    for page in list_objects(store):
        last = page[-1].key
        if (previous is not None and last <= previous) or _unordered(page):
            raise ValueError("the listing is not in key order; nothing can be merged with it")
        report.counts.objects_listed += len(page)
        judged = judge_page(rt.metadata, page, snapshots)
        report.counts.foreign += len(judged.foreign)
        report.counts.referenced += len(judged.referenced)
        _judge_unreferenced(rt, judged.unreferenced, location, report)
        listed = {info.key: info for info in page}
        expected = expected_objects(
            rt.metadata,
            store_id,
            after=previous,
            up_to=last,
            committed_by_ms=started_ms,
            topic=topic,
        )
        found = [(e, listed.get(e.key)) for e in expected]
        _judge_expected(found, location, report, seen)
        previous = last
    tail = expected_objects(
        rt.metadata, store_id, after=previous, up_to=None, committed_by_ms=started_ms, topic=topic
    )
    _judge_expected([(e, None) for e in tail], location, report, seen)
    report.counts.stale_uploads += count_stale_uploads(rt.metadata, store, rt.settings)


def _unordered(page: list[ObjectInfo]) -> bool:
    return any(a.key >= b.key for a, b in itertools.pairwise(page))


def _judge_unreferenced(
    rt: Runtime, unreferenced: list[ObjectInfo], location: StoreLocation, report: VerifyReport
) -> None:
    """Keys nothing references: a key some row once named was queued once (a failed or
    superseded attempt's, a dead segment's, a deleted one written again) and the sweep
    takes it, as it takes a snapshot the manifest dropped; a key no row ever named breaks
    invariant 1, whatever its age."""
    if not unreferenced:
        return
    recorded = recorded_keys(rt.metadata, [o.key for o in unreferenced])
    for info in unreferenced:
        if info.key in recorded or is_metadata_key(info.key):
            report.counts.awaiting_sweep += 1
            continue
        report.add(
            BreachKind.ORPHAN,
            f"object {info.key} ({info.size} bytes) in {location} is recorded nowhere in the "
            "metadata (invariant 1: every object is recorded before its first byte)",
            key=info.key,
            store=str(location),
        )


def _judge_expected(
    found: Iterable[tuple[ExpectedObject, ObjectInfo | None]],
    location: StoreLocation,
    report: VerifyReport,
    seen: ObjectsSeen,
) -> None:
    for expected, info in found:
        where = dict(
            topic=expected.topic,
            key=expected.key,
            ledger_id=expected.ledger_id,
            segment_id=expected.segment_id,
            store=str(location),
        )
        if info is None:
            seen.missing.add(expected.key)
            report.add(
                BreachKind.MISSING_OBJECT,
                f"{expected.owner}: object {expected.key} is missing from {location}",
                **where,
            )
        elif expected.size is not None and info.size != expected.size:
            seen.wrong_size.add(expected.key)
            report.add(
                BreachKind.SIZE_MISMATCH,
                f"{expected.owner}: object {expected.key} in {location} is {info.size} bytes, "
                f"the metadata recorded {expected.size}",
                **where,
            )

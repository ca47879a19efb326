"""What a Spark executor runs for a scrub: :func:`scrub_ledger` over its share of the
targets, each read from the store its row recorded, opened from the location the target
carries and the object-store settings the driver put in the task closure (no database)."""

from __future__ import annotations

from collections.abc import Iterable

from offloader.exceptions import StoreUnavailableError
from offloader.objectstore import ObjectStore
from offloader.objectstore.registry import OpenedLocations
from offloader.scrub.check import LedgerScrubResult
from offloader.scrub.run import scrub_ledger_in
from offloader.scrub.targets import ScrubTarget
from offloader.settings import Settings


def scrub_partition(targets: Iterable[ScrubTarget], settings: Settings) -> list[LedgerScrubResult]:
    """Scrub every target of one Spark partition; each store is opened once and closed at
    the end. ``settings``: :meth:`Settings.for_object_stores` (endpoint, keys, tuning)."""
    stores = OpenedLocations(settings)

    def open_store(target: ScrubTarget) -> ObjectStore:
        if target.location is None:
            raise StoreUnavailableError(
                f"{target.described} names no object store (written before revision 0002 "
                "and not upgraded): run `offloader db upgrade`"
            )
        return stores.open(target.location)

    try:
        return [scrub_ledger_in(open_store, t) for t in targets]
    finally:
        stores.close()

"""A rewrite group's write step as a work order: everything needed to upload the parts of
one output segment and build its index, picklable and without the database or any
credential, so a Spark executor can do it as well as the process that recorded the intent.

The driver (or `offloader rewrite`) records the intent and the multipart upload, builds the
order (:func:`order_for`), keeps the lease, and completes, indexes and commits what comes
back; :func:`write_order` is the step in between, the same code wherever it runs. Stores
are named by their recorded id and location (invariant 7): this process opens them through
its registry, an executor by location (:func:`write_partition`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from offloader.metadata import Ledger, MetadataStore, Segment
from offloader.metadata.records import PieceRange
from offloader.objectstore import MultipartUpload, ObjectStore, PartInfo
from offloader.objectstore.location import StoreLocation
from offloader.objectstore.registry import OpenedLocations
from offloader.read.topic_reader import ledger_object_reader
from offloader.rewrite.encode import OutputLayout, RewrittenData, encode_ledgers
from offloader.rewrite.merge import load_source, merge_segments
from offloader.rewrite.plan import SEGMENT, RewriteGroup
from offloader.settings import Settings


@dataclass(frozen=True)
class StoreRef:
    """A recorded store: its id for this process's registry, its location for an executor."""

    store_id: int
    location: StoreLocation


@dataclass(frozen=True)
class SegmentInput:
    """A segment source and the ledger ranges the metadata records for it (what is kept)."""

    store: StoreRef
    data_key: str
    index_key: str
    data_len: int
    keep: tuple[PieceRange, ...]


@dataclass(frozen=True)
class WorkOrder:
    """One output segment to write into its recorded multipart upload: v1 ``ledgers`` (each
    in the store of ``ledger_stores`` at the same position) re-encoded, or ``segments``
    merged; never both (a group is of one kind)."""

    segment_id: str
    topic: str
    target: StoreRef
    upload: MultipartUpload
    layout: OutputLayout
    ledgers: tuple[Ledger, ...] = ()
    ledger_stores: tuple[StoreRef, ...] = ()
    segments: tuple[SegmentInput, ...] = ()
    ledger_times: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkResult:
    """What came back for an order: the written data, or why it could not be written."""

    segment_id: str
    written: RewrittenData | None = None
    error: str | None = None


StoreOpener = Callable[[StoreRef], ObjectStore]


def order_for(
    metadata: MetadataStore,
    group: RewriteGroup,
    segment: Segment,
    upload: MultipartUpload,
    *,
    target: StoreRef,
    read_prefetch: int,
    concurrency: int,
) -> WorkOrder:
    """The order for ``group`` into rewrite ``segment``'s recorded ``upload``, read from the
    metadata now (the sources' stores and kept ranges, the topic's policy)."""
    policy = metadata.get_topic(group.topic).policy
    layout = OutputLayout(
        max_block_size=policy.max_block_size,
        min_part_bytes=policy.min_part_bytes,
        read_buffer_size=policy.read_buffer_size,
        read_prefetch=read_prefetch,
        concurrency=concurrency,
    )
    locations: dict[int, StoreRef] = {}

    def ref(store_id: int | None, what: str) -> StoreRef:
        if store_id is None:
            raise ValueError(f"{what} names no object store: run `offloader db upgrade`")
        if store_id not in locations:
            locations[store_id] = StoreRef(store_id, metadata.get_location(store_id))
        return locations[store_id]

    order = partial(
        WorkOrder,
        segment_id=segment.segment_id,
        topic=group.topic,
        upload=upload,
        target=target,
        layout=layout,
    )
    if group.kind != SEGMENT:
        ledgers = tuple(group.ledgers)
        stores = tuple(ref(x.store_id, f"ledger {x.topic}/{x.ledger_id}") for x in ledgers)
        return order(ledgers=ledgers, ledger_stores=stores)
    recorded = metadata.segments.offloaded_pieces(group.topic)
    sources = tuple(
        SegmentInput(
            ref(s.store_id, f"segment {s.segment_id}"),
            s.data_key,
            s.index_key,
            s.data_len or 0,
            tuple(recorded.get(s.segment_id, [])),
        )
        for s in group.segments
    )
    times = {
        x.ledger_id: (x.created_ms, x.sealed_ms)
        for x in metadata.get_ledgers(group.topic, group.ledger_ids).values()
        if x.sealed_ms is not None
    }
    return order(segments=sources, ledger_times=times)


def write_order(
    order: WorkOrder, open_store: StoreOpener, on_part: Callable[[PartInfo], None]
) -> RewrittenData:
    """Upload ``order``'s parts and build its index (the upload stays open: the caller
    completes it, writes the index and commits). ``on_part`` runs after each part."""
    target = open_store(order.target)
    if order.ledgers:
        readers = [
            ledger_object_reader(open_store(ref), ledger, order.layout.read_prefetch)
            for ledger, ref in zip(order.ledgers, order.ledger_stores, strict=True)
        ]
        return encode_ledgers(
            order.topic,
            order.ledgers,
            readers,
            target,
            order.upload,
            layout=order.layout,
            on_part=on_part,
        )
    sources = [
        load_source(open_store(s.store), s.data_key, s.index_key, s.data_len, s.keep)
        for s in order.segments
    ]
    merged = merge_segments(
        target,
        order.upload,
        sources,
        on_part=on_part,
        part_size=order.layout.min_part_bytes,
        concurrency=order.layout.concurrency,
        ledger_times=order.ledger_times,
    )
    return RewrittenData(merged.parts, merged.data_len, merged.index, merged.pieces)


def write_partition(
    orders: Iterable[WorkOrder],
    settings: Settings,
    on_part: Callable[[PartInfo], None] = lambda part: None,
) -> list[WorkResult]:
    """What a Spark executor runs: every order of its partition, stores opened by location
    with ``settings`` (:meth:`Settings.for_object_stores`). An order that fails comes back
    with its error's text, so one bad group does not fail the others' Spark task."""
    stores = OpenedLocations(settings)
    results = []
    try:
        for order in orders:
            try:
                written = write_order(order, lambda ref: stores.open(ref.location), on_part)
                results.append(WorkResult(order.segment_id, written=written))
            except Exception as err:
                results.append(WorkResult(order.segment_id, error=f"{type(err).__name__}: {err}"))
    finally:
        stores.close()
    return results

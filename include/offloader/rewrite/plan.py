"""What a rewrite run would rewrite: groups of sources, from the metadata alone (the store
is never LISTed).

A topic's offloaded data is a sequence of objects in position order: v1 ledger objects
(one per ledger offloaded ledger by ledger) and segments (each holding ranges of one or
more ledgers). A group is one output segment; its sources are a run of adjacent objects
of ONE kind of ONE topic, packed greedily up to ``target_bytes`` (a source larger than the
target alone):

- ``compact``: runs of objects smaller than ``small_bytes``; a group needs two sources at
  least (one object alone is left as it is);
- ``to-v2``: runs of v1 ledger objects, whatever their size (one big ledger alone is fine).

Anything else between two sources breaks the run: an object of the other kind or not
small, a ledger not offloaded (hot only, or open), one outside the ledger range, one with
an offload attempt in flight (a scrub repair). A segment is a source only if offloaded
(never an open one) and every ledger it holds is live and still needs it (a ledger
repaired or migrated back to objects of its own does not: such a segment waits for its
release, it is not copied again); a deleted or deleting ledger is never a source. A
ledger partly below the topic's start is live and is copied whole: its head stays hidden
by the start. A ledger offloaded in v1 objects that also has entries in segments (it was
streamed in part) is not a source either: two copies of its entries would be recorded.
After a complete run, a rerun plans nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from offloader.exceptions import TopicDeletedError
from offloader.metadata import (
    Ledger,
    LedgerState,
    MetadataStore,
    OffloadMode,
    Position,
    Segment,
    SegmentState,
)
from offloader.rewrite.params import COMPACT, TO_V2, RewriteParams

LEDGER, SEGMENT = "ledger", "segment"  # the two kinds of source


@dataclass(frozen=True)
class Source:
    """One object of a topic as the metadata records it: a v1 ledger's or a segment's."""

    begin: Position
    size: int  # the data object's bytes
    ledger: Ledger | None = None
    segment: Segment | None = None
    ledger_ids: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        return LEDGER if self.ledger is not None else SEGMENT


@dataclass(frozen=True)
class RewriteGroup:
    """One output segment and the sources it replaces, in position order."""

    topic: str
    kind: str
    sources: tuple[Source, ...]

    @property
    def ledgers(self) -> list[Ledger]:
        return [s.ledger for s in self.sources if s.ledger is not None]

    @property
    def segments(self) -> list[Segment]:
        return [s.segment for s in self.sources if s.segment is not None]

    @property
    def ledger_ids(self) -> list[int]:
        return sorted({i for s in self.sources for i in s.ledger_ids})

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.sources)

    @property
    def objects(self) -> int:
        """Objects in the store: a data and an index object per source."""
        return 2 * len(self.sources)

    def describe(self) -> str:
        ids = self.ledger_ids
        what = f"{len(self.sources)} {self.kind} object(s)"
        return f"{self.topic}: {what} of ledgers {ids[0]}..{ids[-1]} ({self.bytes} bytes)"


def plan_rewrite(metadata: MetadataStore, params: RewriteParams) -> list[RewriteGroup]:
    """Every group of ``params``' topics (by name), in position order within a topic."""
    groups: list[RewriteGroup] = []
    for topic in _topics(metadata, params.topics):
        groups += _pack(topic, _runs(_objects(metadata, topic, params), params), params)
    return groups


def _topics(metadata: MetadataStore, topics: list[str] | None) -> list[str]:
    """The named topics (NotFoundError for an unknown one, TopicDeletedError for a deleted
    one), or every topic not deleted."""
    if not topics:
        return [t.name for t in metadata.list_topics() if not t.is_deleted]
    for name in topics:
        if metadata.get_topic(name).is_deleted:
            raise TopicDeletedError(f"topic {name!r} was deleted: nothing to rewrite")
    return list(topics)


def _objects(metadata: MetadataStore, topic: str, params: RewriteParams) -> list[Source | None]:
    """The topic's objects in position order; None marks what breaks a run."""
    ledgers = metadata.list_ledgers(topic, live=True)
    pieces = metadata.segments.offloaded_pieces(topic)
    streamed = {p.ledger_id for ranges in pieces.values() for p in ranges}
    found: list[tuple[Position, Source | None]] = []
    for ledger in ledgers:
        at = Position(ledger_id=ledger.ledger_id, entry_id=0)
        if not params.in_range(ledger.ledger_id):
            found.append((at, None))
        elif _v1_object(ledger) and ledger.ledger_id not in streamed:
            size = ledger.data_len or 0
            found.append((at, Source(at, size, ledger=ledger, ledger_ids=(ledger.ledger_id,))))
        elif ledger.ledger_id in streamed or _empty(ledger):
            continue  # its entries are the segments' below; an empty ledger holds none
        else:
            found.append((at, None))  # hot only, open, or an attempt in flight
    needs = {x.ledger_id for x in ledgers if not _v1_object(x)}  # not on objects of its own
    for segment in metadata.segments.of_topic(topic, [SegmentState.OFFLOADED]):
        ids = tuple(sorted({p.ledger_id for p in pieces.get(segment.segment_id, [])}))
        usable = bool(ids) and all(i in needs and params.in_range(i) for i in ids)
        source = Source(segment.begin, segment.data_len, segment=segment, ledger_ids=ids)
        found.append((segment.begin, source if usable else None))
    found.sort(key=lambda item: (item[0].key(), item[1] is not None))
    return [source for _, source in found]


def _v1_object(ledger: Ledger) -> bool:
    """Offloaded in its own v1 objects, nothing in flight: a v1 source."""
    return (
        ledger.is_offloaded
        and ledger.offload_mode is OffloadMode.LEDGER
        and ledger.attempt_id is None
        and ledger.entry_count > 0
        and ledger.data_key is not None
    )


def _empty(ledger: Ledger) -> bool:
    return ledger.state is LedgerState.SEALED and ledger.entry_count == 0


def _runs(objects: list[Source | None], params: RewriteParams) -> Iterator[list[Source]]:
    """Maximal runs of adjacent candidates of one kind."""
    run: list[Source] = []
    for source in objects:
        if source is not None and _candidate(source, params):
            if run and run[-1].kind != source.kind:
                yield run
                run = []
            run.append(source)
            continue
        if run:
            yield run
        run = []
    if run:
        yield run


def _candidate(source: Source, params: RewriteParams) -> bool:
    if params.mode == TO_V2:
        return source.kind == LEDGER
    assert params.mode == COMPACT
    return source.size < params.small_limit


def _pack(topic: str, runs: Iterator[list[Source]], params: RewriteParams) -> list[RewriteGroup]:
    """Each run cut greedily into groups of up to ``target_bytes``; compaction keeps the
    groups of two sources or more."""
    least = 2 if params.mode == COMPACT else 1
    groups = []
    for run in runs:
        group: list[Source] = []
        for source in run:
            if group and sum(s.size for s in group) + source.size > params.target_bytes:
                groups.append(group)
                group = []
            group.append(source)
        groups.append(group)
        groups = [g for g in groups if len(g) >= least]
    return [RewriteGroup(topic, g[0].kind, tuple(g)) for g in groups]

"""The streaming offload pass (PIP-76): entries written since the last pass, the open
ledger's up to its last confirmed entry included, go as v2 blocks into the topic's current
segment, a multipart upload that stays open across passes.

One pass, under the topic's stream claim (metadata/segments.py: a new epoch, checked by
every commit):
1. settle ledgers sealed since their last segment was committed (stream-mode offloaded);
2. finish a segment left Closing; replace a Failed one from its begin;
3. resume the Assigned segment after its last recorded part (or assign one: keys first,
   then the upload, then its id), feed it entries, upload and record every full part;
4. roll it over when it reaches its size, its age, its planned end (history) or when told
   to close now or streaming was turned off: the last part, then Closing, complete the
   upload with exactly the recorded parts, write the index, commit Offloaded;
5. go on with the next segment while the backlog fills one, else leave the tail smaller
   than a part in the hot tier for a later pass.
A pass that dies anywhere is redone by the next: parts not recorded are uploaded again
(same part numbers), a Closing segment is completed with its recorded parts, and an index
is the same bytes whoever writes it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from offloader import failpoints
from offloader.exceptions import (
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreError,
    OffloaderError,
)
from offloader.format.layout import ENTRY_FRAME, MIN_BLOCK_SIZE
from offloader.format.object_metadata import segment_user_metadata
from offloader.format.segment_blocks import SegmentEncoder
from offloader.format.segment_index import encode_segment_index
from offloader.format.segment_layout import EncodedPart, SegmentBlockRef
from offloader.keys import segment_object_keys
from offloader.metadata.records import (
    Ledger,
    LedgerState,
    OffloadState,
    PieceRange,
    Position,
    Segment,
    SegmentState,
    StreamClaim,
    Topic,
)
from offloader.objectstore import MultipartUpload, ObjectStore, PartInfo
from offloader.policy import OffloadPolicy
from offloader.results import fields_json
from offloader.runtime import Runtime
from offloader.stream.blocks_json import dump_blocks, load_blocks
from offloader.stream.history import SealedSpan, plan_segment_end
from offloader.stream.lease import StreamLease

log = logging.getLogger(__name__)

S3_MIN_PART = 5 * 1024 * 1024
FEED_BATCH_BYTES = 1024 * 1024  # entries fed to the encoder between size checks


@dataclass
class StreamPassResult:
    """What one pass did, for the CLI, the task log and XCom (no credentials)."""

    topic: str
    epoch: int
    committed: list[str] = field(default_factory=list)  # segment ids made Offloaded
    failed: list[str] = field(default_factory=list)
    parts_uploaded: int = 0
    bytes_uploaded: int = 0
    settled_ledgers: list[int] = field(default_factory=list)
    open_segment: str | None = None
    offloaded_to: str | None = None  # the last position in a recorded part, L:E
    waiting_bytes: int = 0  # the tail left in the hot tier (smaller than a part)
    over_budget: bool = False  # the pass stopped at its time budget; the next goes on

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        return "\n".join(
            [
                f"epoch {self.epoch}: {self.parts_uploaded} parts, {self.bytes_uploaded} bytes",
                f"segments committed: {self.committed or '-'}; failed: {self.failed or '-'}",
                f"open segment: {self.open_segment or '-'}, offloaded to "
                f"{self.offloaded_to or '-'}, {self.waiting_bytes} bytes waiting in the hot tier",
                f"ledgers offloaded: {self.settled_ledgers or '-'}",
            ]
        )


class SegmentUploadFailed(OffloaderError):
    """The segment's upload cannot be completed (gone, or a part is not the recorded one)."""


class StreamingOffloader:
    """Runs streaming passes for a runtime; one pass per call of :meth:`run_pass`."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        owner: str = "offloader",
        lease_seconds: float | None = None,
        budget_seconds: float = 240.0,
    ) -> None:
        """``budget_seconds`` bounds a pass's run time (back-pressure): once spent, the
        pass uploads no more and a backlog is worked off over the next passes.
        ``lease_seconds`` (default: the ``stream_lease_seconds`` setting) is the stream's
        lease, renewed while the pass runs (stream/lease.py)."""
        if budget_seconds <= 0:
            raise ValueError(f"budget_seconds must be positive, got {budget_seconds}")
        self.budget_seconds = budget_seconds
        self.runtime = runtime
        self.metadata = runtime.metadata
        self.segments = runtime.metadata.segments
        self.owner = owner
        if lease_seconds is None:
            lease_seconds = runtime.settings.stream_lease_seconds
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {lease_seconds}")
        self.lease_ms = int(lease_seconds * 1000)

    def run_pass(self, topic: str, *, close_now: bool = False) -> StreamPassResult:
        """One pass over ``topic``; StreamBusyError if another pass holds the stream."""
        current = self.metadata.get_topic(topic)
        check_stream_policy(current.policy, self.runtime.objects)
        asked = time.monotonic()
        claim = self.segments.claim(topic, self.owner, self.lease_ms)
        result = StreamPassResult(topic=topic, epoch=claim.epoch)
        try:
            with StreamLease(self.segments, claim, asked) as lease:
                result.settled_ledgers += self.segments.settle_ledgers(topic)
                _Pass(self, claim, lease, current, close_now, result).run()
                result.settled_ledgers += self.segments.settle_ledgers(topic)
        finally:
            try:
                self.segments.release(claim)
            except Exception:  # the lease runs out by itself; the pass's own error matters
                log.warning("could not release the stream of %s", topic, exc_info=True)
        return result


def check_stream_policy(policy: OffloadPolicy, store: ObjectStore) -> None:
    """S3 refuses parts under 5 MiB (but the last): such a policy fails before any work."""
    if policy.streaming and policy.min_part_bytes < store.capabilities.min_part_size:
        raise ValueError(
            f"min_part_bytes ({policy.min_part_bytes}) is below the object store's minimum "
            f"part size ({store.capabilities.min_part_size}, {store.url}): raise it with "
            "`offloader topic policy TOPIC --set min_part_bytes=...`"
        )


class _Pass:
    def __init__(
        self,
        offloader: StreamingOffloader,
        claim: StreamClaim,
        lease: StreamLease,
        topic: Topic,
        close_now: bool,
        result: StreamPassResult,
    ) -> None:
        self.o = offloader
        self.runtime = offloader.runtime
        self.segments = offloader.segments
        self.claim = claim
        self.lease = lease  # checked before every commit: a pass that lost it stops
        self.topic = topic
        self.policy = topic.policy
        self.close_now = close_now
        self.result = result
        self.deadline = time.monotonic() + offloader.budget_seconds

    def over_budget(self) -> bool:
        return time.monotonic() >= self.deadline

    def run(self) -> None:
        while True:
            segment = self.segments.current(self.topic.name)
            if segment is not None and segment.state is SegmentState.CLOSING:
                self._finish(segment)
                continue
            if self.over_budget() and (self.result.parts_uploaded or self.result.committed):
                self.result.over_budget = True  # progress made; the next pass goes on
                return
            if len(self.result.failed) > 1:
                raise SegmentUploadFailed(
                    f"segments {', '.join(self.result.failed)} of {self.topic.name!r} failed in "
                    "one pass: the store refuses to complete uploads; see the task log"
                )
            if segment is None or segment.state is SegmentState.FAILED:
                segment = self._assign(segment)
                if segment is None:
                    return
            try:
                filled = self._fill(segment)
            except SegmentUploadFailed as err:  # its upload is gone: a part cannot go
                self._fail(self.segments.get(segment.segment_id), err)
                continue
            if not filled:
                return

    # --- assignment ---------------------------------------------------------------------
    def _assign(self, failed: Segment | None) -> Segment | None:
        """The next segment, from where the stream stands; None when there is nothing to
        stream (streaming off, or no entry after the stream's end)."""
        if not self.policy.streaming:
            return None
        begin = failed.begin if failed is not None else self._next_begin()
        if next(self._entries(begin, None), None) is None:
            return None
        planned_end = self._plan_history(begin)
        segment_id = str(uuid.uuid4())
        data_key, index_key = segment_object_keys(segment_id)
        self.lease.check()
        segment = self.segments.assign(
            self.claim,
            segment_id=segment_id,
            data_key=data_key,
            index_key=index_key,
            store_id=self.runtime.stores.default_id(),
            begin=begin,
            planned_end=planned_end,
        )
        failpoints.reach("stream-after-assign")
        return segment

    def _next_begin(self) -> Position:
        end = self.segments.last_offloaded_end(self.topic.name)
        start = self.topic.start
        if end is None:
            return start
        after = Position(ledger_id=end.ledger_id, entry_id=end.entry_id + 1)
        return max(after, start)

    def _plan_history(self, begin: Position) -> Position | None:
        """A planned end when sealed, not yet streamed history from ``begin`` holds a
        full segment (binary search over cumulative sizes, history.py)."""
        spans = []
        for ledger in self._ledgers(begin):
            if ledger.state is not LedgerState.SEALED:
                break
            first = begin.entry_id if ledger.ledger_id == begin.ledger_id else 0
            if first >= ledger.entry_count:
                continue
            size = (
                ledger.size_bytes + ENTRY_FRAME * ledger.entry_count
                if first == 0
                else sum(ENTRY_FRAME + n for n in self._sizes(ledger.ledger_id, first))
            )
            spans.append(SealedSpan(ledger.ledger_id, first, ledger.entry_count, size))
        return plan_segment_end(spans, self.policy.segment_max_bytes, self._sizes)

    def _sizes(self, ledger_id: int, first: int) -> Iterator[int]:
        for _, payload in self.runtime.hot.read(self.topic.name, ledger_id, first):
            yield len(payload)

    # --- filling ------------------------------------------------------------------------
    def _fill(self, segment: Segment) -> bool:
        """Upload what the segment can take; True when it was committed (go on)."""
        store = self.runtime.stores.get(segment.store_id, f"segment {segment.segment_id}")
        if segment.upload_id is None:
            upload = store.create_multipart(
                segment.data_key,
                metadata=segment_user_metadata(self.topic.name, segment.segment_id, "data"),
            )
            failpoints.reach("stream-after-create-upload")
            self.lease.check()
            segment = self.segments.record_upload(self.claim, segment, upload.upload_id)
        upload = MultipartUpload(key=segment.data_key, upload_id=segment.upload_id or "")
        parts = self.segments.parts(segment)
        encoder = SegmentEncoder(
            max_block_size=self._block_size(),
            min_part_size=self.policy.min_part_bytes,
            next_part_id=len(parts) + 1,
            offset=segment.data_len,
            after=None if segment.end is None else segment.end.key(),
        )
        # a recorded part shorter than min_part_bytes is the last part of a pass that was
        # closing the segment and died before marking it: nothing may follow it (S3 refuses
        # to complete an upload in which a part but the last is under 5 MiB)
        sealed = bool(parts) and parts[-1].length < self.policy.min_part_bytes
        closing = sealed or self.close_now or not self.policy.streaming or self._aged(segment)
        batches = self._batches(segment, lambda: self._room(segment, encoder))
        for batch in () if sealed else batches:
            for part in encoder.append(batch):
                segment = self._upload_part(store, upload, segment, part)
            if self._full(segment, encoder) or self.over_budget():
                break
        closing = closing or self._full(segment, encoder)
        self.result.open_segment = segment.segment_id
        if not closing:
            self.result.waiting_bytes = encoder.pending_bytes
            self._note(segment)
            return False
        for part in encoder.close():
            segment = self._upload_part(store, upload, segment, part)
        if segment.end is None:  # nothing ever reached it
            if not self.policy.streaming:
                failed = self.segments.fail(self.claim, segment, "streaming turned off, empty")
                self.result.failed.append(failed.segment_id)
            self._note(segment)
            return False
        self.lease.check()
        segment = self.segments.begin_close(self.claim, segment)
        failpoints.reach("stream-after-begin-close")
        self._finish(segment)
        return True

    def _block_size(self) -> int:
        """Blocks close at about a part, so a slow topic's entries leave the hot tier at
        part size, not at a 64 MiB block."""
        return max(
            MIN_BLOCK_SIZE, 64 * 1024, min(self.policy.max_block_size, self.policy.min_part_bytes)
        )

    def _aged(self, segment: Segment) -> bool:
        """The segment is due at this pass if the next one, a pass interval later (as the
        stream last saw it), would be past its rollover age: so an entry waits at most
        about the age plus one interval, not two. A quarter interval of slack covers what
        the exact rule misses: passes a little early (the age is taken at a pass's start,
        the segment was assigned in the middle of one) and the closing pass's own time."""
        age_ms = self.o.metadata.db_now_ms() - segment.assigned_ms
        limit_ms = self.policy.segment_max_age_seconds * 1000
        interval_ms = min(self.claim.pass_interval_ms or 0, limit_ms)
        return age_ms + interval_ms + interval_ms // 4 >= limit_ms

    def _full(self, segment: Segment, encoder: SegmentEncoder) -> bool:
        """A history segment ends exactly at its planned end (its size was planned); any
        other at the first entry that brings it to segment_max_bytes."""
        planned = segment.planned_end
        if planned is not None:
            at = encoder.position
            return at is not None and planned.key() <= at
        return segment.data_len + encoder.pending_bytes >= self.policy.segment_max_bytes

    def _room(self, segment: Segment, encoder: SegmentEncoder) -> int:
        """Framed bytes the segment takes before it is full (a MiB for a planned one)."""
        if segment.planned_end is not None:
            return FEED_BATCH_BYTES
        return self.policy.segment_max_bytes - segment.data_len - encoder.pending_bytes

    def _batches(
        self, segment: Segment, room: Callable[[], int]
    ) -> Iterator[list[tuple[int, int, bytes]]]:
        """Entries after the segment's recorded end, in batches of about a MiB but no more
        than ``room()`` (asked before each batch, so the size limit is met at the entry
        that reaches it), stopping at its planned end."""
        begin = segment.begin if segment.end is None else _after(segment.end)
        batch: list[tuple[int, int, bytes]] = []
        size = 0
        limit = min(FEED_BATCH_BYTES, room())
        if limit <= 0:
            return
        for ledger_id, entry_id, payload in self._entries(begin, segment.planned_end):
            batch.append((ledger_id, entry_id, payload))
            size += len(payload) + ENTRY_FRAME
            if size >= limit:
                yield batch
                batch, size = [], 0
                limit = min(FEED_BATCH_BYTES, room())
                if limit <= 0:
                    return
        if batch:
            yield batch

    def _ledgers(self, begin: Position) -> Iterator[Ledger]:
        """Live ledgers from ``begin`` that the stream takes: not offloaded whole. An
        offloaded ledger after the stream's end was offloaded ledger by ledger, maybe
        rewritten into a rewrite segment since (stream mode): either way it is done."""
        for ledger in self.o.metadata.list_ledgers(self.topic.name, live=True):
            if ledger.ledger_id < begin.ledger_id:
                continue
            if ledger.offload_state is OffloadState.OFFLOADED:
                continue
            yield ledger
            if ledger.state is LedgerState.OPEN:
                return  # nothing is written after the open ledger

    def _entries(self, begin: Position, until: Position | None) -> Iterator[tuple[int, int, bytes]]:
        hot = self.runtime.hot
        for ledger in self._ledgers(begin):
            first = begin.entry_id if ledger.ledger_id == begin.ledger_id else 0
            if ledger.state is LedgerState.OPEN:
                if not hot.exists(ledger.topic, ledger.ledger_id):
                    return
                last = hot.info(ledger.topic, ledger.ledger_id).entry_count - 1  # confirmed
            else:
                last = ledger.entry_count - 1
            if until is not None and ledger.ledger_id == until.ledger_id:
                last = min(last, until.entry_id)
            if first <= last:
                for entry_id, payload in hot.read(ledger.topic, ledger.ledger_id, first, last):
                    yield ledger.ledger_id, entry_id, payload
            if until is not None and ledger.ledger_id >= until.ledger_id:
                return

    def _upload_part(
        self, store: ObjectStore, upload: MultipartUpload, segment: Segment, part: EncodedPart
    ) -> Segment:
        try:
            info = store.upload_part(upload, part.part_id, part.data)
        except ObjectStoreError as err:
            if isinstance(err, ObjectNotFoundError) or "NoSuchUpload" in str(err):
                raise SegmentUploadFailed(f"its upload is gone: {err}") from err
            raise
        failpoints.reach("stream-after-part-upload")
        last = Position(ledger_id=part.last_position[0], entry_id=part.last_position[1])
        self.lease.check()
        segment = self.segments.record_part(
            self.claim,
            segment,
            part_number=part.part_id,
            etag=info.etag,
            offset=part.offset,
            length=part.length,
            last=last,
            blocks=dump_blocks(part.blocks),
        )
        failpoints.reach("stream-after-part-record")
        self.result.parts_uploaded += 1
        self.result.bytes_uploaded += part.length
        return segment

    def _note(self, segment: Segment) -> None:
        self.result.offloaded_to = None if segment.end is None else str(segment.end)

    # --- closing ------------------------------------------------------------------------
    def _finish(self, segment: Segment) -> None:
        """Complete a Closing segment with its recorded parts, write its index, commit."""
        store = self.runtime.stores.get(segment.store_id, f"segment {segment.segment_id}")
        parts = self.segments.parts(segment)
        blocks = [b for p in parts for b in load_blocks(p.blocks)]
        try:
            self._complete(
                store, segment, [PartInfo(p.part_number, p.etag, p.length) for p in parts]
            )
        except SegmentUploadFailed as err:
            self._fail(segment, err)
            return
        failpoints.reach("stream-after-complete")
        self._write_index(store, segment, blocks)
        failpoints.reach("stream-after-index")
        pieces = _pieces(blocks)
        ids = [p.ledger_id for p in pieces]
        before = self.o.metadata.get_ledgers(self.topic.name, ids)
        self.lease.check()
        committed = self.segments.commit(self.claim, segment, pieces)
        failpoints.reach("stream-after-commit")
        after = self.o.metadata.get_ledgers(self.topic.name, ids)
        self.result.settled_ledgers += [
            i for i in ids if after[i].is_offloaded and not before[i].is_offloaded
        ]
        self.result.committed.append(committed.segment_id)
        self.result.open_segment = None  # until the next segment is assigned
        self._note(committed)

    def _fail(self, segment: Segment, err: SegmentUploadFailed) -> None:
        self.lease.check()
        failed = self.segments.fail(self.claim, segment, str(err))
        self.result.failed.append(failed.segment_id)
        log.warning("segment %s failed, to be replaced: %s", segment.segment_id, err)

    def _complete(self, store: ObjectStore, segment: Segment, parts: list[PartInfo]) -> None:
        if self._data_complete(store, segment):
            return  # a pass before this one completed it and died
        upload = MultipartUpload(key=segment.data_key, upload_id=segment.upload_id or "")
        try:
            store.complete_multipart(upload, parts, if_none_match=True)
        except (ObjectStoreError, ValueError) as err:
            if self._data_complete(store, segment):
                return
            permanent = isinstance(err, (ObjectNotFoundError, ObjectExistsError, ValueError))
            text = str(err)
            if permanent or "NoSuchUpload" in text or "InvalidPart" in text:
                raise SegmentUploadFailed(
                    f"its upload cannot be completed with the recorded parts: {text}"
                ) from err
            raise

    @staticmethod
    def _data_complete(store: ObjectStore, segment: Segment) -> bool:
        try:
            info = store.stat(segment.data_key)
        except ObjectNotFoundError:
            return False
        if info.size != segment.data_len:
            raise SegmentUploadFailed(
                f"data object {segment.data_key} holds {info.size} bytes, the recorded parts "
                f"{segment.data_len}"
            )
        return True

    def _write_index(
        self, store: ObjectStore, segment: Segment, blocks: list[SegmentBlockRef]
    ) -> None:
        ledgers = self.o.metadata.get_ledgers(self.topic.name, {b.ledger_id for b in blocks})
        times = {
            lid: (ledger.created_ms, ledger.sealed_ms)
            for lid, ledger in ledgers.items()
            if ledger.sealed_ms is not None
        }
        index = encode_segment_index(blocks, topic=self.topic.name, ledger_times=times)
        metadata = segment_user_metadata(self.topic.name, segment.segment_id, "index")
        try:
            store.put(segment.index_key, index, metadata=metadata, if_none_match=True)
        except ObjectExistsError:
            if store.get(segment.index_key) == index:
                return
            # written by a pass that died after it, when a ledger of the segment was still
            # open: the same blocks, without the seal time it has now. Whoever holds the
            # stream rewrites it; a pass that lost the stream stops here.
            self.lease.check()
            self.segments.renew(self.claim)
            store.put(segment.index_key, index, metadata=metadata)


def _after(position: Position) -> Position:
    return Position(ledger_id=position.ledger_id, entry_id=position.entry_id + 1)


def _pieces(blocks: list[SegmentBlockRef]) -> list[PieceRange]:
    """Per ledger, the first and last entry the segment's blocks hold."""
    ranges: dict[int, list[int]] = {}
    for block in blocks:
        span = ranges.setdefault(block.ledger_id, [block.ref.first_entry_id, block.last_entry_id])
        span[1] = block.last_entry_id
    return [PieceRange(ledger_id, first, last) for ledger_id, (first, last) in ranges.items()]

"""The streaming (v2) segment writer: entries of successive ledgers framed into v2 blocks,
fed pass by pass, finished blocks grouped into multipart parts."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from offloader.exceptions import EntryTooLargeError
from offloader.format.blocks import _BlockBuilder, _check_fits, check_block_args
from offloader.format.layout import (
    _INT32_MAX,
    DEFAULT_CHUNK_TARGET,
    ENTRY_FRAME,
    HEADER_LEN,
    Payload,
)
from offloader.format.segment_layout import (
    _INT64_MAX,
    _SEGMENT_BLOCK_HEADER,
    SEGMENT_BLOCK_MAGIC,
    EncodedPart,
    SegmentBlockRef,
)

Run = tuple[int, list[tuple[int, Payload]]]  # one ledger's consecutive entries of a batch


class _SegmentBlockBuilder(_BlockBuilder):
    """A v1 block builder that writes the v2 header, naming the block's ledger."""

    def __init__(self, ledger_id: int, *args: int) -> None:
        super().__init__(*args)
        self.ledger_id = ledger_id

    def _header(self, length: int) -> bytes:
        return _SEGMENT_BLOCK_HEADER.pack(
            SEGMENT_BLOCK_MAGIC, HEADER_LEN, length, self.first_id, self.ledger_id
        )


class SegmentEncoder:
    """Frames a stream of (ledger_id, entry_id, payload) into one segment's data object.

    A block holds one ledger's entries: a new ledger closes the open block trimmed (no
    padding), an entry that does not fit closes it padded to ``max_block_size`` (as v1).
    Finished blocks are grouped into parts of at least ``min_part_size`` bytes (S3 wants
    5 MiB; 1 makes every block its own part); ``close`` emits the short rest. Memory is
    bounded by about ``min_part_size + max_block_size``.

    A segment outlives a pass: a later pass resumes after the last uploaded part with
    ``next_part_id=part.next_part_id, offset=part.end, after=part.last_position``; entries
    appended but not yet emitted in a part are re-read from the hot tier.
    """

    def __init__(
        self,
        *,
        max_block_size: int,
        min_part_size: int = 1,
        chunk_target: int = DEFAULT_CHUNK_TARGET,
        next_part_id: int = 1,
        offset: int = 0,
        after: tuple[int, int] | None = None,
    ) -> None:
        check_block_args(max_block_size, chunk_target)
        if not 1 <= min_part_size <= _INT32_MAX:
            raise ValueError(f"min_part_size must be 1..{_INT32_MAX}, got {min_part_size}")
        if not 1 <= next_part_id <= _INT32_MAX:
            raise ValueError(f"next_part_id must be 1..{_INT32_MAX}, got {next_part_id}")
        if offset < 0 or (offset == 0) != (next_part_id == 1) or (offset == 0) != (after is None):
            raise ValueError(
                f"resume state offset={offset} next_part_id={next_part_id} after={after}: "
                "a new segment has all three at their defaults, a resumed one none"
            )
        if after is not None:
            _check_position(after)
        self.max_block_size = max_block_size
        self.min_part_size = min_part_size
        self.chunk_target = chunk_target
        self._part_id = next_part_id
        self._offset = offset  # where the next block starts
        self._part_offset = offset
        self._part: list[tuple[SegmentBlockRef, bytes | bytearray]] = []
        self._builder: _SegmentBlockBuilder | None = None
        self._last = after
        self._closed = False

    @property
    def position(self) -> tuple[int, int] | None:
        """The last (ledger_id, entry_id) appended, emitted or not."""
        return self._last

    @property
    def pending_bytes(self) -> int:
        """Bytes held and not yet emitted in a part: finished blocks plus the open one."""
        framed = self._builder.pos if self._builder is not None else 0
        return self._offset - self._part_offset + framed

    def append(self, entries: Iterable[tuple[int, int, Payload]]) -> list[EncodedPart]:
        """Add entries in position order; return the parts they completed.

        The whole batch is checked first: a position out of order or an entry too large
        for a block raises (ValueError, EntryTooLargeError) and nothing is appended.
        """
        if self._closed:
            raise ValueError("the segment encoder is closed: start a new segment")
        runs = self._runs(entries)
        parts: list[EncodedPart] = []
        for ledger_id, run in runs:
            if self._builder is not None and self._builder.ledger_id != ledger_id:
                self._finish_block(parts, last=True)
            self._fill(ledger_id, iter(run), parts)
        if runs:
            self._last = runs[-1][0], runs[-1][1][-1][0]
        return parts

    def close(self) -> list[EncodedPart]:
        """Close-now: the open block trimmed and the rest as the last (short) part."""
        if self._closed:
            raise ValueError("the segment encoder is already closed")
        self._closed = True
        parts: list[EncodedPart] = []
        if self._builder is not None:
            self._finish_block(parts, last=True)
        if self._part:
            self._emit_part(parts)
        return parts

    def _runs(self, entries: Iterable[tuple[int, int, Payload]]) -> list[Run]:
        """Check positions and sizes of a whole batch and split it by ledger.

        The next entry of the same ledger takes the fast path; anything else (the batch's
        first entry, a new ledger, an error) goes through _check_next.
        """
        max_payload = self.max_block_size - HEADER_LEN - ENTRY_FRAME
        ledger, next_id = (-1, -1) if self._last is None else (self._last[0], self._last[1] + 1)
        runs: list[Run] = []
        run: list[tuple[int, Payload]] = []
        for ledger_id, entry_id, payload in entries:
            if entry_id != next_id or ledger_id != ledger or not runs:
                _check_next((ledger, next_id - 1) if ledger >= 0 else None, (ledger_id, entry_id))
                run, ledger = [], ledger_id
                runs.append((ledger_id, run))
            size = len(payload) if type(payload) is bytes else memoryview(payload).nbytes
            if size > max_payload:
                try:
                    _check_fits(entry_id, size, self.max_block_size)
                except EntryTooLargeError as e:
                    raise EntryTooLargeError(f"ledger {ledger_id}: {e}") from None
            run.append((entry_id, payload))
            next_id = entry_id + 1
        for ledger_id, run in runs:  # ids were checked where each run starts, not as they grew
            _check_position((ledger_id, run[-1][0]))
        return runs

    def _fill(
        self, ledger_id: int, entries: Iterator[tuple[int, Payload]], parts: list[EncodedPart]
    ) -> None:
        pending = next(entries, None)
        while pending is not None:
            if self._builder is None:
                self._builder = _SegmentBlockBuilder(
                    ledger_id,
                    self.max_block_size,
                    self.chunk_target,
                    self._part_id,
                    self._offset,
                    pending[0],
                )
            # a fresh block takes at least its first entry: _runs checked every size
            pending = self._builder.fill(itertools.chain((pending,), entries))
            if pending is not None:
                self._finish_block(parts, last=False)

    def _finish_block(self, parts: list[EncodedPart], *, last: bool) -> None:
        builder = self._builder
        assert builder is not None
        self._builder = None
        block = builder.finish(last)
        self._part.append((SegmentBlockRef(builder.ledger_id, block.ref, block.chunks), block.data))
        self._offset += block.ref.length
        if self._offset - self._part_offset >= self.min_part_size:
            self._emit_part(parts)

    def _emit_part(self, parts: list[EncodedPart]) -> None:
        refs = tuple(ref for ref, _ in self._part)
        buffers = tuple(data for _, data in self._part)
        parts.append(EncodedPart(self._part_id, self._part_offset, refs, buffers))
        self._part = []
        self._part_id += 1
        self._part_offset = self._offset


def _check_position(position: tuple[int, int]) -> None:
    ledger_id, entry_id = position
    if not (0 <= ledger_id <= _INT64_MAX and 0 <= entry_id <= _INT64_MAX):
        raise ValueError(f"position {ledger_id}:{entry_id}: ids must be 0..2^63-1")


def _check_next(last: tuple[int, int] | None, position: tuple[int, int]) -> None:
    """A position follows the last: the next entry of its ledger, or any entry of a later
    ledger (a segment may begin, and a ledger may resume, mid-ledger)."""
    _check_position(position)
    if last is None or position[0] > last[0] or position == (last[0], last[1] + 1):
        return
    raise ValueError(
        f"position {position[0]}:{position[1]} does not follow {last[0]}:{last[1]}: a segment "
        "takes entries in position order, entry ids consecutive within a ledger"
    )

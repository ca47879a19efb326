"""Cutting a sequential read into ranged GETs that follow the object's parts.

Each block of a data object is uploaded as one multipart part (docs/FORMAT.md), and an
object store serves a range inside one part more cheaply than one that straddles two.
S3's performance guidance is to GET multipart objects in part-sized or part-aligned
ranges. On SeaweedFS, with 16 MiB parts, the batch read of 2026-11-28 ran at 0.81 of raw
8 MiB GETs while its 9 MiB ranges straddled the parts, and at 0.85-0.90 with the GETs
following them (docs/BENCHMARKS.md). So a plan is made in two steps:

1. the wanted chunks of each block are cut, at chunk boundaries, into
   ``round(span / sequential_range)`` pieces (at least one) of about equal size: a 16 MiB
   block read in 8 MiB ranges is two GETs, one from the block's start, one from its middle;
2. neighbouring pieces share a GET while the range is still short of
   ``sequential_range``, would not grow past ``MAX_RANGE_FACTOR`` times it, and the padding
   between them is at most ``MAX_SKIPPED_GAP`` bytes: small blocks are still read together.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from offloader.format import ChunkRef

MiB = 1024 * 1024
DEFAULT_SEQUENTIAL_RANGE = 8 * MiB
MAX_SKIPPED_GAP = 256 * 1024  # padding a range may fetch rather than split on
MAX_RANGE_FACTOR = 1.5  # how far past sequential_range merging small pieces may go


@dataclass(frozen=True)
class Range:
    """One ranged GET: ``length`` bytes from ``offset``, exactly covering ``chunks``."""

    offset: int
    length: int
    chunks: tuple[ChunkRef, ...]

    @property
    def end(self) -> int:
        return self.offset + self.length


def plan_ranges(chunks: Iterable[ChunkRef], sequential_range: int) -> list[Range]:
    """The GETs for ``chunks`` (in object order, as ``chunks_between`` gives them)."""
    if sequential_range < 1:
        raise ValueError(f"sequential_range must be positive, got {sequential_range}")
    ranges: list[Range] = []
    for piece in _pieces(chunks, sequential_range):
        if ranges and _shares_a_get(ranges[-1], piece, sequential_range):
            ranges[-1] = range_of(ranges[-1].chunks + piece.chunks)
        else:
            ranges.append(piece)
    return ranges


def range_of(chunks: tuple[ChunkRef, ...]) -> Range:
    """The GET from the first chunk's start to the last one's end."""
    return Range(chunks[0].offset, chunks[-1].end - chunks[0].offset, chunks)


def _shares_a_get(current: Range, piece: Range, sequential_range: int) -> bool:
    return (
        current.length < sequential_range
        and piece.end - current.offset <= sequential_range * MAX_RANGE_FACTOR
        and piece.offset - current.end <= MAX_SKIPPED_GAP
    )


def _pieces(chunks: Iterable[ChunkRef], sequential_range: int) -> Iterator[Range]:
    """Each block's chunks in about equal pieces, cut at chunk boundaries."""
    for block in _by_block(chunks):
        span = block[-1].end - block[0].offset
        count = max(1, round(span / sequential_range))
        for _, group in itertools.groupby(block, key=lambda c: _piece_of(c, block, count)):
            yield range_of(tuple(group))


def _piece_of(chunk: ChunkRef, block: list[ChunkRef], count: int) -> int:
    """Which of ``count`` equal pieces of the block's span the chunk's middle falls in: so
    pieces start at the block's start and at the chunk ends nearest the cut points. A
    chunk's middle lies before the block's end (chunks have a length), so the result is
    below ``count``."""
    base = block[0].offset
    twice_span = 2 * (block[-1].end - base)
    twice_middle = 2 * (chunk.offset - base) + chunk.length
    return twice_middle * count // twice_span


def _by_block(chunks: Iterable[ChunkRef]) -> Iterator[list[ChunkRef]]:
    """Runs of chunks of one block: a run ends before a chunk that starts a block."""
    run: list[ChunkRef] = []
    for chunk in chunks:
        if run and chunk.starts_block:
            yield run
            run = []
        run.append(chunk)
    if run:
        yield run

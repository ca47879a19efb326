"""Cutting a merge's blocks into multipart parts (the rules are in merge_plan's
docstring): whole blocks per part, every part but the last at least ``min_part_size``;
big sources copied server side, the rest downloaded."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from offloader.format import SegmentBlockRef
from offloader.objectstore import Capabilities


@dataclass(frozen=True)
class SourceBlock(SegmentBlockRef):
    """A block of source ``source`` (its position in the merge's list), where it is there."""

    source: int

    @property
    def end(self) -> int:
        return self.ref.offset + self.ref.length


def runs(
    blocks: Sequence[SourceBlock], together: Callable[[SourceBlock, SourceBlock], bool]
) -> list[list[SourceBlock]]:
    """``blocks`` in runs: a block joins the run before it when ``together(last, block)``."""
    out: list[list[SourceBlock]] = []
    for b in blocks:
        if out and together(out[-1][-1], b):
            out[-1].append(b)
        else:
            out.append([b])
    return out


@dataclass(frozen=True)
class PlannedPart:
    """Part ``number`` at ``offset`` of the merged object: ``blocks`` copied server side
    (one source, contiguous) or downloaded, checked and uploaded."""

    number: int
    offset: int
    copy: bool
    blocks: tuple[SourceBlock, ...]

    @property
    def length(self) -> int:
        return _size(self.blocks)


class Cutter:
    """Cuts the kept blocks of each source, in order, into parts."""

    def __init__(self, caps: Capabilities, download_part: int) -> None:
        self.min, self.max = caps.min_part_size, caps.max_part_size
        self.download_part = download_part
        self.parts: list[PlannedPart] = []
        self.pending: list[SourceBlock] = []
        self.pending_bytes = 0
        self.offset = 0

    def cut(self, kept: list[list[SourceBlock]], copyable: list[bool]) -> list[PlannedPart]:
        last = max(i for i, blocks in enumerate(kept) if blocks)
        for i, blocks in enumerate(kept):
            if copyable[i] and blocks:
                self._copy(blocks, at_end=i == last)
            else:
                for block in blocks:
                    self._download(block)
        self._flush()
        return self.parts

    def _download(self, block: SourceBlock) -> None:
        size = block.ref.length
        if self.pending_bytes >= self.min and self.pending_bytes + size > self.max:
            self._flush()
        self.pending.append(block)
        self.pending_bytes += size
        if self.pending_bytes >= self.download_part:
            self._flush()

    def _copy(self, blocks: list[SourceBlock], *, at_end: bool) -> None:
        rest = list(blocks)
        while self.pending and self.pending_bytes < self.min and rest:
            self._download(rest.pop(0))  # a short downloaded run takes leading blocks
        if not rest:
            return
        if _size(rest) < self.min and not at_end:
            for block in rest:  # too short to stand as a part: downloaded too
                self._download(block)
            return
        self._flush()
        for piece in self._split(rest, at_end=at_end):
            self._emit(piece, copy=True)

    def _split(self, blocks: list[SourceBlock], *, at_end: bool) -> list[list[SourceBlock]]:
        """One piece if it fits a part; else ``n`` pieces cut at the block boundaries
        nearest to even shares, ``n`` chosen so that a share plus a block fits a part."""
        size, biggest = _size(blocks), max(b.ref.length for b in blocks)
        n = 1 if size <= self.max else -(-size // max(1, self.max - biggest))
        starts = list(itertools.accumulate((b.ref.length for b in blocks[:-1]), initial=0))
        cuts = sorted({_nearest(starts, size * i // n) for i in range(1, n)} - {0})
        pieces = [blocks[i:j] for i, j in itertools.pairwise([0, *cuts, len(blocks)])]
        for k, piece in enumerate(pieces):
            last = at_end and k == len(pieces) - 1
            if _size(piece) > self.max or (_size(piece) < self.min and not last):
                raise ValueError(
                    f"cannot cut {size} bytes of blocks from offset {blocks[0].ref.offset} "
                    f"into parts of {self.min}..{self.max} bytes at block boundaries"
                )
        return pieces

    def _flush(self) -> None:
        if self.pending:
            self._emit(self.pending, copy=False)
            self.pending, self.pending_bytes = [], 0

    def _emit(self, blocks: list[SourceBlock], *, copy: bool) -> None:
        part = PlannedPart(len(self.parts) + 1, self.offset, copy, tuple(blocks))
        self.parts.append(part)
        self.offset += part.length


def _nearest(starts: list[int], at: int) -> int:
    """The index of the block whose start is nearest to ``at``."""
    i = bisect.bisect_left(starts, at)
    if i == len(starts) or (i > 0 and at - starts[i - 1] <= starts[i] - at):
        return i - 1
    return i


def _size(blocks: Sequence[SourceBlock]) -> int:
    return sum(b.ref.length for b in blocks)

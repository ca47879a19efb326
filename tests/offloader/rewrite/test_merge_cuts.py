"""The Cutter's arithmetic on plain block lengths (a pure plan: no store, no bytes): which
blocks make each part, at which offset, copied or downloaded, and where a copied source
bigger than the largest part is cut. The same rules end to end, through a store that
counts its requests, are in test_merge_packing.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from offloader.format import BlockRef
from offloader.objectstore import Capabilities
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.rewrite.merge_parts import Cutter, PlannedPart, SourceBlock


def _limits(min_part: int, max_part: int) -> Capabilities:
    """S3-like part bounds on the filesystem store's own capabilities."""
    return dataclasses.replace(
        FilesystemObjectStore.capabilities, min_part_size=min_part, max_part_size=max_part
    )


def _source(source: int, lengths: Sequence[int]) -> list[SourceBlock]:
    """Consecutive blocks of ``lengths`` bytes from the start of source ``source``."""
    blocks, offset = [], 0
    for n, length in enumerate(lengths):
        blocks.append(SourceBlock(1, BlockRef(1, offset, length, n, 0), (), source=source))
        offset += length
    return blocks


def _plan(parts: list[PlannedPart]) -> list[tuple[int, int, bool, list[tuple[int, int]]]]:
    """Each part as (number, offset, copy, [(source, offset of each block)])."""
    return [
        (p.number, p.offset, p.copy, [(b.source, b.ref.offset) for b in p.blocks]) for p in parts
    ]


def test_a_copied_source_is_cut_at_the_block_start_nearest_each_even_share() -> None:
    """Blocks of 10, 10, 5 and 6 bytes in parts of 6..19 bytes: n = ceil(31 / (19 - 10))
    = 4 shares. The first share ends at 7, nearest the start at 10; the second at 15,
    midway between 10 and 20, and a tie goes to the earlier start (10 again: one cut);
    the third at 23 (23.25 rounded down), nearer 25 than 20. Before it, a downloaded
    source of exactly the download part size is one part, not a copy."""
    downloaded, copied = _source(0, [6, 6]), _source(1, [10, 10, 5, 6])

    parts = Cutter(_limits(6, 19), download_part=12).cut([downloaded, copied], [False, True])

    assert _plan(parts) == [
        (1, 0, False, [(0, 0), (0, 6)]),
        (2, 12, True, [(1, 0)]),
        (3, 22, True, [(1, 10), (1, 20)]),
        (4, 37, True, [(1, 25)]),
    ]

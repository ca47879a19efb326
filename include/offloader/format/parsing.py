"""Reading data bytes: chunks verified and parsed in place, whole blocks the Pulsar way.

Errors carry ``FormatError.offset`` (absolute in the data object where known); readers add
the object's key, topic and ledger.
"""

from __future__ import annotations

import operator
import struct
from array import array
from collections.abc import Iterator

from offloader.exceptions import FormatError
from offloader.format.blocks import _padding
from offloader.format.layout import (
    _BLOCK_HEADER,
    _FRAME,
    _INT32,
    BLOCK_MAGIC,
    ENTRY_FRAME,
    HEADER_LEN,
    BlockRef,
    ChunkRef,
    _as_bytes,
    _crc,
)


def _parse_header(
    data: bytes | memoryview, where: str, at: int = 0, origin: int = 0, magic: int = BLOCK_MAGIC
) -> tuple[int, int]:
    """(block_len, first_entry_id) of a block header at ``data[at:]``; ``data[0]`` is at
    ``origin`` in the object, so errors carry absolute offsets. ``magic`` tells v1 blocks
    from streaming (v2) ones, whose header shares these fields."""
    if len(data) - at < HEADER_LEN:
        raise FormatError(
            f"truncated block header {where}: {max(0, len(data) - at)} bytes of {HEADER_LEN}",
            offset=origin + max(at, len(data)),
        )
    found, header_len, block_len, first = _BLOCK_HEADER.unpack_from(data, at)
    if found != magic:
        raise FormatError(
            f"bad block magic 0x{found:08X} {where}, expected 0x{magic:08X}",
            offset=origin + at,
        )
    if header_len != HEADER_LEN:
        raise FormatError(
            f"bad block header_len {header_len} {where}, expected {HEADER_LEN}",
            offset=origin + at + 4,
        )
    return block_len, first


def _frame_offsets(
    data: bytes | memoryview,
    pos: int,
    count: int,
    first_id: int,
    end: int,
    where: str,
    origin: int,
    starts: array[int],
    lengths: array[int],
) -> int:
    """Check ``count`` frames from ``pos`` with ids running from ``first_id``, all within
    ``data[:end]``; append each payload's start (an index into ``data``) and length. Returns
    where the frames end. Nothing is copied: callers slice payloads out of ``data`` if and
    when they want them.

    ``data[0]`` is at ``origin`` in the object: errors name absolute offsets.
    """
    equal_end = _equal_frames(data, pos, count, first_id, end, starts, lengths)
    if equal_end is not None:
        return equal_end
    return _each_frame(data, pos, count, first_id, end, where, origin, starts, lengths)


def _equal_frames(
    data: bytes | memoryview,
    pos: int,
    count: int,
    first_id: int,
    end: int,
    starts: array[int],
    lengths: array[int],
) -> int | None:
    """:func:`_frame_offsets` without a Python step per entry, for frames that all have the
    first one's payload size (fixed-size records; the usual case within a chunk). If
    ``count`` frames of that size fit in ``data[pos:end]``, the frame headers sit every
    ``12 + size`` bytes: each of their 12 bytes is compared, for all frames at once, by one
    strided slice against the expected length and ids. All equal means each frame says
    exactly what the per-entry loop would have checked, so the offsets are appended and
    the frames' end returned. Otherwise None, nothing appended: :func:`_each_frame` parses
    and names the damage."""
    if pos + ENTRY_FRAME > end:
        return None
    (size,) = _INT32.unpack_from(data, pos)
    stride = ENTRY_FRAME + size
    frames_end = pos + count * stride
    if size < 0 or frames_end > end:
        return None
    length = _INT32.pack(size)
    for k in (3, 2, 1, 0):  # the length's bytes, lowest first: where unequal sizes differ
        if data[pos + k : frames_end : stride] != length[k : k + 1] * count:
            return None
    try:
        ids = struct.pack(f">{count}q", *range(first_id, first_id + count))
    except struct.error:  # ids beyond int64: no frame can hold them
        return None
    for k in range(8):
        if data[pos + 4 + k : frames_end : stride] != ids[k::8]:
            return None
    first_start = pos + ENTRY_FRAME
    starts.frombytes(
        struct.pack(f"={count}q", *range(first_start, first_start + count * stride, stride))
    )
    lengths.extend(array("q", (size,)) * count)
    return frames_end


def _each_frame(
    data: bytes | memoryview,
    pos: int,
    count: int,
    first_id: int,
    end: int,
    where: str,
    origin: int,
    starts: array[int],
    lengths: array[int],
) -> int:
    """:func:`_frame_offsets` one frame at a time: any sizes, and the first damage named."""
    unpack = _FRAME.unpack_from
    add_start, add_length = starts.append, lengths.append
    expected = first_id
    for _ in range(count):
        if pos + ENTRY_FRAME > end:
            raise FormatError(
                f"truncated entry frame {where} at offset {origin + pos} (entry {expected})",
                offset=origin + pos,
            )
        size, entry_id = unpack(data, pos)
        start = pos + ENTRY_FRAME
        if size < 0 or start + size > end:
            raise FormatError(
                f"entry {entry_id} of {size} bytes overruns {where} at offset {origin + start}",
                offset=origin + pos,
            )
        if entry_id != expected:
            raise FormatError(
                f"entry id {entry_id} {where}, expected {expected}", offset=origin + pos
            )
        add_start(start)
        add_length(size)
        pos = start + size
        expected += 1
    return pos


def offsets_arrays() -> tuple[array[int], array[int]]:
    """Empty (starts, lengths) arrays of the type the offset parsers append to."""
    return array("q"), array("q")


def entries_at(
    data: bytes | memoryview, first_id: int, starts: array[int], lengths: array[int]
) -> Iterator[tuple[int, bytes]]:
    """(entry id, payload copy) for payloads at ``starts``/``lengths`` in ``data``, ids
    running from ``first_id``: the per-entry view of what the offset parsers found."""
    ends = map(operator.add, starts, lengths)
    slices = map(slice, starts, ends)
    payloads: Iterator[bytes]
    if isinstance(data, bytes):  # slicing bytes already copies; a view must be copied
        payloads = map(data.__getitem__, slices)
    else:
        payloads = map(bytes, map(data.__getitem__, slices))
    return zip(range(first_id, first_id + len(starts)), payloads, strict=False)


def _count_frames(data: bytes | memoryview, pos: int, end: int) -> int:
    """Frames before the block end or the padding (a negative length), as Pulsar scans.

    A frame that overruns the end is counted, so parsing it reports the damage."""
    count = 0
    while pos + 4 <= end:
        (size,) = _INT32.unpack_from(data, pos)
        if size < 0:
            break
        pos += ENTRY_FRAME + size
        count += 1
    return count


def verify_chunk(data: bytes | memoryview, chunk: ChunkRef, *, at: int | None = None) -> None:
    """Check the length and CRC of one chunk: ``data`` itself, or ``data[at:at+length]``.

    The CRC runs without the GIL: a reader checks in its reading thread while its
    fetching threads keep their GETs going.
    """
    start, end = at or 0, (at or 0) + chunk.length
    if len(data) < end or (at is None and len(data) != chunk.length):
        got = max(0, len(data) - start)
        raise FormatError(
            f"truncated chunk: {got} bytes {_where(chunk)}, expected {chunk.length}",
            offset=chunk.offset + min(got, chunk.length),
        )
    actual = _crc(data if at is None else memoryview(data)[start:end])
    if actual != chunk.crc32c:
        raise FormatError(
            f"CRC mismatch {_where(chunk)} (entries {chunk.first_entry_id}.."
            f"{chunk.last_entry_id}): expected 0x{chunk.crc32c:08X}, got 0x{actual:08X}",
            offset=chunk.offset,
        )


def chunk_offsets(
    data: bytes | memoryview,
    chunk: ChunkRef,
    *,
    block: BlockRef | None = None,
    at: int | None = None,
    into: tuple[array[int], array[int]] | None = None,
    magic: int = BLOCK_MAGIC,
) -> tuple[array[int], array[int]]:
    """Payload starts (indexes into ``data``) and lengths of the entries of a chunk that
    :func:`verify_chunk` passed, without copying a payload. Everything but the CRC is
    checked (the length, the block header, its block_len when ``block`` is given, frames
    inside the chunk, ids running from ``chunk.first_entry_id``, no trailing bytes), so
    even unverified bytes give a FormatError or offsets that the frames really hold.
    ``into`` appends to existing arrays, so the chunks of one ranged GET share one pair
    (after a FormatError they may hold part of the chunk: discard them); otherwise a new
    pair is returned."""
    starts, lengths = offsets_arrays() if into is None else into
    where = _where(chunk)
    start = at or 0
    end = start + chunk.length
    origin = chunk.offset - start
    if len(data) < end:  # verify_chunk says so too; checked here so no parse reads past
        got = max(0, len(data) - start)
        raise FormatError(
            f"truncated chunk: {got} bytes {where}, expected {chunk.length}",
            offset=chunk.offset + got,
        )
    starts_block = chunk.starts_block if block is None else chunk.offset == block.offset
    pos = start
    if starts_block:
        block_len, first = _parse_header(data, where, start, origin, magic)
        if first != chunk.first_entry_id:
            raise FormatError(
                f"block header first_entry_id {first} {where}, chunk says {chunk.first_entry_id}",
                offset=chunk.offset + 20,
            )
        if block is not None and block_len != block.length:
            raise FormatError(
                f"block_len {block_len} {where}, index says {block.length}",
                offset=chunk.offset + 12,
            )
        pos += HEADER_LEN
    pos = _frame_offsets(
        data, pos, chunk.entry_count, chunk.first_entry_id, end, where, origin, starts, lengths
    )
    if pos != end:
        raise FormatError(
            f"{end - pos} trailing bytes after {chunk.entry_count} entries {where}",
            offset=origin + pos,
        )
    return starts, lengths


def parse_chunk(
    data: bytes | memoryview,
    chunk: ChunkRef,
    *,
    block: BlockRef | None = None,
    at: int | None = None,
    magic: int = BLOCK_MAGIC,
) -> list[tuple[int, bytes]]:
    """The entries of a chunk that :func:`verify_chunk` passed (the header and frames are
    still checked: a CRC proves the bytes arrived, not that the writer framed them right)."""
    starts, lengths = chunk_offsets(data, chunk, block=block, at=at, magic=magic)
    return list(entries_at(data, chunk.first_entry_id, starts, lengths))


def decode_chunk(
    data: bytes | memoryview,
    chunk: ChunkRef,
    *,
    block: BlockRef | None = None,
    at: int | None = None,
    magic: int = BLOCK_MAGIC,
) -> list[tuple[int, bytes]]:
    """Verify and parse the bytes of one chunk (a ranged GET of chunk.offset..chunk.end).

    With ``at``, the chunk is ``data[at:at + chunk.length]`` of a larger GET and is read in
    place: only the payloads are copied out.
    """
    verify_chunk(data, chunk, at=at)
    return parse_chunk(data, chunk, block=block, at=at, magic=magic)


def verify_block(data: bytes | memoryview, block: BlockRef) -> None:
    """Check that ``data`` is exactly the block the index describes: its length and its
    CRC32C (header, frames and padding). Bytes moved without parsing (a merge copying
    whole blocks) are checked this way before they are written anywhere."""
    if len(data) != block.length:
        raise FormatError(
            f"truncated block: {len(data)} bytes at offset {block.offset} of the data object, "
            f"expected {block.length}",
            offset=block.offset + min(len(data), block.length),
        )
    if block.crc32c is None:
        raise ValueError(f"block at offset {block.offset}: the index holds no CRC to check")
    actual = _crc(data)
    if actual != block.crc32c:
        raise FormatError(
            f"CRC mismatch in block at offset {block.offset} of the data object (entries from "
            f"{block.first_entry_id}): expected 0x{block.crc32c:08X}, got 0x{actual:08X}",
            offset=block.offset,
        )


def _where(chunk: ChunkRef) -> str:
    return f"in chunk at offset {chunk.offset} of the data object"


def block_offsets(
    data: bytes,
    *,
    entry_count: int | None,
    expected_crc: int | None = None,
    first_entry_id: int | None = None,
    offset: int = 0,
    magic: int = BLOCK_MAGIC,
) -> tuple[int, array[int], array[int]]:
    """Parse a whole block, the Pulsar way: header, then frames, then padding. Returns the
    header's first entry id and the payloads' starts (indexes into ``data``) and lengths;
    no payload is copied.

    ``entry_count`` None scans frames up to the padding or the block end, as Pulsar does when
    a foreign index does not say how many entries the last block holds. ``first_entry_id``
    (from the index) is checked against the header; ``offset`` is the block's position in
    the data object, so errors name absolute offsets. Without ``expected_crc`` (a pure
    Pulsar index) payload bytes cannot be checked; headers, framing and padding still are.
    ``magic`` is the v1 block magic unless segment_parsing reads a v2 block.
    """
    block_len, first = _parse_header(data, "in block", 0, offset, magic)
    if block_len != len(data):
        what = "truncated block" if len(data) < block_len else "block length mismatch"
        raise FormatError(
            f"{what}: header says block_len {block_len}, got {len(data)} bytes",
            offset=offset + min(len(data), max(block_len, 0)),
        )
    if expected_crc is not None:
        actual = _crc(data)
        if actual != expected_crc:
            raise FormatError(
                f"CRC mismatch in block of entries from {first}: "
                f"expected 0x{expected_crc:08X}, got 0x{actual:08X}",
                offset=offset,
            )
    if first_entry_id is not None and first != first_entry_id:
        raise FormatError(
            f"block header first_entry_id {first}, index says {first_entry_id}",
            offset=offset + 20,
        )
    where = f"in block starting at entry {first}"
    if entry_count is None:
        entry_count = _count_frames(data, HEADER_LEN, len(data))
    starts, lengths = offsets_arrays()
    pos = _frame_offsets(
        data, HEADER_LEN, entry_count, first, len(data), where, offset, starts, lengths
    )
    if data[pos:] != _padding(len(data) - pos):
        raise FormatError(
            f"{len(data) - pos} bytes after the last entry {where} are not padding",
            offset=offset + pos,
        )
    return first, starts, lengths


def decode_block(
    data: bytes,
    *,
    entry_count: int | None,
    expected_crc: int | None = None,
    first_entry_id: int | None = None,
    offset: int = 0,
    magic: int = BLOCK_MAGIC,
) -> list[tuple[int, bytes]]:
    """:func:`block_offsets`, with each entry's payload copied out as (id, payload)."""
    data = _as_bytes(data)
    first, starts, lengths = block_offsets(
        data,
        entry_count=entry_count,
        expected_crc=expected_crc,
        first_entry_id=first_entry_id,
        offset=offset,
        magic=magic,
    )
    return list(entries_at(data, first, starts, lengths))

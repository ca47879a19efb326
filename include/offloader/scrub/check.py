"""Scrubbing one offloaded ledger: read every byte of its objects and say what is wrong.

:func:`scrub_ledger` is a pure function of a store and a :class:`ScrubTarget` (the metadata
store's record of the ledger): it only reads, so a Spark executor can run it as well as the
CLI. It GETs the index, HEADs the data object, then reads the data object one block at a
time (a block is at most ``max_block_size``, 64 MiB by default) and checks everything the
format allows (docs/FORMAT.md): block magic, ``header_len``, ``block_len``, the block's
CRC32C, every chunk's CRC32C and frame structure, entry ids running on from the index's
first ids, padding, the object's length; and that the index agrees with the metadata store
(topic, ledger, entry count, last entry id, payload bytes, data object length). A Pulsar
v1 index has no CRCs: its blocks are checked as far as v1 allows and the entries found are
counted against the metadata store. Damage is reported, never raised: one finding per
damaged block, with the object key and the offset the codec names.

A streaming segment (a target with ``segment_id``) is read the same way: its index must be
a v2 segment index (its magic, framing and CRC, ``decode_segment_index``) and agree with
the metadata store (topic, the ledger ranges recorded when the segment was committed, the
data object length); every block is read whole and checked with its chunks' CRCs and
framing and its own CRC, its header's ledger id against the index
(``decode_segment_block``). Every finding's reason names the segment, its ledger is the
block's (else the segment's first).
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Generic, TypeVar

from offloader.exceptions import (
    CorruptObjectError,
    FormatError,
    ObjectNotFoundError,
    ObjectStoreError,
)
from offloader.format import (
    BLOCK_MAGIC,
    SEGMENT_BLOCK_MAGIC,
    BlockRef,
    LedgerIndex,
    SegmentIndex,
    decode_block,
    decode_index,
    decode_segment_block,
    decode_segment_index,
    parse_chunk,
    verify_chunk,
)
from offloader.objectstore import ObjectStore
from offloader.scrub.targets import ScrubTarget

MISSING_INDEX = "missing index object"
MISSING_DATA = "missing data object"


class FindingKind(StrEnum):
    """What kind of damage a finding is (the report's ``kind``; ``reason`` says more)."""

    MISSING_INDEX = "missing-index"
    MISSING_DATA = "missing-data"
    DAMAGED_INDEX = "damaged-index"  # the index fails its own checks (magic, length, CRC)
    TRUNCATED = "truncated"  # the data object is shorter than its index says
    OVERLONG = "overlong"  # the data object is longer than its index says
    DAMAGED_BLOCK = "damaged-block"  # magic, lengths, CRC, framing, ids or padding
    METADATA_MISMATCH = "metadata-mismatch"  # index or data disagree with the metadata store
    UNREADABLE = "unreadable"  # the store failed: nothing is known about the bytes


@dataclass(frozen=True)
class Finding:
    """One thing wrong with a ledger's objects: where (key, offset) and why."""

    topic: str
    ledger_id: int
    key: str
    offset: int | None
    kind: FindingKind
    reason: str

    @property
    def where(self) -> str:
        """The object and, when the damage has one, the offset in it."""
        return self.key if self.offset is None else f"{self.key} offset {self.offset}"

    def __str__(self) -> str:
        return f"{self.topic}/{self.ledger_id} {self.where}: {self.reason}"


@dataclass(frozen=True)
class LedgerScrubResult:
    """What reading one ledger's objects found; counts are what was actually read."""

    target: ScrubTarget
    objects: int  # objects found and read (index, data)
    blocks: int  # blocks read whole
    bytes: int  # bytes read (index and blocks)
    entries: int  # entries in blocks that passed every check
    findings: tuple[Finding, ...]

    @property
    def damaged(self) -> bool:
        return bool(self.findings)


def scrub_ledger(store: ObjectStore, target: ScrubTarget) -> LedgerScrubResult:
    """Read and check every block of ``target``'s objects in ``store`` (a ledger's, or a
    segment's); never raises for damage (store errors become ``unreadable`` findings)."""
    scrub = (
        _LedgerScrub(store, target) if target.segment_id is None else _SegmentScrub(store, target)
    )
    scrub.run()
    return LedgerScrubResult(
        target, scrub.objects, scrub.blocks, scrub.bytes, scrub.entries, tuple(scrub.findings)
    )


# the index a kind of object decodes: a ledger's (v1) or a segment's (v2)
_Index = TypeVar("_Index", LedgerIndex, SegmentIndex)

# (the ledger a segment's block holds, or None; the block; its checker, returning entries)
_BlockCheck = tuple[int | None, BlockRef, Callable[[bytes], int]]


@dataclass
class _ObjectScrub(abc.ABC, Generic[_Index]):
    """The reads and counts a ledger's objects (v1) and a segment's (v2) share; each kind
    decodes its index, compares it with the metadata store and checks its blocks."""

    store: ObjectStore
    target: ScrubTarget
    objects: int = 0
    blocks: int = 0
    bytes: int = 0
    entries: int = 0
    findings: list[Finding] = field(default_factory=list)

    def find(
        self,
        key: str,
        offset: int | None,
        kind: FindingKind,
        reason: str,
        ledger_id: int | None = None,
    ) -> None:
        """``ledger_id``: the ledger a finding in a segment is about (the target's else)."""
        t = self.target
        ledger = t.ledger_id if ledger_id is None else ledger_id
        self.findings.append(Finding(t.topic, ledger, key, offset, kind, reason))

    def run(self) -> None:
        """Index first (decoded, compared with the metadata), then the data object's
        length, then every block; each kind of object supplies the three steps."""
        t = self.target
        raw = self._get_index()
        size = self._data_size()
        if raw is None:
            return
        try:
            index = self._decode(raw)
        except FormatError as err:
            self.find(t.index_key, err.offset or 0, FindingKind.DAMAGED_INDEX, str(err))
            return
        self._compare_index(index)
        if size is None:
            return
        if size != index.data_object_len:
            short = size < index.data_object_len
            self.find(
                t.data_key,
                min(size, index.data_object_len),
                FindingKind.TRUNCATED if short else FindingKind.OVERLONG,
                f"data object is {size} bytes, its index says {index.data_object_len}"
                + (": truncated" if short else ""),
            )
        self._check_blocks(index, size)

    @abc.abstractmethod
    def _decode(self, raw: builtins.bytes) -> _Index:
        """The index object's bytes decoded; FormatError if they are damaged."""

    def _get_index(self) -> builtins.bytes | None:
        key = self.target.index_key
        try:
            raw = self.store.get(key)
        except ObjectNotFoundError:
            self.find(key, None, FindingKind.MISSING_INDEX, MISSING_INDEX)
            return None
        except CorruptObjectError as err:
            self.find(key, 0, FindingKind.DAMAGED_INDEX, f"index object damaged: {err}")
            return None
        except ObjectStoreError as err:
            self.find(key, None, FindingKind.UNREADABLE, f"index object unreadable: {err}")
            return None
        self.objects += 1
        self.bytes += len(raw)
        return raw

    def _data_size(self) -> int | None:
        key = self.target.data_key
        try:
            size = self.store.stat(key).size
        except ObjectNotFoundError:
            self.find(key, None, FindingKind.MISSING_DATA, MISSING_DATA)
            return None
        except CorruptObjectError as err:
            self.find(key, 0, FindingKind.DAMAGED_BLOCK, f"data object damaged: {err}")
            return None
        except ObjectStoreError as err:
            self.find(key, None, FindingKind.UNREADABLE, f"data object unreadable: {err}")
            return None
        self.objects += 1
        return size

    def _compare_index(self, index: _Index) -> None:
        """The index against the metadata store's record of the target: what its kind
        compares, then the data object's length; one finding for each disagreement."""
        t = self.target
        disagree = self._disagreements(index)
        if t.data_len is not None and index.data_object_len != t.data_len:
            disagree.append(
                f"index says the data object is {index.data_object_len} bytes, the metadata "
                f"store recorded {t.data_len}"
            )
        for what in disagree:
            self.find(t.index_key, 0, FindingKind.METADATA_MISMATCH, what)

    @abc.abstractmethod
    def _disagreements(self, index: _Index) -> list[str]:
        """Where the index disagrees with the target in what only its kind records."""

    @abc.abstractmethod
    def _check_blocks(self, index: _Index, size: int) -> None:
        """Every block the object holds whole, checked (through :meth:`_read_blocks`)."""

    def _read_blocks(
        self, checks: Iterable[_BlockCheck], size: int, data_object_len: int, recorded: str
    ) -> None:
        """Read each block and check it with its checker (entries counted); then, if every
        block was clean and the object is whole, its entry count against the metadata."""
        key = self.target.data_key
        clean = True
        for ledger_id, block, check in checks:
            if block.offset + block.length > size:
                return  # the object ends first: reported as truncated above
            try:
                data = self.store.read_range(key, block.offset, block.length)
            except ObjectNotFoundError:
                self.find(key, block.offset, FindingKind.MISSING_DATA, MISSING_DATA, ledger_id)
                return
            except CorruptObjectError as err:
                reason = f"data object damaged: {err}"
                self.find(key, 0, FindingKind.DAMAGED_BLOCK, reason, ledger_id)
                return
            except ObjectStoreError as err:
                reason = f"block unreadable: {err}"
                self.find(key, block.offset, FindingKind.UNREADABLE, reason, ledger_id)
                return
            self.blocks += 1
            self.bytes += len(data)
            try:
                if len(data) != block.length:
                    raise FormatError(
                        f"truncated block: {len(data)} bytes of {block.length}",
                        offset=block.offset + len(data),
                    )
                self.entries += check(data)
            except FormatError as err:
                clean = False
                offset = block.offset if err.offset is None else err.offset
                reason = str(err) if ledger_id is None else f"ledger {ledger_id}: {err}"
                self.find(key, offset, FindingKind.DAMAGED_BLOCK, reason, ledger_id)
        found = self.entries
        if clean and size == data_object_len and found != self.target.entry_count:
            self.find(
                key,
                None,
                FindingKind.METADATA_MISMATCH,
                f"data object holds {found} entries, {recorded} {self.target.entry_count}",
            )


@dataclass
class _LedgerScrub(_ObjectScrub[LedgerIndex]):
    """A ledger's own objects (v1)."""

    def _decode(self, raw: builtins.bytes) -> LedgerIndex:
        return decode_index(raw)

    def _disagreements(self, index: LedgerIndex) -> list[str]:
        """The index against the metadata store's record of the ledger."""
        t = self.target
        disagree: list[str] = []
        meta = index.metadata
        if meta is not None:
            if (meta.topic, meta.ledger_id) != (t.topic, t.ledger_id):
                disagree.append(f"index is of ledger {meta.topic}/{meta.ledger_id}")
            if (meta.entry_count, meta.last_entry_id) != (t.entry_count, t.entry_count - 1):
                disagree.append(
                    f"index says {meta.entry_count} entries ending at {meta.last_entry_id}, "
                    f"the metadata store {t.entry_count} ending at {t.entry_count - 1}"
                )
            if meta.length != t.size_bytes:
                disagree.append(
                    f"index says {meta.length} payload bytes, the metadata store {t.size_bytes}"
                )
        if index.first_entry_id != 0:
            disagree.append(f"index starts at entry {index.first_entry_id}, not 0")
        return disagree

    def _check_blocks(self, index: LedgerIndex, size: int) -> None:
        """Every block the object holds whole, one GET (and one block in memory) each."""
        checks = (
            (None, block, partial(_check_block, index, i, block))
            for i, block in enumerate(index.blocks)
        )
        self._read_blocks(checks, size, index.data_object_len, "the metadata store says")


@dataclass
class _SegmentScrub(_ObjectScrub[SegmentIndex]):
    """The same reads and counts for a streaming segment's objects (v2)."""

    def find(
        self,
        key: str,
        offset: int | None,
        kind: FindingKind,
        reason: str,
        ledger_id: int | None = None,
    ) -> None:
        reason = f"segment {self.target.segment_id}: {reason}"
        super().find(key, offset, kind, reason, ledger_id)

    def _decode(self, raw: bytes) -> SegmentIndex:
        return decode_segment_index(raw)

    def _disagreements(self, index: SegmentIndex) -> list[str]:
        t = self.target
        disagree: list[str] = []
        if index.topic != t.topic:
            disagree.append(f"index is of topic {index.topic!r}")
        ranges = tuple(
            (ledger_id, ledger.first_entry_id, ledger.last_entry_id)
            for ledger_id, ledger in zip(index.ledger_ids, index.ledgers, strict=True)
        )
        if ranges != t.pieces:
            disagree.append(
                f"index holds {_ranges(ranges)}, the metadata store recorded {_ranges(t.pieces)}"
            )
        return disagree

    def _check_blocks(self, index: SegmentIndex, size: int) -> None:
        checks = (
            (ledger_id, block, partial(_check_segment_block, ledger_id, ledger, i, block))
            for ledger_id, ledger in zip(index.ledger_ids, index.ledgers, strict=True)
            for i, block in enumerate(ledger.blocks)
        )
        self._read_blocks(checks, size, index.data_object_len, "the metadata store's ranges")


def _ranges(ranges: tuple[tuple[int, int, int | None], ...]) -> str:
    if not ranges:
        return "no entries"
    return ", ".join(f"{ledger}:{first}..{ledger}:{last}" for ledger, first, last in ranges)


def _check_segment_block(
    ledger_id: int, ledger: LedgerIndex, i: int, block: BlockRef, data: bytes
) -> int:
    """:func:`_check_block` for a v2 block of ``ledger_id``: its chunks, then the whole
    block with its CRC and the ledger id in its header."""
    count = _check_chunks(ledger, i, block, data, SEGMENT_BLOCK_MAGIC)
    entries = decode_segment_block(
        data,
        ledger_id=ledger_id,
        entry_count=count,
        expected_crc=block.crc32c,
        first_entry_id=block.first_entry_id,
        offset=block.offset,
    )
    return len(entries)


def _check_block(index: LedgerIndex, i: int, block: BlockRef, data: bytes) -> int:
    """Check one whole block; its entry count. FormatError (absolute offset) if damaged.

    With our index every chunk is verified first (its CRC pins damage to a chunk, its
    frames must fit the chunk table), then the block as a whole (its CRC also covers the
    padding). A Pulsar index says nothing of the last block's count: it is scanned.
    """
    count = _check_chunks(index, i, block, data, BLOCK_MAGIC)
    entries = decode_block(
        data,
        entry_count=count,
        expected_crc=block.crc32c,
        first_entry_id=block.first_entry_id,
        offset=block.offset,
    )
    return len(entries)


def _check_chunks(
    index: LedgerIndex, i: int, block: BlockRef, data: bytes, magic: int
) -> int | None:
    """Verify and parse every chunk of ``index``'s block ``i`` (whose bytes are ``data``;
    ``magic`` tells a v1 block from a v2 one); the entries the block holds by the index,
    None for a Pulsar index's last block (it says nothing of its count)."""
    for chunk in index.chunks_for_block(block):
        at = chunk.offset - block.offset
        verify_chunk(data, chunk, at=at)
        parse_chunk(data, chunk, block=block, at=at, magic=magic)
    if i + 1 < len(index.blocks):
        return index.blocks[i + 1].first_entry_id - block.first_entry_id
    if index.last_entry_id is not None:
        return index.last_entry_id + 1 - block.first_entry_id
    return None  # foreign metadata: scan to the padding, as Pulsar does

"""The files of one hot-tier ledger: their names, byte layout, and how they are written,
sealed and read back. :mod:`offloader.hottier.filestore` holds the writer and the store on top.

Layout under ``root``::

    <encoded topic>/<ledger_id:020d>.log    records [u32 len][i64 entry id][u32 crc32c][payload]
    <encoded topic>/<ledger_id:020d>.idx    one u64 file offset per entry (written at seal)
    <encoded topic>/<ledger_id:020d>.seal   seal marker: the ledger is immutable
    <encoded topic>/topic.name              the topic name, only for hashed (long) folder names

Topic folder names and the name file: :mod:`offloader.hottier.names`.

All integers are big-endian. Durability: appends are buffered and *not* fsynced per entry;
an entry is durable once :meth:`FileWritableLedger.seal` (or ``sync()``) returns. After a
crash, :meth:`FileLedgerStore.open_for_append` cuts off the torn tail (a partial record, a
CRC mismatch or an out-of-sequence id) and appending continues with the next id.

Sealing is ordered so that a crash at any point leaves either an unsealed ledger (the idx
is simply rewritten by the next seal) or a fully sealed one: fsync the log, write and fsync
the idx, publish the marker atomically (temp file, ``os.replace``, fsync of the folder),
then chmod the files 0444.
"""

from __future__ import annotations

import array
import contextlib
import os
import re
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import crc32c

from offloader.exceptions import FormatError, HotLedgerMissingError
from offloader.fsutil import fsync_dir

RECORD_HEADER = struct.Struct(">IqI")  # payload_len, entry_id, crc32c(payload)
_OFFSET = struct.Struct(">Q")
_MARKER = struct.Struct(">4sHQQQI")  # magic, version, entries, size, log length, crc(idx)
_CRC = struct.Struct(">I")
_MARKER_MAGIC = b"HLSM"
_MARKER_VERSION = 1
_MAX_LEDGER_ID = 2**63 - 1
READ_BUFFER = 1024 * 1024
FILE_MODE = 0o644
_SEALED_MODE = 0o444
LOG_NAME = re.compile(r"^(\d{20})\.log$")


# --- small file-system helpers --------------------------------------------------------
def remove_if_present(path: Path) -> None:
    """Remove a file if present; sealed files are read-only, which some systems refuse."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except PermissionError:
        os.chmod(path, FILE_MODE)
        os.unlink(path)


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """Buffered writes fail without a file name (ENOSPC, EIO); add the ledger's log path."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_file_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (replacing it) and fsync the file, not the folder."""
    remove_if_present(path)  # a leftover may be read-only
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


# --- ledger ids and file names --------------------------------------------------------
def check_ledger_id(ledger_id: int) -> None:
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool):
        raise TypeError(f"ledger id must be an int, not {type(ledger_id).__name__}")
    if not 0 <= ledger_id <= _MAX_LEDGER_ID:
        raise ValueError(f"ledger id {ledger_id} out of range 0..{_MAX_LEDGER_ID}")


@dataclass(frozen=True)
class LedgerPaths:
    """The files of one ledger."""

    topic: str
    ledger_id: int
    folder: Path

    @property
    def name(self) -> str:
        return f"ledger {self.ledger_id} of topic {self.topic!r}"

    def _file(self, suffix: str) -> Path:
        return self.folder / f"{self.ledger_id:020d}{suffix}"

    @property
    def log(self) -> Path:
        return self._file(".log")

    @property
    def idx(self) -> Path:
        return self._file(".idx")

    @property
    def seal(self) -> Path:
        return self._file(".seal")

    @property
    def seal_tmp(self) -> Path:
        return self._file(".seal.tmp")

    def sidecars(self) -> tuple[Path, ...]:
        return (self.idx, self.seal_tmp, self.seal)


# --- seal marker and idx --------------------------------------------------------------
@dataclass(frozen=True)
class SealMarker:
    entry_count: int
    size_bytes: int
    log_length: int
    idx_crc: int

    def to_bytes(self) -> bytes:
        body = _MARKER.pack(
            _MARKER_MAGIC,
            _MARKER_VERSION,
            self.entry_count,
            self.size_bytes,
            self.log_length,
            self.idx_crc,
        )
        return body + _CRC.pack(crc32c.crc32c(body))

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> SealMarker:
        if len(data) != _MARKER.size + _CRC.size:
            raise FormatError(f"seal marker of {where}: {len(data)} bytes, bad length")
        body, (crc,) = data[: _MARKER.size], _CRC.unpack(data[_MARKER.size :])
        if crc32c.crc32c(body) != crc:
            raise FormatError(f"seal marker of {where}: CRC mismatch")
        magic, version, count, size, length, idx_crc = _MARKER.unpack(body)
        if magic != _MARKER_MAGIC or version != _MARKER_VERSION:
            raise FormatError(f"seal marker of {where}: bad magic/version {magic!r}/{version}")
        return cls(count, size, length, idx_crc)


def read_marker(paths: LedgerPaths) -> SealMarker | None:
    """The seal marker, or None while the ledger is unsealed."""
    try:
        data = paths.seal.read_bytes()
    except FileNotFoundError:
        return None
    return SealMarker.from_bytes(data, paths.name)


def idx_bytes(offsets: array.array) -> bytes:
    """The idx file contents: the offsets as big-endian uint64."""
    swapped = array.array("Q", offsets)
    if sys.byteorder == "little":
        swapped.byteswap()
    return swapped.tobytes()


def write_idx(paths: LedgerPaths, data: bytes) -> None:
    """Seal step 2: the sidecar offsets file (a leftover of an interrupted seal is replaced)."""
    write_file_durably(paths.idx, data)


def publish_marker(paths: LedgerPaths, marker: SealMarker) -> None:
    """Seal step 3, the commit point: the marker appears atomically and durably."""
    write_file_durably(paths.seal_tmp, marker.to_bytes())
    os.replace(paths.seal_tmp, paths.seal)
    fsync_dir(paths.folder)


def make_read_only(paths: LedgerPaths) -> None:
    """Seal step 4: guard the immutable files against accidental writes."""
    for path in (paths.log, paths.idx, paths.seal):
        os.chmod(path, _SEALED_MODE)


def check_sealed_files(paths: LedgerPaths, marker: SealMarker) -> None:
    """Cheap consistency check (two stats) before trusting a sealed ledger's idx."""
    try:
        log_size = paths.log.stat().st_size
        idx_size = paths.idx.stat().st_size
    except FileNotFoundError:
        raise HotLedgerMissingError(f"{paths.name} is missing") from None
    if log_size != marker.log_length or idx_size != _OFFSET.size * marker.entry_count:
        raise FormatError(
            f"{paths.name}: log is {log_size} bytes (sealed at {marker.log_length}), "
            f"idx is {idx_size} bytes (expected {_OFFSET.size * marker.entry_count})"
        )


# --- log records ----------------------------------------------------------------------
@dataclass
class LogScan:
    """The valid prefix of a log: where each good record starts and where they end."""

    offsets: array.array
    size_bytes: int
    length: int


def scan_log(file: BinaryIO, file_size: int) -> LogScan:
    """Walk the log from the start and stop at the first torn or out-of-sequence record."""
    file.seek(0)
    offsets = array.array("Q")
    size = pos = 0
    while True:
        header = file.read(RECORD_HEADER.size)
        if len(header) < RECORD_HEADER.size:
            break
        length, entry_id, crc = RECORD_HEADER.unpack(header)
        # the length check also keeps a garbage header from allocating gigabytes
        if entry_id != len(offsets) or pos + RECORD_HEADER.size + length > file_size:
            break
        payload = file.read(length)
        if len(payload) < length or crc32c.crc32c(payload) != crc:
            break
        offsets.append(pos)
        size += length
        pos += RECORD_HEADER.size + length
    return LogScan(offsets, size, pos)


def iter_records(
    paths: LedgerPaths, offset: int, limit: int, first: int, last: int
) -> Iterator[tuple[int, bytes]]:
    """Read entries ``first..last`` sequentially from ``offset``; every record is verified."""
    try:
        file = open(paths.log, "rb", buffering=READ_BUFFER)  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise HotLedgerMissingError(f"{paths.name} is missing") from None
    with file:
        file.seek(offset)
        pos = offset
        for expected in range(first, last + 1):
            header = file.read(RECORD_HEADER.size)
            if len(header) < RECORD_HEADER.size:
                raise FormatError(f"{paths.name}: truncated record header at {pos}")
            length, entry_id, crc = RECORD_HEADER.unpack(header)
            if entry_id != expected:
                raise FormatError(f"{paths.name}: entry {entry_id} at {pos}, wanted {expected}")
            if pos + RECORD_HEADER.size + length > limit:
                raise FormatError(f"{paths.name}: entry {entry_id} runs past the log end")
            payload = file.read(length)
            if len(payload) < length or crc32c.crc32c(payload) != crc:
                raise FormatError(f"{paths.name}: entry {entry_id} at {pos} is corrupt")
            pos += RECORD_HEADER.size + length
            yield entry_id, payload


def iter_sealed(
    paths: LedgerPaths, marker: SealMarker, first: int, last: int
) -> Iterator[tuple[int, bytes]]:
    """Seek once through the idx, then read sequentially."""
    try:
        with open(paths.idx, "rb", buffering=0) as idx:
            raw = os.pread(idx.fileno(), _OFFSET.size, _OFFSET.size * first)
    except FileNotFoundError:
        raise HotLedgerMissingError(f"{paths.name} is missing") from None
    if len(raw) != _OFFSET.size:
        raise FormatError(f"{paths.name}: idx too short for entry {first}")
    (offset,) = _OFFSET.unpack(raw)
    yield from iter_records(paths, offset, marker.log_length, first, last)


def check_range(paths: LedgerPaths, count: int, first: int, last: int | None) -> tuple[int, int]:
    """Resolve ``last`` and validate; ``last=None`` allows the empty tail ``first == count``."""
    if last is None:
        if not 0 <= first <= count:
            raise ValueError(f"first={first} out of range 0..{count} for {paths.name}")
        return first, count - 1
    if not 0 <= first <= last < count:
        raise ValueError(
            f"range {first}..{last} out of range 0..{count - 1} for {paths.name} ({count} entries)"
        )
    return first, last

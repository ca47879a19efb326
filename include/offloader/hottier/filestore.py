"""A hot tier on the local file system: one folder per topic, one log file per ledger.

Layout under ``root``::

    <encoded topic>/<ledger_id:020d>.log    records [u32 len][i64 entry id][u32 crc32c][payload]
    <encoded topic>/<ledger_id:020d>.idx    one u64 file offset per entry (written at seal)
    <encoded topic>/<ledger_id:020d>.seal   seal marker: the ledger is immutable
    <encoded topic>/topic.name              the topic name, only for hashed (long) folder names

All integers are big-endian. Durability: appends are buffered and *not* fsynced per entry;
an entry is durable once :meth:`FileWritableLedger.seal` (or ``sync()``) returns. After a
crash, :meth:`FileLedgerStore.open_for_append` cuts off the torn tail (a partial record, a
CRC mismatch or an out-of-sequence id) and appending continues with the next id.

Sealing is ordered so that a crash at any point leaves either an unsealed ledger (the idx
is simply rewritten by the next seal) or a fully sealed one: fsync the log, write and fsync
the idx, publish the marker atomically (temp file, ``os.replace``, fsync of the folder),
then chmod the files 0444.

Only one writer may hold a ledger open; this is enforced with ``flock`` and a second writer
gets :class:`~offloader.exceptions.LedgerInUseError`.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import hashlib
import os
import re
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import crc32c

from offloader.exceptions import (
    AlreadyExistsError,
    FormatError,
    HotLedgerMissingError,
    LedgerInUseError,
    LedgerSealedError,
)
from offloader.fsutil import fsync_dir
from offloader.hottier import MAX_ENTRY_BYTES, HotLedgerStore, LedgerInfo, WritableLedger

__all__ = ["FileLedgerStore", "FileWritableLedger", "decode_topic", "encode_topic"]

RECORD_HEADER = struct.Struct(">IqI")  # payload_len, entry_id, crc32c(payload)
_OFFSET = struct.Struct(">Q")
_MARKER = struct.Struct(">4sHQQQI")  # magic, version, entries, size, log length, crc(idx)
_CRC = struct.Struct(">I")
_MARKER_MAGIC = b"HLSM"
_MARKER_VERSION = 1
_MAX_LEDGER_ID = 2**63 - 1
_WRITE_BUFFER = 256 * 1024
_READ_BUFFER = 1024 * 1024
_FILE_MODE = 0o644
_SEALED_MODE = 0o444

# Topic folder names: lowercase letters, digits and "-_." pass through, every other byte of
# the UTF-8 form becomes %XX (uppercase hex). Uppercase letters are escaped so that names
# that differ only in case stay apart on case-insensitive file systems too.
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")
_HEX = frozenset("0123456789ABCDEF")
_MAX_ENCODED = 200  # well below NAME_MAX (255); longer names are hashed
_HASHED_PREFIX = "~h-"  # "~" never appears in an escaped name
_NAME_FILE = "topic.name"
_LOG_NAME = re.compile(r"^(\d{20})\.log$")


# --- topic names ----------------------------------------------------------------------
def encode_topic(topic: str) -> str:
    """The folder name for ``topic``: reversible, collision-free and safe on any file system."""
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic must be a non-empty string, not {topic!r}")
    parts: list[str] = []
    for i, ch in enumerate(topic):
        if ch in _SAFE and not (i == 0 and ch == "."):  # no hidden folders, no "." or ".."
            parts.append(ch)
        else:
            parts.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    encoded = "".join(parts)
    if len(encoded) > _MAX_ENCODED:
        return _HASHED_PREFIX + hashlib.sha256(topic.encode("utf-8")).hexdigest()
    return encoded


def decode_topic(folder: str) -> str:
    """The topic of an escaped folder name; ValueError for hashed or foreign names."""
    raw = bytearray()
    i = 0
    while i < len(folder):
        ch = folder[i]
        if ch == "%" and i + 2 < len(folder) and set(folder[i + 1 : i + 3]) <= _HEX:
            raw.append(int(folder[i + 1 : i + 3], 16))
            i += 3
        elif ch in _SAFE:
            raw.append(ord(ch))
            i += 1
        else:
            raise ValueError(f"not an encoded topic folder: {folder!r}")
    topic = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if encode_topic(topic) != folder:  # only the canonical form is ours
        raise ValueError(f"not an encoded topic folder: {folder!r}")
    return topic


# --- small file-system helpers --------------------------------------------------------
def _unlink(path: Path) -> None:
    """Remove a file if present; sealed files are read-only, which some systems refuse."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except PermissionError:
        os.chmod(path, _FILE_MODE)
        os.unlink(path)


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Buffered writes fail without a file name (ENOSPC, EIO); add the ledger's log path."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def _write_file_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (replacing it) and fsync the file, not the folder."""
    _unlink(path)  # a leftover may be read-only
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(file: BinaryIO, what: str) -> None:
    """Take the single-writer lock; released when the file is closed."""
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        raise LedgerInUseError(f"{what} is open by another writer") from None


def _check_ledger_id(ledger_id: int) -> None:
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool):
        raise TypeError(f"ledger id must be an int, not {type(ledger_id).__name__}")
    if not 0 <= ledger_id <= _MAX_LEDGER_ID:
        raise ValueError(f"ledger id {ledger_id} out of range 0..{_MAX_LEDGER_ID}")


@dataclass(frozen=True)
class _Paths:
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
class _Marker:
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
    def from_bytes(cls, data: bytes, where: str) -> _Marker:
        if len(data) != _MARKER.size + _CRC.size:
            raise FormatError(f"seal marker of {where}: {len(data)} bytes, bad length")
        body, (crc,) = data[: _MARKER.size], _CRC.unpack(data[_MARKER.size :])
        if crc32c.crc32c(body) != crc:
            raise FormatError(f"seal marker of {where}: CRC mismatch")
        magic, version, count, size, length, idx_crc = _MARKER.unpack(body)
        if magic != _MARKER_MAGIC or version != _MARKER_VERSION:
            raise FormatError(f"seal marker of {where}: bad magic/version {magic!r}/{version}")
        return cls(count, size, length, idx_crc)


def _read_marker(paths: _Paths) -> _Marker | None:
    """The seal marker, or None while the ledger is unsealed."""
    try:
        data = paths.seal.read_bytes()
    except FileNotFoundError:
        return None
    return _Marker.from_bytes(data, paths.name)


def _idx_bytes(offsets: array.array) -> bytes:
    """The idx file contents: the offsets as big-endian uint64."""
    swapped = array.array("Q", offsets)
    if sys.byteorder == "little":
        swapped.byteswap()
    return swapped.tobytes()


def _write_idx(paths: _Paths, data: bytes) -> None:
    """Seal step 2: the sidecar offsets file (a leftover of an interrupted seal is replaced)."""
    _write_file_durably(paths.idx, data)


def _publish_marker(paths: _Paths, marker: _Marker) -> None:
    """Seal step 3, the commit point: the marker appears atomically and durably."""
    _write_file_durably(paths.seal_tmp, marker.to_bytes())
    os.replace(paths.seal_tmp, paths.seal)
    fsync_dir(paths.folder)


def _make_read_only(paths: _Paths) -> None:
    """Seal step 4: guard the immutable files against accidental writes."""
    for path in (paths.log, paths.idx, paths.seal):
        os.chmod(path, _SEALED_MODE)


def _check_sealed_files(paths: _Paths, marker: _Marker) -> None:
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
class _Scan:
    """The valid prefix of a log: where each good record starts and where they end."""

    offsets: array.array
    size_bytes: int
    length: int


def _scan(file: BinaryIO, file_size: int) -> _Scan:
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
    return _Scan(offsets, size, pos)


def _iter_records(
    paths: _Paths, offset: int, limit: int, first: int, last: int
) -> Iterator[tuple[int, bytes]]:
    """Read entries ``first..last`` sequentially from ``offset``; every record is verified."""
    try:
        file = open(paths.log, "rb", buffering=_READ_BUFFER)  # noqa: SIM115 - closed below
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


def _iter_sealed(
    paths: _Paths, marker: _Marker, first: int, last: int
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
    yield from _iter_records(paths, offset, marker.log_length, first, last)


def _check_range(paths: _Paths, count: int, first: int, last: int | None) -> tuple[int, int]:
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


# --- writer ---------------------------------------------------------------------------
class FileWritableLedger(WritableLedger):
    """An open ledger file. Appends are buffered: call :meth:`sync` or :meth:`seal` to make
    them durable. Usable as a context manager (closes without sealing)."""

    def __init__(self, paths: _Paths, file: BinaryIO, scan: _Scan) -> None:
        self._paths = paths
        self._file: BinaryIO | None = file
        self._offsets = scan.offsets
        self._size = scan.size_bytes
        self._length = scan.length
        self._sealed = False
        self._broken = False

    def __enter__(self) -> FileWritableLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._file is None

    def _open_file(self) -> BinaryIO:
        if self._sealed:
            raise LedgerSealedError(f"{self._paths.name} is sealed")
        if self._file is None:
            raise ValueError(f"{self._paths.name} is closed")
        if self._broken:
            raise OSError(f"{self._paths.name}: an earlier write failed; reopen to recover")
        return self._file

    def append(self, payload: bytes) -> int:
        file = self._open_file()
        if not isinstance(payload, bytes):
            payload = bytes(memoryview(payload))  # bytearray, memoryview; str is a TypeError
        if len(payload) > MAX_ENTRY_BYTES:
            raise ValueError(f"entry of {len(payload)} bytes exceeds {MAX_ENTRY_BYTES}")
        entry_id = len(self._offsets)
        header = RECORD_HEADER.pack(len(payload), entry_id, crc32c.crc32c(payload))
        try:
            with _naming(self._paths.log):
                file.write(header)
                file.write(payload)
        except BaseException:
            self._broken = True  # the buffer may hold half a record
            raise
        self._offsets.append(self._length)
        self._length += RECORD_HEADER.size + len(payload)
        self._size += len(payload)
        return entry_id

    def sync(self) -> None:
        """Make every entry appended so far durable (flush + fsync)."""
        file = self._open_file()
        try:
            with _naming(self._paths.log):
                file.flush()
                os.fsync(file.fileno())
        except BaseException:
            self._broken = True  # what reached the disk is unknown; reopen cuts a torn tail
            raise

    def seal(self) -> LedgerInfo:
        if self._sealed:
            return self.info()
        self.sync()
        data = _idx_bytes(self._offsets)
        with _naming(self._paths.idx):
            _write_idx(self._paths, data)
        marker = _Marker(len(self._offsets), self._size, self._length, crc32c.crc32c(data))
        with _naming(self._paths.seal):
            _publish_marker(self._paths, marker)
        self._sealed = True
        self._release()
        _make_read_only(self._paths)
        return self.info()

    def info(self) -> LedgerInfo:
        """From memory: counts every appended entry, durable or not."""
        return LedgerInfo(
            topic=self._paths.topic,
            ledger_id=self._paths.ledger_id,
            entry_count=len(self._offsets),
            size_bytes=self._size,
            sealed=self._sealed,
        )

    def close(self) -> None:
        """Flush (no fsync) and release the file and the writer lock. Idempotent."""
        self._release()

    def _release(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        try:
            if not self._broken:
                with _naming(self._paths.log):
                    file.flush()
        finally:
            if self._broken:  # closing flushes again; what is left of the buffer is torn
                with contextlib.suppress(OSError):
                    file.close()
            else:
                file.close()


# --- store ----------------------------------------------------------------------------
class FileLedgerStore(HotLedgerStore):
    """Ledgers as files under ``root``; see the module docstring for layout and durability."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"FileLedgerStore({str(self.root)!r})"

    # paths
    def topic_dir(self, topic: str) -> Path:
        """The folder of ``topic`` (whether or not it exists)."""
        return self.root / encode_topic(topic)

    def _paths(self, topic: str, ledger_id: int) -> _Paths:
        _check_ledger_id(ledger_id)
        return _Paths(topic, ledger_id, self.topic_dir(topic))

    def _ensure_topic_dir(self, paths: _Paths) -> None:
        """Create the topic folder durably; hashed folders also record the topic name."""
        if not paths.folder.is_dir():
            paths.folder.mkdir(exist_ok=True)
            fsync_dir(self.root)
        if paths.folder.name.startswith(_HASHED_PREFIX):
            self._ensure_name_file(paths.folder, paths.topic)

    @staticmethod
    def _ensure_name_file(folder: Path, topic: str) -> None:
        name_file = folder / _NAME_FILE
        try:
            stored = name_file.read_text("utf-8")
        except FileNotFoundError:
            tmp = folder / (_NAME_FILE + ".tmp")
            _write_file_durably(tmp, topic.encode("utf-8"))
            os.replace(tmp, name_file)
            fsync_dir(folder)
            return
        if stored != topic:
            raise FormatError(f"folder {folder} belongs to topic {stored!r}, not {topic!r}")

    # HotLedgerStore
    def create(self, topic: str, ledger_id: int) -> FileWritableLedger:
        paths = self._paths(topic, ledger_id)
        for _ in range(5):  # a concurrent delete may remove the empty topic folder under us
            self._ensure_topic_dir(paths)
            if not paths.log.exists():
                for stale in paths.sidecars():  # leftovers of an interrupted delete
                    _unlink(stale)
            try:
                fd = os.open(
                    paths.log, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE
                )
            except FileExistsError:
                raise AlreadyExistsError(f"{paths.name} exists already") from None
            except FileNotFoundError:
                continue
            break
        else:
            raise OSError(f"could not create {paths.name}: its folder keeps disappearing")
        file = open(fd, "r+b", buffering=_WRITE_BUFFER)  # noqa: SIM115 - owned by the writer
        _lock(file, paths.name)
        fsync_dir(paths.folder)
        return FileWritableLedger(paths, file, _Scan(array.array("Q"), 0, 0))

    def open_for_append(self, topic: str, ledger_id: int) -> FileWritableLedger:
        """Reopen an unsealed ledger; a torn tail is truncated away (and fsynced)."""
        paths = self._paths(topic, ledger_id)
        self._refuse_sealed(paths)
        try:
            file = open(paths.log, "r+b", buffering=_WRITE_BUFFER)  # noqa: SIM115
        except FileNotFoundError:
            raise HotLedgerMissingError(f"{paths.name} does not exist") from None
        _lock(file, paths.name)
        try:
            self._refuse_sealed(paths)  # sealed while we waited for the lock
            scan = _scan(file, os.fstat(file.fileno()).st_size)
            if scan.length < os.fstat(file.fileno()).st_size:
                file.truncate(scan.length)
                os.fsync(file.fileno())
            for stale in paths.sidecars():  # an interrupted seal; the next seal rewrites them
                _unlink(stale)
            file.seek(scan.length)
        except BaseException:
            file.close()
            raise
        return FileWritableLedger(paths, file, scan)

    @staticmethod
    def _refuse_sealed(paths: _Paths) -> None:
        if _read_marker(paths) is not None and paths.log.exists():
            raise LedgerSealedError(f"{paths.name} is sealed")

    def info(self, topic: str, ledger_id: int) -> LedgerInfo:
        """For an unsealed ledger: the durable-looking prefix, ignoring a torn tail."""
        paths = self._paths(topic, ledger_id)
        marker, scan = self._state(paths)
        if marker is not None:
            return LedgerInfo(topic, ledger_id, marker.entry_count, marker.size_bytes, True)
        assert scan is not None
        return LedgerInfo(topic, ledger_id, len(scan.offsets), scan.size_bytes, False)

    def _state(self, paths: _Paths) -> tuple[_Marker | None, _Scan | None]:
        """Either the seal marker (checked against the files) or a read-only scan of the log."""
        if not paths.log.exists():
            raise HotLedgerMissingError(f"{paths.name} does not exist")
        marker = _read_marker(paths)
        if marker is not None:
            _check_sealed_files(paths, marker)
            return marker, None
        try:
            with open(paths.log, "rb", buffering=_READ_BUFFER) as file:
                return None, _scan(file, os.fstat(file.fileno()).st_size)
        except FileNotFoundError:
            raise HotLedgerMissingError(f"{paths.name} does not exist") from None

    def read(
        self, topic: str, ledger_id: int, first: int = 0, last: int | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """Entries ``first..last`` inclusive. Arguments are checked now (ValueError), the
        file is opened on the first ``next()``. Sealed ledgers seek once via the idx;
        unsealed ones are scanned once (a torn tail is invisible)."""
        paths = self._paths(topic, ledger_id)
        marker, scan = self._state(paths)
        if marker is not None:
            first, last = _check_range(paths, marker.entry_count, first, last)
            if first > last:
                return iter(())
            return _iter_sealed(paths, marker, first, last)
        assert scan is not None
        first, last = _check_range(paths, len(scan.offsets), first, last)
        if first > last:
            return iter(())
        return _iter_records(paths, scan.offsets[first], scan.length, first, last)

    def verify(self, topic: str, ledger_id: int) -> LedgerInfo:
        """Full check for tooling (reads everything): every record's id and CRC and, for a
        sealed ledger, the idx and the marker against the log. FormatError on a mismatch."""
        paths = self._paths(topic, ledger_id)
        marker, scan = self._state(paths)
        if marker is None:
            return self.info(topic, ledger_id)
        with open(paths.log, "rb", buffering=_READ_BUFFER) as file:
            scan = _scan(file, os.fstat(file.fileno()).st_size)
        idx = paths.idx.read_bytes()
        found = _Marker(len(scan.offsets), scan.size_bytes, scan.length, marker.idx_crc)
        if found != marker or crc32c.crc32c(idx) != marker.idx_crc:
            raise FormatError(f"{paths.name}: log or idx do not match the seal marker")
        if idx != _idx_bytes(scan.offsets):
            raise FormatError(f"{paths.name}: idx does not match the log")
        return LedgerInfo(topic, ledger_id, marker.entry_count, marker.size_bytes, True)

    def exists(self, topic: str, ledger_id: int) -> bool:
        return self._paths(topic, ledger_id).log.exists()

    def delete(self, topic: str, ledger_id: int) -> None:
        """Remove the log first (the ledger is gone), the marker last, then an empty folder."""
        paths = self._paths(topic, ledger_id)
        if not paths.folder.is_dir():
            return
        for path in (paths.log, *paths.sidecars()):
            _unlink(path)
        fsync_dir(paths.folder)
        self._remove_topic_dir_if_empty(paths)

    def _remove_topic_dir_if_empty(self, paths: _Paths) -> None:
        try:
            leftovers = set(os.listdir(paths.folder))
        except FileNotFoundError:
            return
        if leftovers - {_NAME_FILE}:
            return
        _unlink(paths.folder / _NAME_FILE)
        try:
            paths.folder.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if paths.folder.name.startswith(_HASHED_PREFIX):  # a concurrent create won
                self._ensure_name_file(paths.folder, paths.topic)
            return
        fsync_dir(self.root)

    # tooling helpers (the metadata database is the source of truth, not these listings)
    def list_ledgers(self, topic: str) -> list[int]:
        """Ids of the ledgers of ``topic`` that have a log file, ascending."""
        try:
            names = os.listdir(self.topic_dir(topic))
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_LOG_NAME.match, names) if m)

    def topics(self) -> list[str]:
        """Names of the topics that have a folder, sorted; foreign folders are skipped."""
        found: list[str] = []
        for entry in os.scandir(self.root):
            if not entry.is_dir():
                continue
            if entry.name.startswith(_HASHED_PREFIX):
                try:
                    found.append((Path(entry.path) / _NAME_FILE).read_text("utf-8"))
                except FileNotFoundError:
                    continue
            else:
                try:
                    found.append(decode_topic(entry.name))
                except ValueError:
                    continue
        return sorted(found)

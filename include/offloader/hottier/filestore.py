"""A hot tier on the local file system: one folder per topic, one log file per ledger.

The files, their byte layout, durability and the sealing order:
:mod:`offloader.hottier.ledger_files`; topic folder names: :mod:`offloader.hottier.names`.

Only one writer may hold a ledger open; this is enforced with ``flock`` and a second writer
gets :class:`~offloader.exceptions.LedgerInUseError`.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
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
from offloader.hottier.ledger_files import (
    FILE_MODE,
    LOG_NAME,
    READ_BUFFER,
    RECORD_HEADER,
    LedgerPaths,
    LogScan,
    SealMarker,
    check_ledger_id,
    check_range,
    check_sealed_files,
    idx_bytes,
    iter_records,
    iter_sealed,
    make_read_only,
    naming,
    publish_marker,
    read_marker,
    remove_if_present,
    scan_log,
    write_idx,
)
from offloader.hottier.names import (
    HASHED_PREFIX,
    NAME_FILE,
    encode_topic,
    ensure_name_file,
    topic_of_folder,
)

__all__ = ["FileLedgerStore", "FileWritableLedger"]

_WRITE_BUFFER = 256 * 1024


# --- single-writer lock ---------------------------------------------------------------
def _lock(file: BinaryIO, what: str) -> None:
    """Take the single-writer lock; released when the file is closed."""
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        raise LedgerInUseError(f"{what} is open by another writer") from None


# --- writer ---------------------------------------------------------------------------
class FileWritableLedger(WritableLedger):
    """An open ledger file. Appends are buffered: call :meth:`sync` or :meth:`seal` to make
    them durable. Usable as a context manager (closes without sealing)."""

    def __init__(self, paths: LedgerPaths, file: BinaryIO, scan: LogScan) -> None:
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
            with naming(self._paths.log):
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
            with naming(self._paths.log):
                file.flush()
                os.fsync(file.fileno())
        except BaseException:
            self._broken = True  # what reached the disk is unknown; reopen cuts a torn tail
            raise

    def seal(self) -> LedgerInfo:
        if self._sealed:
            return self.info()
        self.sync()
        data = idx_bytes(self._offsets)
        with naming(self._paths.idx):
            write_idx(self._paths, data)
        marker = SealMarker(len(self._offsets), self._size, self._length, crc32c.crc32c(data))
        with naming(self._paths.seal):
            publish_marker(self._paths, marker)
        self._sealed = True
        self._release()
        make_read_only(self._paths)
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
                with naming(self._paths.log):
                    file.flush()
        finally:
            if self._broken:  # closing flushes again; what is left of the buffer is torn
                with contextlib.suppress(OSError):
                    file.close()
            else:
                file.close()


# --- store ----------------------------------------------------------------------------
class FileLedgerStore(HotLedgerStore):
    """Ledgers as files under ``root``; layout and durability:
    :mod:`offloader.hottier.ledger_files`."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"FileLedgerStore({str(self.root)!r})"

    # paths
    def topic_dir(self, topic: str) -> Path:
        """The folder of ``topic`` (whether or not it exists)."""
        return self.root / encode_topic(topic)

    def _paths(self, topic: str, ledger_id: int) -> LedgerPaths:
        check_ledger_id(ledger_id)
        return LedgerPaths(topic, ledger_id, self.topic_dir(topic))

    def _ensure_topic_dir(self, paths: LedgerPaths) -> None:
        """Create the topic folder durably; hashed folders also record the topic name."""
        if not paths.folder.is_dir():
            paths.folder.mkdir(exist_ok=True)
            fsync_dir(self.root)
        if paths.folder.name.startswith(HASHED_PREFIX):
            ensure_name_file(paths.folder, paths.topic)

    # HotLedgerStore
    def create(self, topic: str, ledger_id: int) -> FileWritableLedger:
        paths = self._paths(topic, ledger_id)
        for _ in range(5):  # a concurrent delete may remove the empty topic folder under us
            self._ensure_topic_dir(paths)
            if not paths.log.exists():
                for stale in paths.sidecars():  # leftovers of an interrupted delete
                    remove_if_present(stale)
            try:
                fd = os.open(
                    paths.log, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE
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
        return FileWritableLedger(paths, file, LogScan(array.array("Q"), 0, 0))

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
            scan = scan_log(file, os.fstat(file.fileno()).st_size)
            if scan.length < os.fstat(file.fileno()).st_size:
                file.truncate(scan.length)
                os.fsync(file.fileno())
            for stale in paths.sidecars():  # an interrupted seal; the next seal rewrites them
                remove_if_present(stale)
            file.seek(scan.length)
        except BaseException:
            file.close()
            raise
        return FileWritableLedger(paths, file, scan)

    @staticmethod
    def _refuse_sealed(paths: LedgerPaths) -> None:
        if read_marker(paths) is not None and paths.log.exists():
            raise LedgerSealedError(f"{paths.name} is sealed")

    def info(self, topic: str, ledger_id: int) -> LedgerInfo:
        """For an unsealed ledger: the durable-looking prefix, ignoring a torn tail."""
        paths = self._paths(topic, ledger_id)
        marker, scan = self._state(paths)
        if marker is not None:
            return LedgerInfo(topic, ledger_id, marker.entry_count, marker.size_bytes, True)
        assert scan is not None
        return LedgerInfo(topic, ledger_id, len(scan.offsets), scan.size_bytes, False)

    def _state(self, paths: LedgerPaths) -> tuple[SealMarker | None, LogScan | None]:
        """Either the seal marker (checked against the files) or a read-only scan of the log."""
        if not paths.log.exists():
            raise HotLedgerMissingError(f"{paths.name} does not exist")
        marker = read_marker(paths)
        if marker is not None:
            check_sealed_files(paths, marker)
            return marker, None
        try:
            with open(paths.log, "rb", buffering=READ_BUFFER) as file:
                return None, scan_log(file, os.fstat(file.fileno()).st_size)
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
            first, last = check_range(paths, marker.entry_count, first, last)
            if first > last:
                return iter(())
            return iter_sealed(paths, marker, first, last)
        assert scan is not None
        first, last = check_range(paths, len(scan.offsets), first, last)
        if first > last:
            return iter(())
        return iter_records(paths, scan.offsets[first], scan.length, first, last)

    def verify(self, topic: str, ledger_id: int) -> LedgerInfo:
        """Full check for tooling (reads everything): every record's id and CRC and, for a
        sealed ledger, the idx and the marker against the log. FormatError on a mismatch."""
        paths = self._paths(topic, ledger_id)
        marker, scan = self._state(paths)
        if marker is None:
            return self.info(topic, ledger_id)
        with open(paths.log, "rb", buffering=READ_BUFFER) as file:
            scan = scan_log(file, os.fstat(file.fileno()).st_size)
        idx = paths.idx.read_bytes()
        found = SealMarker(len(scan.offsets), scan.size_bytes, scan.length, marker.idx_crc)
        if found != marker or crc32c.crc32c(idx) != marker.idx_crc:
            raise FormatError(f"{paths.name}: log or idx do not match the seal marker")
        if idx != idx_bytes(scan.offsets):
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
            remove_if_present(path)
        fsync_dir(paths.folder)
        self._remove_topic_dir_if_empty(paths)

    def _remove_topic_dir_if_empty(self, paths: LedgerPaths) -> None:
        try:
            leftovers = set(os.listdir(paths.folder))
        except FileNotFoundError:
            return
        if leftovers - {NAME_FILE}:
            return
        remove_if_present(paths.folder / NAME_FILE)
        try:
            paths.folder.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if paths.folder.name.startswith(HASHED_PREFIX):  # a concurrent create won
                ensure_name_file(paths.folder, paths.topic)
            return
        fsync_dir(self.root)

    # tooling helpers (the metadata database is the source of truth, not these listings)
    def list_ledgers(self, topic: str) -> list[int]:
        """Ids of the ledgers of ``topic`` that have a log file, ascending."""
        try:
            names = os.listdir(self.topic_dir(topic))
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(LOG_NAME.match, names) if m)

    def topics(self) -> list[str]:
        """Names of the topics that have a folder, sorted; foreign folders are skipped."""
        found: list[str] = []
        for entry in os.scandir(self.root):
            if not entry.is_dir():
                continue
            topic = topic_of_folder(Path(entry.path))
            if topic is not None:
                found.append(topic)
        return sorted(found)

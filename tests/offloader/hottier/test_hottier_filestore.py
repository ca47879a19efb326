"""FileLedgerStore: round trips, ranges, sealing, topic folders, delete, errors."""

from __future__ import annotations

import os
import random
import re
import stat
import struct
from pathlib import Path

import crc32c
import pytest

from offloader.exceptions import (
    AlreadyExistsError,
    FormatError,
    HotLedgerMissingError,
    LedgerInUseError,
    LedgerSealedError,
)
from offloader.hottier import LedgerInfo
from offloader.hottier.filestore import FileLedgerStore
from offloader.hottier.names import decode_topic, encode_topic

TOPIC = "persistent://tenant/ns/topic"
RECORD = struct.Struct(">IqI")


def random_payloads(n: int, seed: int = 7) -> list[bytes]:
    """Random sizes, with plenty of empty payloads."""
    rng = random.Random(seed)
    return [rng.randbytes(0 if rng.random() < 0.15 else rng.randrange(1, 5000)) for _ in range(n)]


def parse_log(data: bytes) -> list[tuple[int, int, bytes]]:
    """An independent reader of the documented record format: (offset, id, payload)."""
    records, pos = [], 0
    while pos < len(data):
        length, entry_id, crc = RECORD.unpack_from(data, pos)
        payload = data[pos + RECORD.size : pos + RECORD.size + length]
        assert crc32c.crc32c(payload) == crc
        records.append((pos, entry_id, payload))
        pos += RECORD.size + length
    assert pos == len(data)
    return records


@pytest.fixture
def store(tmp_path: Path) -> FileLedgerStore:
    return FileLedgerStore(tmp_path / "hot")


def write_ledger(
    store: FileLedgerStore, payloads: list[bytes], ledger_id: int = 1, seal: bool = True
) -> None:
    with store.create(TOPIC, ledger_id) as writer:
        for i, payload in enumerate(payloads):
            assert writer.append(payload) == i
        if seal:
            writer.seal()


# --- round trip -----------------------------------------------------------------------
def test_round_trip_many_entries_of_random_sizes(store: FileLedgerStore) -> None:
    payloads = random_payloads(600)
    writer = store.create(TOPIC, 3)
    for i, payload in enumerate(payloads):
        assert writer.append(payload) == i
    size = sum(map(len, payloads))
    assert writer.info() == LedgerInfo(TOPIC, 3, 600, size, sealed=False)
    writer.sync()
    assert list(store.read(TOPIC, 3)) == list(enumerate(payloads))  # unsealed, synced
    assert writer.seal() == LedgerInfo(TOPIC, 3, 600, size, sealed=True)
    assert writer.info().sealed
    writer.close()
    assert store.info(TOPIC, 3) == LedgerInfo(TOPIC, 3, 600, size, sealed=True)
    assert list(store.read(TOPIC, 3)) == list(enumerate(payloads))
    assert store.exists(TOPIC, 3)


def test_files_follow_the_documented_format(store: FileLedgerStore) -> None:
    payloads = random_payloads(50, seed=3)
    write_ledger(store, payloads, ledger_id=42)
    folder = store.topic_dir(TOPIC)
    assert sorted(p.name for p in folder.iterdir()) == [
        f"{42:020d}.idx",
        f"{42:020d}.log",
        f"{42:020d}.seal",
    ]
    records = parse_log((folder / f"{42:020d}.log").read_bytes())
    assert [(i, p) for _, i, p in records] == list(enumerate(payloads))
    idx = (folder / f"{42:020d}.idx").read_bytes()
    assert list(struct.unpack(f">{len(payloads)}Q", idx)) == [off for off, _, _ in records]


def test_accepts_bytearray_and_memoryview(store: FileLedgerStore) -> None:
    with store.create(TOPIC, 1) as writer:
        writer.append(bytearray(b"ab"))
        writer.append(memoryview(b"xcdx")[1:3])
        with pytest.raises(TypeError):
            writer.append("text")  # type: ignore[arg-type]
        writer.seal()
    assert list(store.read(TOPIC, 1)) == [(0, b"ab"), (1, b"cd")]


def test_empty_ledger(store: FileLedgerStore) -> None:
    write_ledger(store, [], seal=False)
    assert store.info(TOPIC, 1).entry_count == 0
    assert list(store.read(TOPIC, 1)) == []
    with store.open_for_append(TOPIC, 1) as writer:
        assert writer.seal() == LedgerInfo(TOPIC, 1, 0, 0, sealed=True)
    assert list(store.read(TOPIC, 1)) == []
    with pytest.raises(ValueError, match="out of range"):
        list(store.read(TOPIC, 1, 0, 0))


def test_close_and_reopen_continues_ids(store: FileLedgerStore) -> None:
    write_ledger(store, [b"a", b"b"], seal=False)
    assert store.info(TOPIC, 1) == LedgerInfo(TOPIC, 1, 2, 2, sealed=False)
    with store.open_for_append(TOPIC, 1) as writer:
        assert writer.info().entry_count == 2
        assert writer.append(b"c") == 2
        writer.seal()
    assert list(store.read(TOPIC, 1)) == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_closed_writer_refuses_appends(store: FileLedgerStore) -> None:
    writer = store.create(TOPIC, 1)
    writer.close()
    writer.close()  # idempotent
    assert writer.closed
    with pytest.raises(ValueError, match="closed"):
        writer.append(b"x")


def test_second_writer_is_refused(store: FileLedgerStore) -> None:
    with store.create(TOPIC, 1) as writer:
        writer.append(b"x")
        with pytest.raises(LedgerInUseError, match="another writer"):
            store.open_for_append(TOPIC, 1)
    store.open_for_append(TOPIC, 1).close()  # released by close


# --- ranges ---------------------------------------------------------------------------
N = 40
RANGES = [(0, None), (0, 0), (0, N - 1), (N - 1, N - 1), (N - 1, None), (5, 17), (20, 20)]
BAD_RANGES = [(-1, 3), (3, 2), (0, N), (N, N), (N + 1, None), (-1, None), (5, -1)]


@pytest.fixture(params=[True, False], ids=["sealed", "unsealed"])
def ranged(request: pytest.FixtureRequest, store: FileLedgerStore) -> list[bytes]:
    payloads = random_payloads(N, seed=11)
    write_ledger(store, payloads, ledger_id=9, seal=request.param)
    return payloads


@pytest.mark.parametrize(("first", "last"), RANGES)
def test_read_ranges(
    store: FileLedgerStore, ranged: list[bytes], first: int, last: int | None
) -> None:
    end = N - 1 if last is None else last
    expected = [(i, ranged[i]) for i in range(first, end + 1)]
    assert list(store.read(TOPIC, 9, first, last)) == expected


def test_read_empty_tail_with_open_end(store: FileLedgerStore, ranged: list[bytes]) -> None:
    assert list(store.read(TOPIC, 9, N)) == []


@pytest.mark.parametrize(("first", "last"), BAD_RANGES)
def test_bad_ranges_name_the_range_and_the_ledger(
    store: FileLedgerStore, ranged: list[bytes], first: int, last: int | None
) -> None:
    with pytest.raises(ValueError) as caught:
        store.read(TOPIC, 9, first, last)  # checked eagerly, before iterating
    message = str(caught.value)
    assert "ledger 9" in message and TOPIC in message and "out of range" in message


def test_read_is_lazy_and_can_be_abandoned(store: FileLedgerStore, ranged: list[bytes]) -> None:
    entries = store.read(TOPIC, 9)
    assert next(entries) == (0, ranged[0])
    entries.close()  # type: ignore[attr-defined]


# --- seal -----------------------------------------------------------------------------
def test_sealed_ledger_is_immutable(store: FileLedgerStore) -> None:
    writer = store.create(TOPIC, 1)
    writer.append(b"one")
    info = writer.seal()
    assert writer.seal() == info  # idempotent
    with pytest.raises(LedgerSealedError):
        writer.append(b"two")
    with pytest.raises(LedgerSealedError):
        writer.sync()
    writer.close()
    with pytest.raises(LedgerSealedError):
        store.open_for_append(TOPIC, 1)
    with pytest.raises(AlreadyExistsError):
        store.create(TOPIC, 1)
    assert list(store.read(TOPIC, 1)) == [(0, b"one")]


def test_sealed_files_are_read_only(store: FileLedgerStore) -> None:
    write_ledger(store, [b"x"] * 3)
    files = list(store.topic_dir(TOPIC).iterdir())
    assert len(files) == 3
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o444, path


def test_unsealed_files_are_writable(store: FileLedgerStore) -> None:
    write_ledger(store, [b"x"], seal=False)
    (log,) = store.topic_dir(TOPIC).iterdir()
    assert stat.S_IMODE(log.stat().st_mode) & 0o200


def test_corrupt_sealed_ledger_raises_format_error(store: FileLedgerStore) -> None:
    write_ledger(store, [b"hello", b"world"])
    log = store.topic_dir(TOPIC) / f"{1:020d}.log"
    os.chmod(log, 0o644)
    data = bytearray(log.read_bytes())
    data[-1] ^= 0xFF
    log.write_bytes(bytes(data))
    assert next(store.read(TOPIC, 1)) == (0, b"hello")
    with pytest.raises(FormatError, match="corrupt"):
        list(store.read(TOPIC, 1))


def test_truncated_sealed_ledger_raises_format_error(store: FileLedgerStore) -> None:
    write_ledger(store, [b"hello", b"world"])
    log = store.topic_dir(TOPIC) / f"{1:020d}.log"
    os.chmod(log, 0o644)
    os.truncate(log, log.stat().st_size - 1)
    with pytest.raises(FormatError):
        store.info(TOPIC, 1)
    with pytest.raises(FormatError):
        store.read(TOPIC, 1)


def test_corrupt_seal_marker_raises_format_error(store: FileLedgerStore) -> None:
    write_ledger(store, [b"hello"])
    marker = store.topic_dir(TOPIC) / f"{1:020d}.seal"
    os.chmod(marker, 0o644)
    data = bytearray(marker.read_bytes())
    data[8] ^= 1
    marker.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="seal marker"):
        store.info(TOPIC, 1)


# --- topic names ----------------------------------------------------------------------
TRICKY_TOPICS = [
    "orders",
    "Orders",
    "ORDERS",
    "persistent://tenant/ns/topic",
    "persistent:__tenant_ns_topic",  # what a naive "replace / and : by _" would give
    "persistent___tenant_ns_topic",
    "persistent%3A%2F%2Ftenant",  # looks like an escaped form already
    "a/b",
    "a_b",
    "a%2Fb",
    "a%2fb",
    ".",
    "..",
    ".hidden",
    "~h-123",
    "ünïcødé/тема/主题",
    "emoji 🚀 topic",
    "tab\tand\nnewline",
    "back\\slash",
    "x" * 300,  # too long for a folder name: hashed
    "x" * 299 + "y",
    "Ü" * 150,
]


def test_encoding_is_reversible_and_collision_free() -> None:
    folders = [encode_topic(t) for t in TRICKY_TOPICS]
    assert len(set(folders)) == len(folders)
    assert len({f.casefold() for f in folders}) == len(folders)  # case-insensitive FS too
    for topic, folder in zip(TRICKY_TOPICS, folders, strict=True):
        assert re.fullmatch(r"[A-Za-z0-9._%~-]{1,200}", folder), folder
        assert folder not in (".", "..") and not folder.startswith(".")
        if not folder.startswith("~h-"):
            assert decode_topic(folder) == topic
    assert encode_topic("persistent://t/n/x") == "persistent%3A%2F%2Ft%2Fn%2Fx"


@pytest.mark.parametrize("folder", ["", "A", "a%2fb", "a%2", "%ZZ", "a b", "a%2Eb", ".x", "~h-abc"])
def test_decode_rejects_foreign_folders(folder: str) -> None:
    with pytest.raises(ValueError):
        decode_topic(folder)


@pytest.mark.parametrize("topic", ["", None, 5])
def test_bad_topic_names(store: FileLedgerStore, topic: object) -> None:
    with pytest.raises(ValueError):
        store.create(topic, 1)  # type: ignore[arg-type]


def test_tricky_topics_keep_their_ledgers_apart(store: FileLedgerStore) -> None:
    for n, topic in enumerate(TRICKY_TOPICS):
        with store.create(topic, 5) as writer:
            writer.append(topic.encode())
            writer.append(str(n).encode())
            writer.seal()
    (store.root / "not-ours ").mkdir()  # foreign folders are ignored
    (store.root / "stray-file").write_text("x")
    assert store.topics() == sorted(TRICKY_TOPICS)
    for n, topic in enumerate(TRICKY_TOPICS):
        assert list(store.read(topic, 5)) == [(0, topic.encode()), (1, str(n).encode())]
        assert store.list_ledgers(topic) == [5]
    for topic in TRICKY_TOPICS:
        store.delete(topic, 5)
    assert store.topics() == []
    assert sorted(p.name for p in store.root.iterdir()) == ["not-ours ", "stray-file"]


# --- create / delete / missing --------------------------------------------------------
def test_create_existing_fails(store: FileLedgerStore) -> None:
    write_ledger(store, [b"x"], seal=False)
    with pytest.raises(AlreadyExistsError, match="ledger 1"):
        store.create(TOPIC, 1)
    assert list(store.read(TOPIC, 1)) == [(0, b"x")]  # untouched


def test_missing_ledger(store: FileLedgerStore) -> None:
    assert not store.exists(TOPIC, 1)
    with pytest.raises(HotLedgerMissingError):
        store.info(TOPIC, 1)
    with pytest.raises(HotLedgerMissingError):
        store.read(TOPIC, 1)
    with pytest.raises(HotLedgerMissingError):
        store.open_for_append(TOPIC, 1)
    assert isinstance(HotLedgerMissingError("x"), LookupError)
    assert store.list_ledgers(TOPIC) == []


def test_ledger_deleted_between_read_and_iteration(store: FileLedgerStore) -> None:
    write_ledger(store, [b"x"])
    entries = store.read(TOPIC, 1)
    store.delete(TOPIC, 1)
    with pytest.raises(HotLedgerMissingError):
        next(entries)


@pytest.mark.parametrize(("ledger_id", "error"), [(-1, ValueError), (2**63, ValueError)])
def test_bad_ledger_ids(store: FileLedgerStore, ledger_id: int, error: type) -> None:
    with pytest.raises(error):
        store.create(TOPIC, ledger_id)


def test_bad_ledger_id_types(store: FileLedgerStore) -> None:
    with pytest.raises(TypeError):
        store.exists(TOPIC, True)
    with pytest.raises(TypeError):
        store.exists(TOPIC, "1")  # type: ignore[arg-type]


def test_delete_is_idempotent_and_removes_the_empty_folder(store: FileLedgerStore) -> None:
    write_ledger(store, [b"a"], ledger_id=1)  # sealed: read-only files
    write_ledger(store, [b"b"], ledger_id=2, seal=False)
    assert store.list_ledgers(TOPIC) == [1, 2]
    store.delete(TOPIC, 1)
    store.delete(TOPIC, 1)
    assert not store.exists(TOPIC, 1)
    assert store.list_ledgers(TOPIC) == [2]
    assert store.topics() == [TOPIC]
    store.delete(TOPIC, 2)
    assert not store.topic_dir(TOPIC).exists()
    assert store.topics() == []
    store.delete(TOPIC, 2)
    store.delete("never-seen", 7)


def test_recreate_after_delete(store: FileLedgerStore) -> None:
    write_ledger(store, [b"old"])
    store.delete(TOPIC, 1)
    with pytest.raises(HotLedgerMissingError):
        store.info(TOPIC, 1)
    write_ledger(store, [b"new", b"er"], seal=False)
    assert store.info(TOPIC, 1) == LedgerInfo(TOPIC, 1, 2, 5, sealed=False)


def test_interrupted_delete_leaves_no_ghost_seal(store: FileLedgerStore) -> None:
    """delete() removes the log first; a crash after that leaves sidecars that create()
    must clear, or the new ledger would look sealed."""
    write_ledger(store, [b"old"])
    os.unlink(store.topic_dir(TOPIC) / f"{1:020d}.log")  # crash right after the first unlink
    assert not store.exists(TOPIC, 1)
    with store.create(TOPIC, 1) as writer:
        writer.append(b"new")
    assert store.info(TOPIC, 1) == LedgerInfo(TOPIC, 1, 1, 3, sealed=False)
    store.open_for_append(TOPIC, 1).close()


def test_list_ledgers_and_topics(store: FileLedgerStore) -> None:
    for ledger_id in (10, 2, 2**40):
        write_ledger(store, [b"x"], ledger_id=ledger_id, seal=ledger_id != 2)
    write_ledger_topic = "other"
    store.create(write_ledger_topic, 0).close()
    assert store.list_ledgers(TOPIC) == [2, 10, 2**40]
    assert store.list_ledgers(write_ledger_topic) == [0]
    assert store.topics() == sorted([TOPIC, "other"])


def test_store_accepts_str_root(tmp_path: Path) -> None:
    store = FileLedgerStore(str(tmp_path / "a" / "b"))
    assert store.root.is_dir()
    assert "FileLedgerStore" in repr(store)


@pytest.mark.parametrize("suffix", [".log", ".idx"])
def test_verify_checks_every_record_and_the_idx(store: FileLedgerStore, suffix: str) -> None:
    payloads = random_payloads(30, seed=5)
    write_ledger(store, payloads)
    write_ledger(store, payloads[:3], ledger_id=2, seal=False)
    assert store.verify(TOPIC, 1) == store.info(TOPIC, 1)
    assert store.verify(TOPIC, 2) == LedgerInfo(TOPIC, 2, 3, sum(map(len, payloads[:3])), False)
    path = store.topic_dir(TOPIC) / f"{1:020d}{suffix}"
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError):
        store.verify(TOPIC, 1)

"""FileLedgerStore crash recovery: torn tails, a real SIGKILL, interrupted seals."""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from offloader.exceptions import LedgerSealedError
from offloader.hottier import LedgerInfo, filestore
from offloader.hottier.filestore import FileLedgerStore

TOPIC = "persistent://tenant/ns/crash"
RECORD = struct.Struct(">IqI")
INCLUDE = Path(filestore.__file__).resolve().parents[2]  # the folder holding "offloader"

# shared verbatim by the test process and the child it kills
PAYLOAD_SRC = textwrap.dedent(
    """
    import random

    def payload(i):
        rng = random.Random(i)
        return rng.randbytes(0 if i % 9 == 4 else rng.randrange(1, 1500))
    """
)
_ns: dict = {}
exec(PAYLOAD_SRC, _ns)
payload: Callable[[int], bytes] = _ns["payload"]


def record(entry_id: int, data: bytes, crc: int | None = None) -> bytes:
    crc = crc32c.crc32c(data) if crc is None else crc
    return RECORD.pack(len(data), entry_id, crc) + data


@pytest.fixture
def store(tmp_path: Path) -> FileLedgerStore:
    return FileLedgerStore(tmp_path / "hot")


def log_path(store: FileLedgerStore, ledger_id: int = 1) -> Path:
    return store.topic_dir(TOPIC) / f"{ledger_id:020d}.log"


def write_unsealed(store: FileLedgerStore, n: int) -> int:
    """n entries, closed without sealing; returns the log length."""
    with store.create(TOPIC, 1) as writer:
        for i in range(n):
            writer.append(payload(i))
    return log_path(store).stat().st_size


def assert_intact(store: FileLedgerStore, n: int) -> None:
    assert list(store.read(TOPIC, 1)) == [(i, payload(i)) for i in range(n)]


# --- torn tails -----------------------------------------------------------------------
def tail_mid_header(good: bytes) -> bytes:
    return good + record(10, b"abcdef")[:7]


def tail_header_only(good: bytes) -> bytes:
    return good + record(10, b"abcdef")[: RECORD.size]


def tail_mid_payload(good: bytes) -> bytes:
    return good + record(10, b"abcdef" * 100)[:-50]


def tail_flipped_payload_byte(good: bytes) -> bytes:
    torn = bytearray(record(10, b"abcdef" * 10))
    torn[RECORD.size + 3] ^= 0x40
    return good + bytes(torn)


def tail_wrong_id(good: bytes) -> bytes:
    return good + record(11, b"valid crc, wrong id")


def tail_duplicate_id(good: bytes) -> bytes:
    return good + record(9, payload(9))


def tail_huge_length(good: bytes) -> bytes:
    return good + RECORD.pack(0xFFFFFFFF, 10, 0) + b"x" * 10


def tail_garbage(good: bytes) -> bytes:
    return good + random.Random(1).randbytes(3000)


TEARS = [
    tail_mid_header,
    tail_header_only,
    tail_mid_payload,
    tail_flipped_payload_byte,
    tail_wrong_id,
    tail_duplicate_id,
    tail_huge_length,
    tail_garbage,
]


@pytest.mark.parametrize("tear", TEARS, ids=lambda f: f.__name__)
def test_torn_tail_is_cut_at_reopen(store: FileLedgerStore, tear: Callable) -> None:
    good_length = write_unsealed(store, 10)
    log = log_path(store)
    torn = tear(log.read_bytes())
    log.write_bytes(torn)

    # readers ignore the tail without touching the file
    assert store.info(TOPIC, 1).entry_count == 10
    assert_intact(store, 10)
    assert log.read_bytes() == torn

    with store.open_for_append(TOPIC, 1) as writer:
        assert log.stat().st_size == good_length  # truncated (and fsynced) at reopen
        assert writer.info().entry_count == 10
        assert writer.append(payload(10)) == 10
        assert writer.append(payload(11)) == 11
        writer.seal()
    assert_intact(store, 12)


def test_corruption_mid_log_cuts_everything_after_it(store: FileLedgerStore) -> None:
    """Recovery keeps the longest valid prefix: a bad record ends the log."""
    write_unsealed(store, 10)
    log = log_path(store)
    data = bytearray(log.read_bytes())
    fifth = sum(RECORD.size + len(payload(i)) for i in range(5))
    data[fifth + RECORD.size] ^= 1  # payload(5) is not empty
    log.write_bytes(bytes(data))
    assert store.info(TOPIC, 1).entry_count == 5
    with store.open_for_append(TOPIC, 1) as writer:
        assert writer.append(payload(5)) == 5
    assert log.stat().st_size == fifth + RECORD.size + len(payload(5))


def test_torn_first_record_leaves_an_empty_ledger(store: FileLedgerStore) -> None:
    write_unsealed(store, 0)
    log_path(store).write_bytes(record(0, b"abc")[:-1])
    assert store.info(TOPIC, 1) == LedgerInfo(TOPIC, 1, 0, 0, sealed=False)
    with store.open_for_append(TOPIC, 1) as writer:
        assert writer.append(payload(0)) == 0
    assert_intact(store, 1)


# --- a real crash ---------------------------------------------------------------------
CHILD = PAYLOAD_SRC + textwrap.dedent(
    """
    import sys, time
    from offloader.hottier.filestore import FileLedgerStore

    store = FileLedgerStore(sys.argv[1])
    writer = store.create(sys.argv[2], 1)
    for i in range(60_000):
        writer.append(payload(i))
        if i == 300:
            writer.sync()
            print("ready", flush=True)
    print("done", flush=True)
    time.sleep(60)
    """
)


def run_child(code: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(INCLUDE), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env
    )


def kill_at_random_moment(child: subprocess.Popen[str], rng: random.Random) -> None:
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"
    time.sleep(rng.uniform(0.0, 0.15))
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    child.stdout.close()


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_sigkill_while_appending(tmp_path: Path, seed: int) -> None:
    root = tmp_path / "hot"
    child = run_child(CHILD, str(root), TOPIC)
    kill_at_random_moment(child, random.Random(seed))

    store = FileLedgerStore(root)
    log = log_path(store)
    raw_size = log.stat().st_size
    count = store.info(TOPIC, 1).entry_count
    assert count > 300  # synced before "ready"
    good_length = sum(RECORD.size + len(payload(i)) for i in range(count))
    assert good_length <= raw_size
    assert log.stat().st_size == raw_size  # info() does not repair

    with store.open_for_append(TOPIC, 1) as writer:
        assert log.stat().st_size == good_length  # the tail is cut at a record boundary
        assert writer.append(payload(count)) == count
        writer.seal()
    assert_intact(store, count + 1)
    assert list(store.read(TOPIC, 1, count - 1)) == [
        (count - 1, payload(count - 1)),
        (count, payload(count)),
    ]


# --- interrupted seals ----------------------------------------------------------------
CHILD_SEAL = PAYLOAD_SRC + textwrap.dedent(
    """
    import os, signal, sys
    from offloader.hottier import filestore

    def crash(*args):
        os.kill(os.getpid(), signal.SIGKILL)

    setattr(filestore, sys.argv[3], crash)
    store = filestore.FileLedgerStore(sys.argv[1])
    writer = store.create(sys.argv[2], 1)
    for i in range(500):
        writer.append(payload(i))
    writer.seal()
    """
)


def test_sigkill_after_idx_before_marker(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    child = run_child(CHILD_SEAL, str(root), TOPIC, "publish_marker")
    assert child.wait(timeout=60) == -signal.SIGKILL
    assert child.stdout is not None
    child.stdout.close()

    store = FileLedgerStore(root)
    idx = store.topic_dir(TOPIC) / f"{1:020d}.idx"
    assert idx.stat().st_size == 8 * 500  # the seal got this far
    assert store.info(TOPIC, 1) == LedgerInfo(
        TOPIC, 1, 500, sum(len(payload(i)) for i in range(500)), sealed=False
    )
    assert_intact(store, 500)
    with store.open_for_append(TOPIC, 1) as writer:
        assert writer.append(payload(500)) == 500
        writer.seal()
    assert idx.stat().st_size == 8 * 501  # rewritten
    assert_intact(store, 501)
    assert list(store.read(TOPIC, 1, 499, 500)) == [(499, payload(499)), (500, payload(500))]


def test_sigkill_after_marker_before_chmod(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    child = run_child(CHILD_SEAL, str(root), TOPIC, "make_read_only")
    assert child.wait(timeout=60) == -signal.SIGKILL
    assert child.stdout is not None
    child.stdout.close()

    store = FileLedgerStore(root)
    assert store.info(TOPIC, 1).sealed  # the marker is the commit point
    with pytest.raises(LedgerSealedError):
        store.open_for_append(TOPIC, 1)
    assert_intact(store, 500)
    store.delete(TOPIC, 1)
    assert store.topics() == []


def test_seal_failing_before_marker_leaves_ledger_appendable(
    store: FileLedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(filestore, "publish_marker", fail)
    writer = store.create(TOPIC, 1)
    for i in range(20):
        writer.append(payload(i))
    with pytest.raises(OSError, match="disk full"):
        writer.seal()
    assert not writer.info().sealed
    assert writer.append(payload(20)) == 20  # the writer is still usable
    writer.close()
    monkeypatch.undo()

    folder = store.topic_dir(TOPIC)
    (folder / f"{1:020d}.seal.tmp").write_bytes(b"half a mark")  # a torn marker temp file
    assert not store.info(TOPIC, 1).sealed
    with store.open_for_append(TOPIC, 1) as writer:
        assert not (folder / f"{1:020d}.seal.tmp").exists()
        assert writer.append(payload(21)) == 21
        writer.seal()
    assert_intact(store, 22)

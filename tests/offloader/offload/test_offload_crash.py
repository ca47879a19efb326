"""Crash safety: a real offloader process killed with SIGKILL across the offload sequence.

Right after every kill the metadata and the store are checked (the attempt recorded, its
objects as far as it got, the ledger marked), then the next run's report (a complete crashed
attempt is RECOVERED with its own objects; an incomplete one is superseded and its keys are
queued), then convergence: every ledger offloaded by exactly one committed attempt, every
entry readable with the same checksum, and no object in the store that the metadata neither
references nor queues for deletion (and after GC, none queued either).
"""

import json
import random
import signal
import time
from typing import Any

import pytest

from fixtures.backends import (
    END_TO_END,
    crash_cases,
    make_topic,
    produce_ledgers,
    unaccounted_objects,
    uploads_not_of_dead_attempts,
)
from fixtures.cli import is_stopped, spawn_cli
from fixtures.faults import ServerErrorProxy
from fixtures.metadata import list_attempts, pending_deletions
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import Attempt, AttemptState, HotState, OffloadState
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime

# the points of the offload sequence, in order; the ones before the index is written leave
# an incomplete attempt that the next run must supersede
OFFLOAD_POINTS = (
    "after-begin-attempt",
    "after-first-part",
    "before-complete",
    "after-data-upload",
    "after-index-upload",
    "after-commit",
    "after-mark-hot-deleting",
)
# every point on both main pairings (half of them on files + SQLite in the long form only:
# crash_cases); SeaweedFS + SQLite at the two points where the S3 path differs most
# (mid-multipart, complete objects to recover), to keep the suite time in check
POINT_CASES = [
    *crash_cases(OFFLOAD_POINTS),
    ("s3-sqlite", "after-first-part"),
    ("s3-sqlite", "after-index-upload"),
]


def offload_json(rt: Runtime, up_to: int) -> dict[str, Any]:
    """One clean ``offloader offload --json`` run; its report."""
    proc = spawn_cli(rt.settings, "offload", "orders", "--up-to", str(up_to), "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


def outcomes(report: dict[str, Any]) -> dict[int, str]:
    return {r["ledger_id"]: r["outcome"] for r in report["results"]}


def setup_topic(rt: Runtime) -> tuple[list[int], str]:
    # 3 blocks of 5 MiB (multipart), then a single-block ledger
    make_topic(rt, deletion_lag_seconds=0)
    ids = produce_ledgers(rt, "orders", [(24, 1024 * 1024), (50, 2000)])
    return ids, TopicReader(rt).checksum("orders", Source.HOT).digest


def committed_attempts(rt: Runtime, ledger_id: int) -> list[Attempt]:
    return [
        a
        for a in list_attempts(rt.metadata, "orders", AttemptState.COMMITTED)
        if a.ledger_id == ledger_id
    ]


def queued_keys(rt: Runtime, attempt_id: str) -> set[str]:
    return {d.object_key for d in pending_deletions(rt.metadata) if d.attempt_id == attempt_id}


def wait_for_lease_end(rt: Runtime) -> None:
    time.sleep(rt.settings.attempt_lease_seconds + 0.2)  # a dead attempt's lease runs out


def converge(rt: Runtime, ids: list[int], checksum: str) -> None:
    wait_for_lease_end(rt)
    offload_json(rt, ids[-1])
    for ledger_id in ids:
        ledger = rt.metadata.get_ledger("orders", ledger_id)
        assert ledger.is_offloaded and ledger.hot_state is HotState.DELETED
        (committed,) = committed_attempts(rt, ledger_id)  # exactly one
        assert committed.attempt_id == ledger.offload_attempt_id
    assert TopicReader(rt).checksum("orders").digest == checksum
    assert TopicReader(rt).checksum("orders", Source.TIERED).digest == checksum
    assert unaccounted_objects(rt) == set()
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.failed, gc.remaining) == (0, 0)
    committed = {rt.metadata.get_ledger("orders", i).data_key for i in ids} | {
        rt.metadata.get_ledger("orders", i).index_key for i in ids
    }
    assert {info.key for info in rt.objects.list()} == committed
    assert uploads_not_of_dead_attempts(rt) == set()  # the rest is the orphan sweep's


def crash_at(rt: Runtime, ids: list[int], point: str) -> None:
    crashed = spawn_cli(rt.settings, "offload", "orders", "--up-to", str(ids[-1]), failpoints=point)
    out, _ = crashed.communicate(timeout=120)
    assert crashed.returncode == -signal.SIGKILL, f"{point} was never reached"
    assert out == b""  # killed before it could report anything


# The CLI offloads both ledgers as one batch: both attempts are recorded in one transaction,
# the small single-block ledger uploads first, then the large one part by part. Per point:
# what each ledger's started attempt had written when killed (data object, index object, an
# open multipart upload), and what the next run must report for it.
IN_FLIGHT = {
    "after-begin-attempt": {"large": (False, False, False), "small": (False, False, False)},
    "after-data-upload": {"large": (False, False, False), "small": (True, False, False)},
    "after-index-upload": {"large": (False, False, False), "small": (True, True, False)},
    "after-first-part": {"large": (False, False, True), "small": (True, True, False)},
    "before-complete": {"large": (False, False, True), "small": (True, True, False)},
}


def check_crashed_attempts(rt: Runtime, ids: list[int], point: str) -> dict[int, Attempt]:
    """Killed inside the batch: both attempts recorded, in flight, objects as far as each got."""
    attempts = {a.ledger_id: a for a in list_attempts(rt.metadata, "orders")}
    assert sorted(attempts) == ids
    for name, ledger_id in zip(("large", "small"), ids, strict=True):
        attempt = attempts[ledger_id]
        assert attempt.state is AttemptState.STARTED
        ledger = rt.metadata.get_ledger("orders", ledger_id)
        assert ledger.offload_state is OffloadState.OFFLOADING and not ledger.is_offloaded
        assert ledger.attempt_id == attempt.attempt_id
        data, index, uploading = IN_FLIGHT[point][name]
        assert rt.objects.exists(attempt.data_key) is data, (name, "data")
        assert rt.objects.exists(attempt.index_key) is index, (name, "index")
        open_uploads = {u.key for u in rt.objects.list_multipart_uploads()}
        assert (attempt.data_key in open_uploads) is uploading, (name, "multipart")
    assert pending_deletions(rt.metadata) == []
    return attempts


def check_resolved(
    rt: Runtime, report: dict[str, Any], crashed: dict[int, Attempt], point: str
) -> None:
    """An attempt whose index was written (its objects complete) is committed as it is
    (recovered); any other is superseded, its keys queued, and a new attempt offloads."""
    expected = {}
    for name, ledger_id in zip(("large", "small"), sorted(crashed), strict=True):
        attempt = crashed[ledger_id]
        ledger = rt.metadata.get_ledger("orders", ledger_id)
        _, index_written, _ = IN_FLIGHT[point][name]
        expected[ledger_id] = "recovered" if index_written else "offloaded"
        if index_written:
            assert ledger.offload_attempt_id == attempt.attempt_id
            assert (ledger.data_key, ledger.index_key) == (attempt.data_key, attempt.index_key)
            assert rt.metadata.attempts.get(attempt.attempt_id).state is AttemptState.COMMITTED
        else:
            assert ledger.is_offloaded and ledger.offload_attempt_id != attempt.attempt_id
            assert rt.metadata.attempts.get(attempt.attempt_id).state is AttemptState.SUPERSEDED
            assert queued_keys(rt, attempt.attempt_id) == {attempt.data_key, attempt.index_key}
    assert outcomes(report) == expected


@pytest.mark.parametrize(("backend_settings", "point"), POINT_CASES, indirect=["backend_settings"])
def test_sigkill_at_each_point_leaves_a_state_the_next_run_resolves(
    runtime: Runtime, point: str
) -> None:
    rt = runtime
    ids, checksum = setup_topic(rt)
    crash_at(rt, ids, point)
    if point in IN_FLIGHT:
        crashed = check_crashed_attempts(rt, ids, point)
        wait_for_lease_end(rt)
        check_resolved(rt, offload_json(rt, ids[-1]), crashed, point)
    elif point == "after-commit":  # the batch committed; the hot copies are untouched
        attempts = list_attempts(rt.metadata, "orders")
        assert sorted(a.ledger_id for a in attempts) == ids
        assert all(a.state is AttemptState.COMMITTED for a in attempts)
        for attempt in attempts:
            ledger = rt.metadata.get_ledger("orders", attempt.ledger_id)
            assert ledger.is_offloaded and ledger.offload_attempt_id == attempt.attempt_id
            assert ledger.hot_state is HotState.PRESENT and rt.hot.exists(
                "orders", ledger.ledger_id
            )
        report = offload_json(rt, ids[-1])
        assert outcomes(report) == {}
        assert [h["ledger_id"] for h in report["hot_deleted"]] == ids
    else:  # after-mark-hot-deleting: marked, the hot copy still there
        assert point == "after-mark-hot-deleting"
        ledgers = rt.metadata.list_ledgers("orders")
        assert all(x.is_offloaded for x in ledgers)
        assert [x.hot_state for x in ledgers] == [HotState.DELETING, HotState.PRESENT]
        assert rt.hot.exists("orders", ids[0])
        report = offload_json(rt, ids[-1])
        assert outcomes(report) == {}
        assert [h["ledger_id"] for h in report["hot_deleted"]] == ids
    converge(rt, ids, checksum)


@END_TO_END
def test_sigkill_at_a_random_moment(runtime: Runtime) -> None:
    rt = runtime
    ids, checksum = setup_topic(rt)
    delay = random.Random().uniform(0.0, 0.03)
    victim = spawn_cli(rt.settings, "offload", "orders", "--up-to", str(ids[-1]))
    # wait until the first attempt is recorded, then kill somewhere after it
    deadline = time.monotonic() + 60
    while not list_attempts(rt.metadata, "orders") and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    victim.send_signal(signal.SIGKILL)
    out, _ = victim.communicate(timeout=60)
    # the kill landed inside the run: nothing reported, and the run's last step (deleting
    # the hot copies) had not finished
    assert victim.returncode == -signal.SIGKILL, f"the run ended by itself ({delay=:.3f})"
    assert out == b""
    ledgers = rt.metadata.list_ledgers("orders")
    assert not all(x.hot_state is HotState.DELETED for x in ledgers), f"too late ({delay=:.3f})"
    for ledger in ledgers:  # an attempt in flight is recorded and started
        if ledger.attempt_id is not None:
            assert rt.metadata.attempts.get(ledger.attempt_id).state is AttemptState.STARTED
    converge(rt, ids, checksum)


@END_TO_END
def test_zombie_woken_after_takeover_cannot_commit(runtime: Runtime) -> None:
    """A frozen offloader (SIGSTOP mid-upload) stalls past its lease; a second one takes
    over and commits; the zombie, woken with SIGCONT, loses and queues its own objects."""
    rt = runtime
    ids, checksum = setup_topic(rt)
    zombie = spawn_cli(
        rt.settings,
        "offload",
        "orders",
        "--up-to",
        str(ids[0]),
        "--json",
        failpoints="after-first-part:stop",
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        attempts = list_attempts(rt.metadata, "orders")
        if attempts and is_stopped(zombie):
            break
        time.sleep(0.02)
    else:
        pytest.fail("the zombie never reached its stop point")
    (zombie_attempt,) = attempts
    assert [u.key for u in rt.objects.list_multipart_uploads()] == [zombie_attempt.data_key]
    wait_for_lease_end(rt)
    assert rt.metadata.get_ledger("orders", ids[0]).attempt_lease_ms < time.time() * 1000

    # the takeover: the stalled attempt is superseded mid-upload, its keys queued
    report = offload_json(rt, ids[0])
    assert outcomes(report) == {ids[0]: "offloaded"}
    ledger = rt.metadata.get_ledger("orders", ids[0])
    assert ledger.is_offloaded and ledger.offload_attempt_id != zombie_attempt.attempt_id
    assert rt.metadata.attempts.get(zombie_attempt.attempt_id).state is AttemptState.SUPERSEDED
    assert queued_keys(rt, zombie_attempt.attempt_id) == {
        zombie_attempt.data_key,
        zombie_attempt.index_key,
    }
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)  # runs before the zombie wakes
    assert (gc.failed, gc.remaining) == (0, 0)
    # the GC does not list the bucket: the zombie's upload is left to the orphan sweep
    assert [u.key for u in rt.objects.list_multipart_uploads()] == [zombie_attempt.data_key]

    zombie.send_signal(signal.SIGCONT)
    out, err = zombie.communicate(timeout=120)
    assert zombie.returncode == 0, err.decode()
    assert outcomes(json.loads(out)) == {ids[0]: "lost"}
    assert rt.metadata.get_ledger("orders", ids[0]).offload_attempt_id == ledger.offload_attempt_id
    assert rt.metadata.attempts.get(zombie_attempt.attempt_id).state is AttemptState.SUPERSEDED
    assert [a.attempt_id for a in committed_attempts(rt, ids[0])] == [ledger.offload_attempt_id]
    assert unaccounted_objects(rt) == set()
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert not any(
        k.startswith(zombie_attempt.attempt_id) for k in (i.key for i in rt.objects.list())
    )
    assert uploads_not_of_dead_attempts(rt) == set()
    converge(rt, ids, checksum)


def _is_part_upload(method: str, path: str) -> bool:
    return method == "PUT" and "partNumber=" in path


@pytest.mark.parametrize("backend_settings", ["s3-postgres", "s3-sqlite"], indirect=True)
def test_transient_500s_on_the_wire_are_retried(runtime: Runtime) -> None:
    """Real HTTP 500s from a proxy in front of SeaweedFS, for two part uploads: the client
    retries them, the offload commits once, and no part or upload is left behind."""
    rt = runtime
    ids, checksum = setup_topic(rt)
    assert rt.settings.s3_endpoint_url is not None
    with ServerErrorProxy(rt.settings.s3_endpoint_url, _is_part_upload, count=2) as proxy:
        settings = rt.settings.model_copy(update={"s3_endpoint_url": proxy.endpoint_url})
        with Runtime.open(settings) as through_proxy:
            results = LedgerOffloader(through_proxy).offload_topic("orders", up_to=ids[-1])
            # the offload recorded the proxy's endpoint as its store (invariant 7): read
            # back while the proxy still forwards
            assert TopicReader(rt).checksum("orders", Source.TIERED).digest == checksum
    assert len(proxy.faulted) == 2
    assert [r.outcome for r in results] == [Outcome.OFFLOADED] * 2
    for ledger_id in ids:
        (committed,) = committed_attempts(rt, ledger_id)
        assert (
            committed.attempt_id == rt.metadata.get_ledger("orders", ledger_id).offload_attempt_id
        )
    assert len(list_attempts(rt.metadata, "orders")) == 2  # no failed attempt on the way
    assert pending_deletions(rt.metadata) == []
    assert list(rt.objects.list_multipart_uploads()) == []
    assert unaccounted_objects(rt) == set()

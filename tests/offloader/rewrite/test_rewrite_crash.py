"""Crash safety of a rewrite: a real `offloader rewrite` process killed (SIGKILL) at each of
its failpoints, on both pairings.

Right after the kill the metadata and the store are checked: which segment row exists in
which state, its recorded upload, what the store holds; the sources untouched before the
swap, swapped after it; the topic's checksum unchanged and every ledger readable entry by
entry. Then, once the dead run's lease ran out, `offloader gc` alone recovers it (the
rewrite failed, its upload aborted, its keys deleted), the orphan sweep finds nothing of
it but an upload created and never recorded, and a rerun converges to exactly one
committed copy of each entry. A zombie (SIGSTOP after its first part, its lease run out,
its group rewritten by another run) woken with SIGCONT commits nothing.
"""

from __future__ import annotations

import json
import signal

import pytest

from fixtures.backends import BACKENDS, crash_cases
from fixtures.cli import run_cli, spawn_cli, wait_stopped
from fixtures.clock import wait_past
from fixtures.inspect import checksum, stored_keys, uploads
from fixtures.metadata import pending_deletions
from fixtures.rewrites import (
    T,
    check_clean_store,
    check_one_copy,
    entry_digests,
    gc,
    rewrite,
    rewrite_rows,
    shape,
    v1_topic,
)
from offloader import failpoints
from offloader.format import decode_segment_index
from offloader.metadata import Ledger, OffloadMode, SegmentOrigin, SegmentState
from offloader.rewrite.report import REWRITTEN
from offloader.runtime import Runtime

# every point of the rewrite: a new one is crash-tested as soon as it is declared
REWRITE_POINTS = tuple(p for p in failpoints.POINTS if "rewrite" in p)
assert len(REWRITE_POINTS) == 7 and REWRITE_POINTS[-1] == "rewrite-after-commit", REWRITE_POINTS
CASES = crash_cases(REWRITE_POINTS)
COMMITTED = REWRITE_POINTS.index("rewrite-after-commit")


def args(rt: Runtime) -> list[str]:
    """One group of every ledger of the topic."""
    target = shape(rt).target
    return ["rewrite", T, "--target-bytes", str(10 * target), "--small-bytes", str(target)]


def kill_at(rt: Runtime, point: str) -> None:
    crashed = spawn_cli(rt.settings, *args(rt), "--json", failpoints=point)
    out, err = crashed.communicate(timeout=300)
    assert crashed.returncode == -signal.SIGKILL, f"{point} was never reached: {err.decode()}"
    assert out == b""


def check_killed_state(rt: Runtime, point: str, sources: list[Ledger], before: set[str]) -> None:
    """What the dead run left: one rewrite segment, as far as it got."""
    stage = REWRITE_POINTS.index(point)
    (segment,) = rt.metadata.segments.of_topic(T)
    assert segment.origin is SegmentOrigin.REWRITE
    assert segment.state is (
        SegmentState.OFFLOADED if stage == COMMITTED else SegmentState.ASSIGNED
    )
    # the upload: created at stage 1, recorded from stage 2, completed at stage 3
    open_uploads = {u for u in uploads(rt.objects) if u[0] == segment.data_key}
    if stage == 0:
        assert segment.upload_id is None and open_uploads == set()
    elif stage == 1:
        assert segment.upload_id is None and len(open_uploads) == 1  # not recorded
    elif stage == 2:
        assert open_uploads == {(segment.data_key, segment.upload_id)}
    else:
        assert segment.upload_id is not None and open_uploads == set()
    # the objects: the sources' own, and the segment's as far as written
    present = stored_keys(rt.objects)
    assert present - before <= {segment.data_key, segment.index_key}
    assert (segment.data_key in present) is (stage >= 3)
    assert (segment.index_key in present) is (stage >= 4)
    if stage >= 4:
        index = decode_segment_index(rt.objects.get(segment.index_key))
        assert index.data_object_len == rt.objects.stat(segment.data_key).size
        assert list(index.ledger_ids) == [x.ledger_id for x in sources]
    # the sources: untouched before the swap, swapped after it
    now = [rt.metadata.get_ledger(T, x.ledger_id) for x in sources]
    if stage < COMMITTED:
        assert now == sources
        assert pending_deletions(rt.metadata) == []
        assert before <= present
    else:
        assert all(x.offload_mode is OffloadMode.STREAM and x.data_key is None for x in now)
        queued = {d.object_key for d in pending_deletions(rt.metadata)}
        assert queued == {k for x in sources for k in (x.data_key, x.index_key)}
        assert segment.data_len == rt.objects.stat(segment.data_key).size
    check_one_copy(rt)


def wait_for_lease_end(rt: Runtime) -> None:
    (segment,) = rt.metadata.segments.of_topic(T)
    wait_past(rt.metadata, segment.lease_until_ms or 0, poll=0.1)


@pytest.mark.parametrize(("backend_settings", "point"), CASES, indirect=["backend_settings"])
def test_sigkill_at_each_point_then_gc_alone_cleans_and_a_rerun_converges(
    runtime: Runtime, point: str
) -> None:
    rt = runtime
    ids = v1_topic(rt, 3)  # hot copies deleted: reads come from the tier alone
    sources = [rt.metadata.get_ledger(T, i) for i in ids]
    before, digests, present = checksum(rt, T), entry_digests(rt), stored_keys(rt.objects)

    kill_at(rt, point)
    check_killed_state(rt, point, sources, present)
    assert checksum(rt, T) == before and entry_digests(rt) == digests

    (crashed,) = rt.metadata.segments.of_topic(T)
    stage = REWRITE_POINTS.index(point)
    if stage < COMMITTED:
        wait_for_lease_end(rt)
    done = run_cli(rt.settings, "gc", "--json")  # `offloader gc` alone
    recovered = json.loads(done.stdout)["rewrites_recovered"]
    after_gc = stored_keys(rt.objects)
    if stage < COMMITTED:
        assert recovered == [crashed.segment_id]
        assert rt.metadata.segments.get(crashed.segment_id).state is SegmentState.FAILED
        assert after_gc == present  # its objects deleted, the sources' kept
        unrecorded = stage == REWRITE_POINTS.index("rewrite-after-create-upload")
        assert len(uploads(rt.objects)) == (1 if unrecorded else 0)  # that one is the sweep's
    else:
        assert recovered == []
        assert after_gc == {crashed.data_key, crashed.index_key}  # the old objects went
    check_clean_store(rt)
    assert checksum(rt, T) == before

    report = rewrite(rt, target_bytes=10 * shape(rt).target, small_bytes=shape(rt).target)
    assert [g.outcome for g in report.groups] == ([] if stage == COMMITTED else [REWRITTEN])
    assert len(rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED])) == 1
    gc(rt)
    check_one_copy(rt)
    check_clean_store(rt)
    assert checksum(rt, T) == before and entry_digests(rt) == digests


# --- a zombie ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend_settings", BACKENDS, indirect=True)
def test_a_zombie_woken_after_another_run_rewrote_its_group_commits_nothing(
    runtime: Runtime,
) -> None:
    rt = runtime
    ids = v1_topic(rt, 3)
    before = checksum(rt, T)
    zombie = spawn_cli(rt.settings, *args(rt), "--json", failpoints="rewrite-after-first-part:stop")
    try:
        wait_stopped(zombie)
        (frozen,) = rt.metadata.segments.of_topic(T)
        assert frozen.state is SegmentState.ASSIGNED and frozen.upload_id is not None
        wait_for_lease_end(rt)

        report = rewrite(rt, target_bytes=10 * shape(rt).target, small_bytes=shape(rt).target)
        assert report.recovered == [frozen.segment_id]
        assert [g.outcome for g in report.groups] == [REWRITTEN]
        assert rt.metadata.segments.get(frozen.segment_id).state is SegmentState.FAILED
        gc(rt)
        rows, present = rewrite_rows(rt), stored_keys(rt.objects)

        zombie.send_signal(signal.SIGCONT)
        out, err = zombie.communicate(timeout=120)
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait()
    # its lease is gone, or its upload was aborted under it: either way it swaps nothing
    assert zombie.returncode in (0, 2), err.decode()
    (group,) = json.loads(out)["groups"]
    assert group["outcome"] in ("changed", "failed") and group["segment_id"] in (
        None,
        frozen.segment_id,
    )
    after = rewrite_rows(rt)
    for table in ("segments", "segment_ledgers", "ledgers", "offload_attempts"):
        assert after[table] == rows[table], table
    late = [d for d in pending_deletions(rt.metadata) if d.object_key not in present]
    assert {d.object_key for d in late} <= {frozen.data_key, frozen.index_key}
    gc(rt)
    assert stored_keys(rt.objects) == present
    assert [x.ledger_id for x in rt.metadata.list_ledgers(T)] == ids
    check_one_copy(rt)
    check_clean_store(rt)
    assert checksum(rt, T) == before

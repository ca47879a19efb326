"""Crash safety of the streaming pass: a real `offloader stream` process killed (SIGKILL) at
each of its failpoints, on both backends.

Right after the kill the metadata and the store are checked (the segment's state, its
recorded parts and upload, what the store holds); the dead pass's lease still holds the
stream. Then its lease runs out and passes are rerun until nothing changes: every entry
of the sealed ledgers is in exactly one offloaded segment, every segment's data object is
its recorded size and decodes, and after the deletion queue and the orphan sweep ran,
the store holds the offloaded segments' objects and nothing else, no upload left open.
A zombie (SIGSTOP after a part upload, its lease run out, its segment finished by another
pass) woken with SIGCONT is fenced and changes nothing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import sqlalchemy as sa

from fixtures.backends import BACKENDS, crash_cases
from fixtures.cli import child_env, is_stopped, spawn_cli
from fixtures.inspect import stored_keys, table_rows, uploads
from fixtures.metadata import pending_deletions
from fixtures.streams import (
    check_sealed_ledgers_streamed,
    converge,
    expire_stream_lease,
    produce,
    run_pass,
    segment_entries,
    segment_keys,
    stream_topic,
)
from offloader import failpoints
from offloader.exceptions import StreamBusyError
from offloader.format import decode_segment_index
from offloader.gc.deletion_queue import process_deletions
from offloader.gc.sweep import sweep
from offloader.metadata import OffloadMode, OffloadState, SegmentState, schema
from offloader.runtime import Runtime

T = "s"
# every point of the streaming pass: a new one is crash-tested as soon as it is declared
STREAM_POINTS = tuple(p for p in failpoints.POINTS if p.startswith("stream-"))
assert len(STREAM_POINTS) == 8, STREAM_POINTS
CASES = crash_cases(STREAM_POINTS)


def setup_topic(rt: Runtime) -> None:
    """Sealed history of about one and a half segments: the first is planned (it ends
    exactly at plan_segment_end), the rest waits in an open segment."""
    p = stream_topic(rt)
    produce(rt, T, int(1.5 * p.segment_max / p.ledger_bytes) + 1)


def stream_lease_until(rt: Runtime) -> int | None:
    with rt.metadata.engine.connect() as conn:
        return conn.execute(sa.select(schema.streams.c.lease_until_ms)).scalar_one()


def kill_at(rt: Runtime, point: str) -> None:
    crashed = spawn_cli(rt.settings, "stream", T, "--json", failpoints=point)
    out, err = crashed.communicate(timeout=180)
    assert crashed.returncode == -signal.SIGKILL, f"{point} was never reached: {err.decode()}"
    assert out == b""


def check_killed_state(rt: Runtime, point: str) -> None:
    """What the dead pass left: one segment, as far as it got."""
    (segment,) = rt.metadata.segments.of_topic(T)
    parts = rt.metadata.segments.parts(segment)
    stage = STREAM_POINTS.index(point)
    assert segment.planned_end is not None  # history: a planned segment
    expected_state = {6: SegmentState.CLOSING, 5: SegmentState.CLOSING, 4: SegmentState.CLOSING}
    state = SegmentState.OFFLOADED if stage == 7 else expected_state.get(stage)
    assert segment.state is (state or SegmentState.ASSIGNED)
    # the upload: created at stage 1, recorded from stage 2, completed at stage 5
    open_uploads = {u for u in uploads(rt.objects) if u[0] == segment.data_key}
    if stage == 0:
        assert segment.upload_id is None and open_uploads == set()
    elif stage == 1:
        assert segment.upload_id is None and len(open_uploads) == 1  # not recorded
    elif stage < 5:
        assert open_uploads == {(segment.data_key, segment.upload_id)}
    else:
        assert segment.upload_id is not None and open_uploads == set()
    # the parts
    if stage < 3:
        assert parts == [] and segment.data_len == 0 and segment.end is None
    elif stage == 3:
        (part,) = parts
        assert (part.part_number, part.offset) == (1, 0)
        assert segment.data_len == part.length and segment.end == part.last_position
    else:
        assert [p.part_number for p in parts] == list(range(1, len(parts) + 1))
        assert sum(p.length for p in parts) == segment.data_len
        assert segment.end == segment.planned_end == parts[-1].last_position
    # the objects
    present = stored_keys(rt.objects)
    assert (segment.data_key in present) is (stage >= 5)
    assert (segment.index_key in present) is (stage >= 6)
    assert present <= {segment.data_key, segment.index_key}
    if stage >= 5:
        assert rt.objects.stat(segment.data_key).size == segment.data_len
    if stage >= 6:
        index = decode_segment_index(rt.objects.get(segment.index_key))
        assert index.data_object_len == segment.data_len
    if stage == 7:
        assert segment_entries(rt, segment)
        settled = [
            x
            for x in rt.metadata.list_ledgers(T)
            if x.offload_state is OffloadState.OFFLOADED and x.offload_mode is OffloadMode.STREAM
        ]
        assert settled and all(x.ledger_id < segment.end.ledger_id for x in settled)  # type: ignore[union-attr]
    assert pending_deletions(rt.metadata) == []


def check_clean_store(rt: Runtime) -> None:
    """After the queue and the orphan sweep: only the offloaded segments' objects, no
    upload left open."""
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.failed, gc.remaining) == (0, 0)
    swept = sweep(
        rt.metadata,
        rt.stores,
        rt.settings.model_copy(update={"sweep_grace_seconds": 0, "multipart_max_age_seconds": 0}),
    )
    assert not swept.errors
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.failed, gc.remaining) == (0, 0)
    assert stored_keys(rt.objects) == segment_keys(rt, T, (SegmentState.OFFLOADED,))
    assert uploads(rt.objects) == set()


@pytest.mark.parametrize(("backend_settings", "point"), CASES, indirect=["backend_settings"])
def test_sigkill_at_each_point_then_passes_converge(runtime: Runtime, point: str) -> None:
    rt = runtime
    setup_topic(rt)
    kill_at(rt, point)
    check_killed_state(rt, point)
    (crashed,) = rt.metadata.segments.of_topic(T)
    # the dead pass's lease holds the stream until it runs out
    assert stream_lease_until(rt) > rt.metadata.db_now_ms()  # type: ignore[operator]
    with pytest.raises(StreamBusyError):
        run_pass(rt)
    expire_stream_lease(rt)

    run_pass(rt)
    converge(rt)
    # the crashed segment was resumed (or was done), not failed and replaced
    finished = rt.metadata.segments.get(crashed.segment_id)
    assert finished.state is SegmentState.OFFLOADED
    assert finished.end == crashed.planned_end
    assert all(s.state is SegmentState.OFFLOADED for s in rt.metadata.segments.of_topic(T)), (
        "a segment failed on the way"
    )
    check_sealed_ledgers_streamed(rt)
    check_clean_store(rt)


# --- a zombie ------------------------------------------------------------------------------
ZOMBIE = """
import json
from offloader.runtime import Runtime
from offloader.settings import Settings
from offloader.stream.offloader import StreamingOffloader

with Runtime.open(Settings()) as rt:
    result = StreamingOffloader(rt, owner="zombie", lease_seconds=1.0).run_pass("s")
print(json.dumps(result.to_json()))
"""


def snapshot(rt: Runtime) -> dict[str, Any]:
    rows: dict[str, Any] = table_rows(
        rt.metadata, schema.streams, schema.segments, schema.segment_parts, schema.pieces
    )
    rows["ledgers"] = rt.metadata.list_ledgers(T)
    rows["deletions"] = pending_deletions(rt.metadata)
    return rows


@pytest.mark.parametrize("backend_settings", BACKENDS, indirect=True)
def test_a_zombie_woken_after_takeover_is_fenced_and_changes_nothing(runtime: Runtime) -> None:
    rt = runtime
    setup_topic(rt)
    env = child_env(rt.settings, failpoints="stream-after-part-upload:stop")
    zombie = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not is_stopped(zombie):
            assert zombie.poll() is None, zombie.communicate()[1].decode()
            assert time.monotonic() < deadline, "the zombie never reached its stop point"
            time.sleep(0.02)
        (segment,) = rt.metadata.segments.of_topic(T)
        assert segment.state is SegmentState.ASSIGNED and segment.upload_id is not None
        assert rt.metadata.segments.parts(segment) == []  # uploaded, not recorded

        # its one-second lease runs out on the database's clock; another pass takes over
        deadline = time.monotonic() + 30
        while stream_lease_until(rt) >= rt.metadata.db_now_ms():  # type: ignore[operator]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        taken = run_pass(rt)
        assert taken.epoch == 2 and segment.segment_id in taken.committed
        converge(rt)
        check_sealed_ledgers_streamed(rt)
        before, present = snapshot(rt), stored_keys(rt.objects)

        zombie.send_signal(signal.SIGCONT)
        out, err = zombie.communicate(timeout=120)
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait()
    assert zombie.returncode != 0 and out == b""
    assert "StreamFencedError" in err.decode() and "lost the stream" in err.decode()
    assert snapshot(rt) == before
    assert stored_keys(rt.objects) == present
    assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.OFFLOADED
    check_sealed_ledgers_streamed(rt)
    check_clean_store(rt)

"""The stream's short lease (``stream_lease_seconds``), kept alive by the running pass:
a pass killed at a failpoint blocks its topic for about one short lease, not for minutes;
a long pass that keeps renewing is never taken over; a pass whose renewals fail stops
before it commits anything. Both pairings."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from fixtures.cli import run_cli
from fixtures.streams import produce, run_pass, stream_topic
from offloader.exceptions import StreamBusyError, StreamFencedError
from offloader.metadata import SegmentState
from offloader.metadata.segments import SegmentStore
from offloader.runtime import Runtime
from offloader.stream import offloader as stream_offloader
from offloader.stream.offloader import StreamingOffloader

T = "s"
LEASE = 2.0  # seconds: short, so the tests wait little


def setup(rt: Runtime) -> None:
    """Sealed history of about two segments: several parts to upload."""
    p = stream_topic(rt)
    produce(rt, T, int(2 * p.segment_max / p.ledger_bytes) + 1)


def slow_parts(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Every part upload of a pass takes ``seconds`` longer (a slow store)."""
    upload: Callable[..., Any] = stream_offloader._Pass._upload_part

    def slow(self: Any, *args: Any) -> Any:
        time.sleep(seconds)
        return upload(self, *args)

    monkeypatch.setattr(stream_offloader._Pass, "_upload_part", slow)


def test_the_default_lease_is_short(runtime: Runtime) -> None:
    assert runtime.settings.stream_lease_seconds == 30.0
    assert StreamingOffloader(runtime).lease_ms == 30_000


@pytest.mark.slow
def test_a_killed_pass_is_taken_over_within_about_one_short_lease(runtime: Runtime) -> None:
    rt = runtime
    setup(rt)
    settings = rt.settings.model_copy(update={"stream_lease_seconds": LEASE})
    done = run_cli(settings, "stream", T, failpoints="stream-after-part-upload", ok=False)
    killed = time.monotonic()
    assert done.returncode == -signal.SIGKILL, done.stderr
    with pytest.raises(StreamBusyError):  # the dead pass's lease still holds the stream
        run_pass(rt, lease_seconds=LEASE)
    while True:
        try:
            result = run_pass(rt, lease_seconds=LEASE)
            break
        except StreamBusyError:
            assert time.monotonic() - killed < LEASE + 3, "the dead pass blocked too long"
            time.sleep(0.1)
    assert result.epoch == 2 and result.parts_uploaded > 0


@pytest.mark.slow
def test_a_long_pass_keeps_its_lease(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass running many leases long (slow parts) renews its lease: every other pass
    meanwhile finds the stream busy, and the long pass commits."""
    rt = runtime
    setup(rt)
    slow_parts(monkeypatch, LEASE / 2)
    outcome: dict[str, Any] = {}

    def long_pass() -> None:
        try:
            outcome["result"] = run_pass(rt, lease_seconds=LEASE, close_now=True)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    worker = threading.Thread(target=long_pass)
    started = time.monotonic()
    worker.start()
    time.sleep(0.5)
    refused = 0
    while worker.is_alive():
        try:
            StreamingOffloader(rt, owner="other", lease_seconds=LEASE).run_pass(T)
        except StreamBusyError:
            refused += 1
        else:
            # taken only once the long pass released it, between is_alive and the claim: the
            # long pass has ended (had it been taken over, the long pass would have failed)
            worker.join(10)
            assert not worker.is_alive(), "another pass took the stream of a live pass"
            break
        worker.join(0.3)
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert time.monotonic() - started > 2 * LEASE, "the pass did not outlive its lease"
    assert result.committed and result.epoch == 1 and refused > 3


def test_a_pass_whose_renewals_fail_commits_nothing(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database refuses every renewal (a fault: it is unreachable for this pass) and
    the first part takes longer than the lease: the pass stops at its first commit, with
    nothing recorded, and the next pass takes the stream once the lease is over."""
    rt = runtime
    setup(rt)

    def unreachable(self: SegmentStore, claim: Any) -> None:
        raise OperationalError("UPDATE streams", {}, Exception("connection refused"))

    monkeypatch.setattr(SegmentStore, "renew", unreachable)
    slow_parts(monkeypatch, LEASE * 1.2)
    with pytest.raises(StreamFencedError, match="no renewal of its lease succeeded"):
        run_pass(rt, lease_seconds=LEASE)
    segments = rt.metadata.segments.of_topic(T)
    assert [s.state for s in segments] == [SegmentState.ASSIGNED]
    assert rt.metadata.segments.parts(segments[0]) == []
    assert segments[0].end is None

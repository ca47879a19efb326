"""Offloaders racing on the same ledger: exactly one commit, nothing leaked."""

import threading
import time

import pytest
import sqlalchemy as sa

from fixtures.backends import (
    POSTGRES_ONLY,
    make_topic,
    produce_ledgers,
    run_in_threads,
    unaccounted_objects,
)
from fixtures.metadata import list_attempts, pending_deletions
from offloader.exceptions import CommitFailedError
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import Attempt, AttemptState, OffloadState
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime


def test_concurrent_offloaders_commit_once(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt)
    ids = produce_ledgers(rt, "orders", [(30, 20_000), (30, 20_000)])
    checksum = TopicReader(rt).checksum("orders", Source.HOT)
    barrier = threading.Barrier(4)
    results = []

    def offload() -> None:
        # each racer has its own runtime: own connections, as separate workers would
        with Runtime.open(rt.settings) as mine:
            barrier.wait()
            results.extend(LedgerOffloader(mine).offload_topic("orders", up_to=ids[-1]))

    errors = run_in_threads(offload, 4)
    assert not errors
    for ledger_id in ids:
        outcomes = [r.outcome for r in results if r.ledger_id == ledger_id]
        assert outcomes.count(Outcome.OFFLOADED) == 1, outcomes
        assert set(outcomes) <= {
            Outcome.OFFLOADED,
            Outcome.IN_PROGRESS,
            Outcome.ALREADY_OFFLOADED,
            Outcome.LOST,
        }
        committed = [
            a
            for a in list_attempts(rt.metadata, "orders", AttemptState.COMMITTED)
            if a.ledger_id == ledger_id
        ]
        assert len(committed) == 1
    assert TopicReader(rt).checksum("orders", Source.TIERED) == checksum
    assert unaccounted_objects(rt) == set()


def test_loser_of_the_commit_queues_its_objects(runtime: Runtime) -> None:
    """An attempt whose lease ran out uploads anyway; the newer attempt commits first; the
    older one's commit fails and its objects end up in the deletion queue."""
    rt = runtime
    make_topic(rt)
    (ledger_id,) = produce_ledgers(rt, "orders", [(10, 1000)])
    offloader = LedgerOffloader(rt)
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    ledger, old = rt.metadata.attempts.begin(
        ledger,
        "0" * 8 + "-old",
        "old-data",
        "old-index",
        "zombie",
        lease_ms=-1,
        store_id=rt.stores.default_id(),
    )
    rt.objects.put("old-data", b"partial upload of a zombie")
    result = offloader.offload_ledger("orders", ledger_id)  # supersedes the stale attempt
    assert result.outcome is Outcome.OFFLOADED
    rt.objects.put("old-index", b"written after the takeover")
    with pytest.raises(CommitFailedError, match="no longer owns"):
        rt.metadata.attempts.commit(old, 1)
    rt.metadata.attempts.fail(old, "lost the commit")
    queued = [d.object_key for d in pending_deletions(rt.metadata)]
    assert queued.count("old-data") == 2 and queued.count("old-index") == 2
    assert rt.metadata.get_ledger("orders", ledger_id).offload_attempt_id == result.attempt_id
    assert unaccounted_objects(rt) == set()


@POSTGRES_ONLY
def test_database_connection_dropped_at_commit(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends the offloader's session (``pg_terminate_backend`` from another
    session) just as it commits: the commit did not happen, so the attempt is failed and
    its keys queued, nothing half-done; the rerun commits exactly one attempt."""
    rt = runtime
    make_topic(rt)
    (ledger_id,) = produce_ledgers(rt, "orders", [(30, 20_000)])
    checksum = TopicReader(rt).checksum("orders", Source.HOT)
    committing: list[Attempt] = []
    terminated: list[int] = []
    commit_offload = rt.metadata.attempts.commit

    def arm(attempt: Attempt, data_len: int) -> object:
        committing.append(attempt)
        return commit_offload(attempt, data_len)

    def drop_the_session(conn: sa.Connection) -> None:
        if not committing or terminated:
            return
        pid = conn.connection.dbapi_connection.get_backend_pid()  # type: ignore[union-attr]
        terminated.append(pid)
        terminate_backend(rt.settings.resolved_metadata_url, pid)

    monkeypatch.setattr(rt.metadata.attempts, "commit", arm)
    sa.event.listen(rt.metadata.engine, "commit", drop_the_session)
    try:
        with pytest.raises(sa.exc.OperationalError):
            LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    finally:
        sa.event.remove(rt.metadata.engine, "commit", drop_the_session)
        monkeypatch.undo()
    assert len(terminated) == 1 and len(committing) == 1
    (attempt,) = committing

    ledger = rt.metadata.get_ledger("orders", ledger_id)
    assert not ledger.is_offloaded and ledger.attempt_id is None
    assert ledger.offload_state is OffloadState.NONE
    failed = rt.metadata.attempts.get(attempt.attempt_id)
    assert failed.state is AttemptState.FAILED and "OperationalError" in (failed.detail or "")
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    assert queued == {attempt.data_key, attempt.index_key}
    assert unaccounted_objects(rt) == set()

    assert LedgerOffloader(rt).offload_ledger("orders", ledger_id).outcome is Outcome.OFFLOADED
    (committed,) = list_attempts(rt.metadata, "orders", AttemptState.COMMITTED)
    assert committed.attempt_id == rt.metadata.get_ledger("orders", ledger_id).offload_attempt_id
    assert TopicReader(rt).checksum("orders", Source.TIERED) == checksum
    assert process_deletions(rt.metadata, rt.stores, rt.settings).remaining == 0
    assert {i.key for i in rt.objects.list()} == {committed.data_key, committed.index_key}


def terminate_backend(url: str, pid: int) -> None:
    """End session ``pid`` from a session of its own, and wait until it is gone."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
            deadline = time.monotonic() + 60  # a loaded machine can take seconds
            while time.monotonic() < deadline:
                alive = conn.execute(
                    sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}
                ).scalar()
                # pg_stat_activity is a snapshot kept until the transaction ends: end it, or
                # every later poll sees the first answer again
                conn.rollback()
                if not alive:
                    return
                time.sleep(0.01)
        raise AssertionError(f"backend {pid} still alive after pg_terminate_backend")
    finally:
        engine.dispose()

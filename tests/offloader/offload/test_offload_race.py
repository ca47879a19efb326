"""Offloaders racing on the same ledger: exactly one commit, nothing leaked."""

import threading

import pytest

from fixtures.backends import make_topic, produce_ledgers, run_in_threads, unaccounted_objects
from offloader.exceptions import CommitFailedError
from offloader.metadata import AttemptState
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
            for a in rt.metadata.list_attempts("orders", AttemptState.COMMITTED)
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
    ledger, old = rt.metadata.begin_attempt(
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
        rt.metadata.commit_offload(old, 1)
    rt.metadata.fail_attempt(old, "lost the commit")
    queued = [d.object_key for d in rt.metadata.pending_deletions()]
    assert queued.count("old-data") == 2 and queued.count("old-index") == 2
    assert rt.metadata.get_ledger("orders", ledger_id).offload_uuid == result.attempt_id
    assert unaccounted_objects(rt) == set()

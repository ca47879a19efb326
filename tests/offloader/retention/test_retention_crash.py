"""`offloader retention` SIGKILLed at each step, then run again: it converges. Right after
the kill nothing below a moved start is readable and nothing above it is lost; after the
rerun and a GC pass the store holds exactly what the kept ledgers reference."""

from __future__ import annotations

import hashlib
import signal
from types import SimpleNamespace

import pytest

from fixtures.backends import make_topic, produce_ledgers, run_cli, unaccounted_objects
from offloader.exceptions import TrimmedError
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import DeletionState, HotState
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import TopicReader
from offloader.retention.cuts import take_cut
from offloader.retention.deletion import finish_deleted_ledgers
from offloader.runtime import Runtime

TOPIC = "orders"


def setup_topic(rt: Runtime) -> tuple[list[int], int]:
    """Five ledgers (1-3 offloaded, 1-2 hot copies gone), a cut before each; a size policy
    that keeps the newest two. Returns the ids and the first kept ledger id."""
    make_topic(rt, TOPIC)
    ids = []
    for seed in range(5):
        take_cut(rt, TOPIC)
        ids += produce_ledgers(rt, TOPIC, [(6, 3000)], seed=seed)
    LedgerOffloader(rt).offload_topic(TOPIC, up_to=ids[1])
    delete_hot_copies(rt.metadata, rt.hot, TOPIC)
    LedgerOffloader(rt).offload_topic(TOPIC, up_to=ids[2])
    ledgers = rt.metadata.list_ledgers(TOPIC)
    keep = sum(x.size_bytes for x in ledgers[-2:])
    topic = rt.metadata.get_topic(TOPIC)
    rt.metadata.set_policy(topic, topic.policy.updated({"retention_size_bytes": keep}))
    return ids, ids[3]


def digest(rt: Runtime, ledger_id: int) -> str:
    h = hashlib.sha256()
    for _, payload in TopicReader(rt).read(TOPIC, ledger_id):
        h.update(payload)
    return h.hexdigest()


@pytest.mark.parametrize(
    "point",
    [
        "after-retention-cut",
        "after-trim-start-moved",
        "mid-trim-ledgers",
        "after-ledger-deleting",
        "after-trim-hot-delete",
    ],
)
def test_killed_retention_converges_on_rerun(runtime: Runtime, point: str) -> None:
    rt = runtime
    ids, first_kept = setup_topic(rt)
    kept = [i for i in ids if i >= first_kept]
    below = [i for i in ids if i < first_kept]
    before = {i: digest(rt, i) for i in kept}
    # one ledger per marking batch, so 'mid-trim-ledgers' is reached
    child = SimpleNamespace(settings=rt.settings.model_copy(update={"trim_batch_ledgers": 1}))

    killed = run_cli(child, "retention", TOPIC, failpoints=point)  # type: ignore[arg-type]
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, point
    start = rt.metadata.get_topic(TOPIC).start
    if point == "after-retention-cut":
        assert start.key() == (0, 0)  # nothing trimmed yet
    else:
        assert start.ledger_id == first_kept  # the start moved first (invariant 4)
        for ledger_id in below:
            with pytest.raises(TrimmedError):
                list(TopicReader(rt).read(TOPIC, ledger_id))
    assert {i: digest(rt, i) for i in kept} == before  # nothing above the start lost
    assert unaccounted_objects(rt) == set()

    rerun = run_cli(child, "retention", TOPIC)  # type: ignore[arg-type]
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert b"trimmed at cut" in out, out
    assert rt.metadata.get_topic(TOPIC).start.ledger_id == first_kept
    ledgers = {x.ledger_id: x for x in rt.metadata.list_ledgers(TOPIC)}
    for ledger_id in below:
        assert ledgers[ledger_id].deletion_state is DeletionState.DELETING
        assert ledgers[ledger_id].hot_state is HotState.DELETED
        assert not rt.hot.exists(TOPIC, ledger_id)
    assert all(ledgers[i].deletion_state is DeletionState.NONE for i in kept)
    assert {i: digest(rt, i) for i in kept} == before
    assert unaccounted_objects(rt) == set()

    process_deletions(rt.metadata, rt.stores, rt.settings)
    finish_deleted_ledgers(rt)
    ledgers = {x.ledger_id: x for x in rt.metadata.list_ledgers(TOPIC)}
    assert all(ledgers[i].deletion_state is DeletionState.DELETED for i in below)
    expected = {
        k
        for i in kept
        if ledgers[i].is_offloaded
        for k in (ledgers[i].data_key, ledgers[i].index_key)
    }
    assert {o.key for o in rt.objects.list()} == expected
    assert rt.metadata.pending_deletions() == []

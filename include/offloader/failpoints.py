"""Named crash points for crash-safety tests, off unless ``OFFLOADER_FAILPOINTS`` names them.

``OFFLOADER_FAILPOINTS=after-commit`` makes the process kill itself with SIGKILL when it
reaches that point, exactly as a power cut or the OOM killer would: no cleanup runs.
``after-first-part:stop`` stops it with SIGSTOP instead (a long GC pause or a frozen VM),
so a test can let its lease run out and wake it as a zombie with SIGCONT. The list of
points is :data:`POINTS`; naming an unknown one is an error, so a typo cannot make a crash
test pass vacuously.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "after-begin-attempt",
    "after-first-part",
    "before-complete",
    "after-data-upload",
    "after-index-upload",
    "after-commit",
    "after-mark-hot-deleting",
    "after-store-delete",  # gc: the store deleted a batch, the queue not yet updated
    # the batched path (offload/batch.py): inside the one transaction that records a
    # window's attempts / commits its finished ones, after the first ledger's UPDATE; and
    # once the first ledger of a window is uploaded while the others are still in flight
    "mid-batch-begin",
    "after-first-ledger-upload",
    "mid-batch-commit",
    # scrub's repair (offload/ledger_offloader.py replace_ledger): inside the transaction
    # that swaps a damaged ledger onto its new objects, after the ledger's UPDATE and
    # before the old objects are queued; it passes the offload points above as well
    "mid-replacement-commit",
    # retention (retention/trim.py, retention/deletion.py): the start moved (or the topic
    # was marked deleted), nothing marked yet; a full batch of ledgers marked deleting and
    # more may follow; every ledger below the start marked, no hot file removed yet; the
    # first hot file of a batch removed, not yet recorded
    "after-trim-start-moved",
    # the start's record in the object store raised (retention/start_record.py), before
    # the start moves in the database
    "after-start-recorded",
    "mid-trim-ledgers",
    "after-ledger-deleting",
    "after-trim-hot-delete",
    # the orphan sweep (gc/sweep.py): the first page of orphans is queued, the rest not yet
    "after-sweep-enqueue",
    # metadata export (metadata/snapshot.py): the snapshot object is written, the manifest
    # that makes it the latest not yet
    "after-snapshot-upload",
    # retention (retention/run.py): apply_retention took its cut, nothing trimmed yet
    "after-retention-cut",
    # the streaming pass (stream/offloader.py): a segment's keys recorded, no upload yet;
    # its multipart upload created, not yet recorded; a part uploaded, not yet recorded;
    # a part recorded; the segment marked closing; its upload completed; its index
    # written, the commit not yet made; the commit made
    "stream-after-assign",
    "stream-after-create-upload",
    "stream-after-part-upload",
    "stream-after-part-record",
    "stream-after-begin-close",
    "stream-after-complete",
    "stream-after-index",
    "stream-after-commit",
    # a rewrite (rewrite/run.py: compaction, v1 -> v2 migration): its segment's intent
    # recorded, no upload yet; its multipart upload created, not yet recorded; the first
    # part uploaded; the upload completed; the index written, the swap not yet made;
    # inside the swap's transaction after the first source's UPDATE
    # (metadata/rewrites.py); the swap committed
    "rewrite-after-begin",
    "rewrite-after-create-upload",
    "rewrite-after-first-part",
    "rewrite-after-complete",
    "rewrite-after-index",
    "mid-rewrite-commit",
    "rewrite-after-commit",
)


ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def _armed() -> dict[str, signal.Signals]:
    armed = {}
    for item in filter(None, os.environ.get("OFFLOADER_FAILPOINTS", "").split(",")):
        name, _, action = item.partition(":")
        if name not in POINTS or (action or "kill") not in ACTIONS:
            raise ValueError(
                f"OFFLOADER_FAILPOINTS: unknown point or action {item!r}; points: "
                f"{', '.join(POINTS)}; actions: {', '.join(ACTIONS)}"
            )
        armed[name] = ACTIONS[action or "kill"]
    return armed


ARMED = _armed()


def reach(point: str) -> None:
    """Die (or freeze) here if the point is armed."""
    if point not in POINTS:
        raise ValueError(f"unknown failpoint {point!r}")
    if point in ARMED:
        os.kill(os.getpid(), ARMED[point])

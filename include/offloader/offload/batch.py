"""Offloading many ledgers of one topic together: the invariants per ledger, the round trips
shared.

A window of ledgers goes through the sequence of one ledger (intent -> upload -> CAS
commit), but each metadata step of the window is one transaction: the attempts of all its
ledgers are recorded together (each a CAS on its own row; a ledger that is not free is
skipped with its outcome), one lease keeper renews them all, their objects upload through
one bounded pool, and the finished ones commit together (each UPDATE still conditional on
attempt id and epoch; a loser is LOST alone, its objects queued in the same transaction).
A small ledger costs two PUTs and a fraction of three transactions instead of three.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from offloader import failpoints
from offloader.exceptions import CommitFailedError
from offloader.format import ENTRY_FRAME, HEADER_LEN
from offloader.keys import ledger_object_keys
from offloader.metadata import Attempt, Ledger, LedgerState, MetadataStore
from offloader.metadata.attempts import AttemptIntent
from offloader.offload.lease import LeaseKeeper, owner_id
from offloader.offload.outcome import OffloadResult, Outcome
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 64  # ledgers per begin/commit transaction
MAX_WINDOW = 1000  # keeps one statement's bound parameters well inside SQLite's limit


class LedgerSteps(Protocol):
    """What a window takes from the one-ledger path (``ledger_offloader.LedgerOffloader``):
    stated here so that path can hand a topic's due ledgers to a window without the two
    modules importing each other."""

    runtime: Runtime
    metadata: MetadataStore

    def policy(self, topic: str) -> OffloadPolicy: ...

    def offload_ledger(self, topic: str, ledger_id: int) -> OffloadResult: ...

    def _upload(self, ledger: Ledger, attempt: Attempt, check: Callable[[], None]) -> int: ...

    def _finish_stale(self, ledger: Ledger) -> OffloadResult | None: ...

    def _still_owns(self, attempt: Attempt) -> bool: ...

    def _fail_quietly(self, attempt: Attempt, exc: BaseException) -> None: ...


class BatchOffloader:
    """Offloads a list of ledgers of one topic, ``window`` ledgers at a time."""

    def __init__(self, offloader: LedgerSteps, window: int = DEFAULT_WINDOW) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"window must be an integer from 1 to {MAX_WINDOW}, got {window!r}")
        self.offloader = offloader
        self.metadata = offloader.metadata
        self.settings = offloader.runtime.settings
        self.window = window
        self._first_upload = threading.Event()

    def offload(self, topic: str, ledger_ids: Iterable[int]) -> list[OffloadResult]:
        """One result per ledger, in the order given. Idempotent, like ``offload_ledger``.

        Every ledger is checked before anything changes (a missing or open ledger is an
        error naming it). If a ledger's upload fails for a reason other than losing it,
        the window's finished ledgers still commit, then the error propagates.
        """
        ids = list(ledger_ids)
        if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise TypeError(f"ledger ids must be integers, got {ids!r}")
        if len(set(ids)) != len(ids):
            raise ValueError(f"ledger ids must be unique, got {ids!r}")
        ledgers = self.metadata.get_ledgers(topic, ids) if ids else {}
        still_open = [
            i for i in ids if ledgers[i].state is not LedgerState.SEALED and ledgers[i].is_live
        ]
        if still_open:
            raise ValueError(f"ledgers {still_open} of {topic} are open; only sealed ledgers move")
        results: dict[int, OffloadResult] = {}
        for start in range(0, len(ids), self.window):
            window = ids[start : start + self.window]
            if start:  # later windows: read again, another worker may have moved them
                ledgers = self.metadata.get_ledgers(topic, window)
            start = self.metadata.get_topic(topic).start_ledger_id  # a trim may move it
            results.update(self._window([ledgers[i] for i in window], start))
        return [results[i] for i in ids]

    def _window(self, ledgers: list[Ledger], start_ledger_id: int) -> dict[int, OffloadResult]:
        results: dict[int, OffloadResult] = {}
        free = []
        for ledger in ledgers:
            settled = self._settled(ledger, start_ledger_id)
            if settled is None:
                free.append(ledger)
            else:
                results[ledger.ledger_id] = settled
        intents = [_intent(ledger) for ledger in free]
        lease_ms = int(self.settings.attempt_lease_seconds * 1000)
        attempts = (
            self.metadata.attempts.begin_batch(
                intents, owner_id(), lease_ms, store_id=self.offloader.runtime.stores.default_id()
            )
            if intents
            else {}
        )
        skipped = [i.ledger for i in intents if i.ledger.ledger_id not in attempts]
        for ledger in self._reread(skipped):
            outcome = Outcome.ALREADY_OFFLOADED if ledger.is_offloaded else Outcome.IN_PROGRESS
            outcome = outcome if ledger.is_live else Outcome.TRIMMED
            results[ledger.ledger_id] = OffloadResult(
                ledger.topic,
                ledger.ledger_id,
                outcome,
                ledger.offload_attempt_id or ledger.attempt_id,
            )
        if not attempts:
            return results
        failpoints.reach("after-begin-attempt")
        by_id = {ledger.ledger_id: ledger for ledger in free}
        uncommitted = dict(attempts)
        try:
            results.update(self._upload_and_commit(by_id, attempts, uncommitted))
        except BaseException as exc:
            for attempt in uncommitted.values():
                self.offloader._fail_quietly(attempt, exc)
            raise
        return results

    def _settled(self, ledger: Ledger, start_ledger_id: int) -> OffloadResult | None:
        """The outcome of a ledger that needs no new attempt; None if it needs one."""
        if not ledger.is_live or ledger.ledger_id < start_ledger_id:
            return OffloadResult(ledger.topic, ledger.ledger_id, Outcome.TRIMMED)
        if ledger.is_offloaded:
            return OffloadResult(
                ledger.topic, ledger.ledger_id, Outcome.ALREADY_OFFLOADED, ledger.offload_attempt_id
            )
        if ledger.entry_count == 0:  # the single-ledger path owns the empty-ledger rule
            return self.offloader.offload_ledger(ledger.topic, ledger.ledger_id)
        if ledger.attempt_id is None:
            return None
        if (ledger.attempt_lease_ms or 0) > self.metadata.db_now_ms():
            return OffloadResult(
                ledger.topic, ledger.ledger_id, Outcome.IN_PROGRESS, ledger.attempt_id
            )
        return self.offloader._finish_stale(ledger)  # rare: a crashed attempt's leftovers

    def _reread(self, ledgers: list[Ledger]) -> list[Ledger]:
        if not ledgers:
            return []
        fresh = self.metadata.get_ledgers(ledgers[0].topic, [x.ledger_id for x in ledgers])
        return [fresh[x.ledger_id] for x in ledgers]

    def _upload_and_commit(
        self,
        ledgers: dict[int, Ledger],
        attempts: dict[int, Attempt],
        uncommitted: dict[int, Attempt],
    ) -> dict[int, OffloadResult]:
        started = time.monotonic()
        with LeaseKeeper(
            self.metadata.attempts, attempts.values(), self.settings.attempt_lease_seconds
        ) as lease:
            outcomes = self._upload_all(ledgers, attempts, lease)
        finished = [(attempts[i], n) for i, n in outcomes.items() if isinstance(n, int)]
        committed = self.metadata.attempts.commit_batch(finished) if finished else set()
        for attempt, _ in finished:  # committed, or retired and queued by commit_batch
            uncommitted.pop(attempt.ledger_id)
        if committed:
            failpoints.reach("after-commit")
        seconds = time.monotonic() - started
        results: dict[int, OffloadResult] = {}
        for attempt, length in finished:
            ok = attempt.attempt_id in committed
            if not ok:
                log.warning("offload of %s/%s lost the commit", attempt.topic, attempt.ledger_id)
            results[attempt.ledger_id] = OffloadResult(
                attempt.topic,
                attempt.ledger_id,
                Outcome.OFFLOADED if ok else Outcome.LOST,
                attempt.attempt_id,
                length if ok else 0,
                seconds,
            )
        error: BaseException | None = None
        for ledger_id, exc in outcomes.items():
            if isinstance(exc, int):
                continue
            attempt = uncommitted.pop(ledger_id)
            if isinstance(exc, CommitFailedError) or not self.offloader._still_owns(attempt):
                log.warning("offload of %s/%s lost: %s", attempt.topic, ledger_id, exc)
                self.metadata.attempts.fail(attempt, f"lost: {exc}")
                results[ledger_id] = OffloadResult(
                    attempt.topic, ledger_id, Outcome.LOST, attempt.attempt_id
                )
                continue
            self.offloader._fail_quietly(attempt, exc)
            error = error or exc
        log.info("offloaded %d of %d ledgers in %.3fs", len(committed), len(attempts), seconds)
        if error is not None:
            raise error
        return results

    def _upload_all(
        self, ledgers: dict[int, Ledger], attempts: dict[int, Attempt], lease: LeaseKeeper
    ) -> dict[int, int | BaseException]:
        """Data length or the error, per ledger. Small ledgers (one block) upload side by
        side through one pool of ``upload_concurrency``; a large one alone, with that many
        parts in flight: either way at most ``upload_concurrency`` requests at once."""
        concurrency = self.settings.upload_concurrency
        outcomes: dict[int, int | BaseException] = {}

        def one(ledger_id: int) -> int | BaseException:
            attempt = attempts[ledger_id]

            def check() -> None:
                lease.check(attempt.attempt_id)

            try:
                length = self.offloader._upload(ledgers[ledger_id], attempt, check)
                check()
            except Exception as exc:
                return exc
            if not self._first_upload.is_set():  # once a batch, as its name says
                self._first_upload.set()
                failpoints.reach("after-first-ledger-upload")
            return length

        small = [i for i in attempts if self._single_block(ledgers[i])]
        large = [i for i in attempts if i not in set(small)]
        if small:
            with ThreadPoolExecutor(concurrency, thread_name_prefix="upload-ledger") as pool:
                outcomes.update(zip(small, pool.map(one, small), strict=True))
        for ledger_id in large:
            outcomes[ledger_id] = one(ledger_id)
        return outcomes

    def _single_block(self, ledger: Ledger) -> bool:
        policy = self.offloader.policy(ledger.topic)
        encoded = HEADER_LEN + ledger.entry_count * ENTRY_FRAME + ledger.size_bytes
        return encoded <= policy.max_block_size


def _intent(ledger: Ledger) -> AttemptIntent:
    attempt_id = str(uuid.uuid4())
    data_key, index_key = ledger_object_keys(attempt_id, ledger.ledger_id)
    return AttemptIntent(ledger, attempt_id, data_key, index_key)


__all__ = ["DEFAULT_WINDOW", "BatchOffloader"]

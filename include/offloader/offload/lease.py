"""Keeping offload attempts' leases alive while they upload (invariant 6: epoch fencing)."""

from __future__ import annotations

import abc
import logging
import os
import socket
import threading
from collections.abc import Iterable
from typing import ClassVar, Self

from offloader.exceptions import CommitFailedError
from offloader.metadata import Attempt
from offloader.metadata.attempts import AttemptStore

log = logging.getLogger(__name__)
# How long leaving the keeper waits for its thread beyond one renewal interval. A renewal
# stuck on the database must not hold the finished upload hostage: the thread is a daemon
# and its renewals are fenced (a finished attempt no longer owns its ledger).
STOP_GRACE_SECONDS = 10.0


def owner_id() -> str:
    """Who holds an attempt's lease: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaseRenewal(abc.ABC):
    """Renews a lease every third of its length from a daemon thread while in its ``with``
    block, until :meth:`_renew_once` says there is nothing left to renew: what an offload
    attempt's keeper and a rewrite segment's share."""

    #: the renewing thread's name
    thread_name: ClassVar[str]

    def __init__(self, lease_seconds: float) -> None:
        self._lease_ms = int(lease_seconds * 1000)
        self._interval = max(lease_seconds / 3, 0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self._interval + STOP_GRACE_SECONDS)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if not self._renew_once():
                return

    @abc.abstractmethod
    def _renew_once(self) -> bool:
        """One renewal; whether to go on renewing."""


class LeaseKeeper(LeaseRenewal):
    """Renews the leases of one attempt, or of a batch's attempts in one transaction, every
    third of their length from a daemon thread.

    Once a renewal finds that another attempt owns a ledger, :meth:`check` for that attempt
    raises, so its uploader stops early instead of finishing work that can never commit;
    the other attempts of the batch carry on.
    """

    thread_name = "offload-lease"

    def __init__(
        self, store: AttemptStore, attempts: Attempt | Iterable[Attempt], lease_seconds: float
    ) -> None:
        self._store = store
        batch = [attempts] if isinstance(attempts, Attempt) else list(attempts)
        self._attempts = {a.attempt_id: a for a in batch}
        self._single = batch[0] if isinstance(attempts, Attempt) else None
        self._lost: set[str] = set()
        super().__init__(lease_seconds)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self._thread.is_alive():
            log.warning(
                "lease renewal of %d attempt(s) did not stop within %.0f s; left to end on its own",
                len(self._attempts),
                self._interval + STOP_GRACE_SECONDS,
            )

    def check(self, attempt_id: str | None = None) -> None:
        """Raise CommitFailedError if the attempt (the only one when None) lost its ledger."""
        attempt = self._attempts[attempt_id] if attempt_id else self._single
        if attempt is None:
            raise TypeError("a batch's lease keeper checks one attempt: pass its attempt_id")
        if attempt.attempt_id in self._lost:
            raise CommitFailedError(
                f"attempt {attempt.attempt_id} lost ledger "
                f"{attempt.topic}/{attempt.ledger_id} to another attempt"
            )

    def _renew(self) -> set[str]:
        if self._single is not None:  # one attempt: the store's single-ledger renewal
            ok = self._store.renew(self._single, self._lease_ms)
            return set() if ok else {self._single.attempt_id}
        live = [a for a in self._attempts.values() if a.attempt_id not in self._lost]
        return self._store.renew_batch(live, self._lease_ms)

    def _renew_once(self) -> bool:
        try:
            self._lost |= self._renew()
        except Exception:
            return True
        return len(self._lost) != len(self._attempts)

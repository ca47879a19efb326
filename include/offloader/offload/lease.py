"""Keeping an offload attempt's lease alive while it uploads (invariant 6: epoch fencing)."""

from __future__ import annotations

import threading

from offloader.exceptions import CommitFailedError
from offloader.metadata import Attempt, MetadataStore


class LeaseKeeper:
    """Renews the attempt's lease every third of its length from a daemon thread.

    Once a renewal finds that another attempt owns the ledger, :meth:`check` raises, so the
    uploader stops early instead of finishing work that can never commit.
    """

    def __init__(self, metadata: MetadataStore, attempt: Attempt, lease_seconds: float) -> None:
        self._metadata = metadata
        self._attempt = attempt
        self._lease_ms = int(lease_seconds * 1000)
        self._interval = max(lease_seconds / 3, 0.05)
        self._stop = threading.Event()
        self._lost = False
        self._thread = threading.Thread(target=self._run, name="offload-lease", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def check(self) -> None:
        if self._lost:
            raise CommitFailedError(
                f"attempt {self._attempt.attempt_id} lost ledger "
                f"{self._attempt.topic}/{self._attempt.ledger_id} to another attempt"
            )

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not self._metadata.renew_lease(self._attempt, self._lease_ms):
                    self._lost = True
                    return
            except Exception:
                continue

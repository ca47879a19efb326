"""Keeping a streaming pass's claim on its topic alive while it works (invariant 6).

The stream's lease is short (``stream_lease_seconds``, 30 s by default), so a pass that
dies blocks its topic for about that long, not for a whole DAG interval. A running pass
keeps it: a daemon thread (the renewal shared with offload attempts and rewrites,
offload/lease.py) renews it every third of its length on the database's clock
(``lease_until_ms = now() + lease``, fenced by the pass's epoch). :meth:`check`, called
before each commit of the pass, raises once the pass has lost the stream: a renewal found
a newer epoch, or no renewal has succeeded for a whole lease (the database unreachable or
the process frozen), after which another pass may already hold the topic.
"""

from __future__ import annotations

import logging
import time

from offloader.exceptions import StreamFencedError
from offloader.metadata import StreamClaim
from offloader.metadata.segments import SegmentStore
from offloader.offload.lease import LeaseRenewal

log = logging.getLogger(__name__)


class StreamLease(LeaseRenewal):
    """Renews ``claim``'s lease from a daemon thread while in its ``with`` block."""

    thread_name = "stream-lease"

    def __init__(self, segments: SegmentStore, claim: StreamClaim, claimed_at: float) -> None:
        """``claimed_at``: ``time.monotonic()`` taken before the claim was asked for."""
        self._segments = segments
        self._claim = claim
        self._lost: str | None = None
        # monotonic time the claim or the last successful renewal was asked for: the lease
        # runs at least a lease's length from then, on the database's clock
        self._held_since = claimed_at
        super().__init__(claim.lease_ms / 1000)

    def check(self) -> None:
        """Raise StreamFencedError once the pass may no longer hold its stream."""
        if self._lost is None and time.monotonic() - self._held_since >= self._lease_ms / 1000:
            self._lost = "no renewal of its lease succeeded for a whole lease"
        if self._lost is not None:
            raise StreamFencedError(
                f"topic {self._claim.topic!r}: this pass (epoch {self._claim.epoch}) lost the "
                f"stream ({self._lost}); it commits nothing more"
            )

    def _renew_once(self) -> bool:
        asked = time.monotonic()
        try:
            self._segments.renew(self._claim)
        except StreamFencedError as exc:
            self._lost = str(exc)
            return False
        except Exception:  # a database hiccup: the next renewal tries again
            log.warning("renewing the stream of %s failed", self._claim.topic, exc_info=True)
            return True
        self._held_since = max(self._held_since, asked)
        return True

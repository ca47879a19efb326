"""Keeping a rewrite segment's lease alive while its parts upload (invariant 6).

A rewrite owns its segment only while the lease recorded on it (database clock) has not
run out. A daemon thread renews it every third of its length; once a renewal finds the
segment no longer open or the lease over (the run froze and was recovered), :meth:`check`
raises, so the run stops instead of uploading what can never be committed.
"""

from __future__ import annotations

import logging

from offloader.exceptions import CommitFailedError
from offloader.metadata import MetadataStore, Segment
from offloader.offload.lease import LeaseRenewal

log = logging.getLogger(__name__)


class RewriteLease(LeaseRenewal):
    """Renews ``segment``'s lease from a daemon thread while in its ``with`` block."""

    thread_name = "rewrite-lease"

    def __init__(self, metadata: MetadataStore, segment: Segment, lease_seconds: float) -> None:
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {lease_seconds}")
        self._metadata = metadata
        self._segment = segment
        self._lost = False
        super().__init__(lease_seconds)

    def check(self) -> None:
        """Raise CommitFailedError once a renewal found the segment lost."""
        if self._lost:
            raise CommitFailedError(
                f"rewrite segment {self._segment.segment_id} lost its lease: this run "
                "commits nothing"
            )

    def _renew_once(self) -> bool:
        try:
            if not self._metadata.rewrites.renew(self._segment, self._lease_ms):
                self._lost = True
                return False
        except Exception:  # a database hiccup: the next renewal tries again
            log.warning("renewing the lease of %s failed", self._segment.segment_id, exc_info=True)
        return True

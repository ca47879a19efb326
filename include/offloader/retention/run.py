"""Automated retention (PDP-19): take a cut at the topic's end, choose where the policy
truncates, trim there.

Only committed data counts toward size: a cut's ``offset_bytes`` sums the recorded
``size_bytes`` of the sealed ledgers below it, each ledger once whatever its tier (hot,
offloaded, or both during the deletion lag). An upload in flight adds nothing: its
partial objects and its attempt row are never counted, and the ledger it copies counts
once, as the sealed hot data it is. Entries of the open ledger count once it is sealed.

The cuts a rule may choose are selected in SQL (the newest qualifying cut, through the
topic's cut index), so the cost does not grow with the topic's history. Ages are measured
on the database's clock: the time rule is relative to when the end cut was taken.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

from offloader import failpoints
from offloader.metadata import StreamCut
from offloader.policy import OffloadPolicy
from offloader.results import fields_json
from offloader.retention.cuts import take_cut
from offloader.retention.policy import RetentionBounds, choose_cut, retention_bounds
from offloader.retention.trim import TrimResult, trim_topic
from offloader.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionResult:
    """What one application of a topic's retention policy chose and did."""

    topic: str
    end: StreamCut  # the topic's end when the policy was applied (dry run: not stored)
    bounds: RetentionBounds
    chosen: StreamCut | None  # where the policy truncates; None keeps everything
    retained_bytes: int | None  # committed bytes at or above the chosen cut
    trim: TrimResult | None  # None when nothing was chosen
    dry_run: bool

    @property
    def changed(self) -> bool:
        return self.trim is not None and self.trim.changed

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        """One line for logs and the CLI."""
        if self.chosen is None:
            why = "no retention rule set" if not self.bounds.active else "no cut old enough"
            return (
                f"keeps everything ({why}; end {self.end.position}, {self.end.offset_bytes} bytes)"
            )
        assert self.trim is not None
        verb = "would trim" if self.dry_run else "trimmed"
        return (
            f"{verb} at cut {self.chosen.cut_id} ({self.chosen.position}), keeping "
            f"{self.retained_bytes} bytes; start {self.trim.start_before} -> "
            f"{self.trim.start_after}, ledgers deleting {self.trim.ledgers_deleting}, "
            f"{self.trim.queued_keys} keys queued"
        )


def apply_retention(
    rt: Runtime,
    topic: str,
    *,
    dry_run: bool = False,
    end: StreamCut | None = None,
    policy: OffloadPolicy | None = None,
) -> RetentionResult:
    """Apply ``topic``'s retention policy once (or ``policy``, validated, for one run).

    ``end`` is a cut already taken at the topic's end (the retention DAG's cut generation
    task); otherwise one is taken here, or in a dry run computed without being stored.
    A trim at or below the start moves nothing but finishes a trim that was cut short,
    so applying the policy again after a crash converges.
    """
    policy = policy or rt.metadata.get_topic(topic).policy
    if end is None:
        end = rt.metadata.retention.end_cut(topic) if dry_run else take_cut(rt, topic)
        failpoints.reach("after-retention-cut")
    bounds = retention_bounds(policy, end.created_ms, end.offset_bytes)
    chosen = choose_cut(bounds, partial(rt.metadata.retention.newest_cut, topic))
    trim = None
    if chosen is not None:
        trim = trim_topic(rt, topic, chosen.position, dry_run=dry_run)
    result = RetentionResult(
        topic=topic,
        end=end,
        bounds=bounds,
        chosen=chosen,
        retained_bytes=None if chosen is None else end.offset_bytes - chosen.offset_bytes,
        trim=trim,
        dry_run=dry_run,
    )
    log.info("retention of %s: %s", topic, result)
    return result

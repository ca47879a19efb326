"""What a rewrite run did (or, dry, would do), per group and in total: for the CLI, the task
log and XCom (no credentials in it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offloader.exceptions import RewriteFailedError
from offloader.results import fields_json
from offloader.rewrite.plan import RewriteGroup

REWRITTEN = "rewritten"  # the output committed, the sources swapped onto it
CHANGED = "changed"  # a source moved since it was planned: nothing swapped, the next run re-plans
FAILED = "failed"  # an error; the rewrite was given up and its objects queued
PLANNED = "planned"  # a dry run: what would be rewritten


@dataclass
class GroupResult:
    """What became of one group: its sources, the outcome, the output segment."""

    topic: str
    kind: str  # of its sources: ledger (v1 objects) or segment
    ledgers: list[int]  # the ledger ids its sources hold
    sources: int
    objects_before: int  # data and index objects of the sources
    bytes_before: int  # the sources' data objects
    outcome: str
    objects_after: int = 0  # of the output, once rewritten
    bytes_after: int = 0
    segment_id: str | None = None
    detail: str | None = None

    @classmethod
    def of(cls, group: RewriteGroup, outcome: str, **values: Any) -> GroupResult:
        return cls(
            topic=group.topic,
            kind=group.kind,
            ledgers=group.ledger_ids,
            sources=len(group.sources),
            objects_before=group.objects,
            bytes_before=group.bytes,
            outcome=outcome,
            **values,
        )

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        ids = f"{self.ledgers[0]}..{self.ledgers[-1]}" if self.ledgers else "-"
        text = (
            f"{self.topic}: {self.sources} {self.kind} object(s) of ledgers {ids} "
            f"({self.objects_before} objects, {self.bytes_before} bytes)"
        )
        if self.outcome == REWRITTEN:
            text += (
                f" -> segment {self.segment_id} ({self.objects_after} objects, "
                f"{self.bytes_after} bytes)"
            )
        text += f": {'would be rewritten' if self.outcome == PLANNED else self.outcome}"
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass
class RewriteReport:
    """A run's groups, the groups left for the next run and the dead rewrites it failed."""

    mode: str
    dry_run: bool
    groups: list[GroupResult] = field(default_factory=list)
    left: int = 0  # groups planned beyond the run's max_groups: the next run goes on
    recovered: list[str] = field(default_factory=list)  # dead rewrites this run failed
    # the URLs of the stores the rewritten groups were read from and written to
    stores_read: list[str] = field(default_factory=list)
    stores_written: list[str] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        """Objects and bytes before and after, over the groups rewritten (planned, dry)."""
        done = [g for g in self.groups if g.outcome in (REWRITTEN, PLANNED)]
        return {
            "groups": len(done),
            "objects_before": sum(g.objects_before for g in done),
            "objects_after": sum(2 if g.outcome == PLANNED else g.objects_after for g in done),
            "bytes_before": sum(g.bytes_before for g in done),
            "bytes_after": sum(g.bytes_after for g in done),
        }

    def to_json(self) -> dict[str, Any]:
        return {**fields_json(self), "totals": self.totals()}

    def __str__(self) -> str:
        lines = [str(g) for g in self.groups] or ["(nothing to rewrite)"]
        t = self.totals()
        verb = "would rewrite" if self.dry_run else "rewrote"
        after = "" if self.dry_run else f" -> {t['bytes_after']}"
        lines.append(
            f"{self.mode}: {verb} {t['groups']} group(s): objects {t['objects_before']} -> "
            f"{t['objects_after']}, bytes {t['bytes_before']}{after}"
        )
        if self.left:
            lines.append(f"{self.left} more group(s) left for the next run (max_groups)")
        if self.recovered:
            lines.append(f"dead rewrites recovered: {', '.join(self.recovered)}")
        return "\n".join(lines)

    def raise_for_failure(self) -> None:
        """After the other groups were done: fail naming the groups that failed."""
        bad = [g for g in self.groups if g.outcome == FAILED]
        if bad:
            first = bad[0]
            raise RewriteFailedError(
                f"{len(bad)} rewrite group(s) {first.outcome}; the first, of {first.topic} "
                f"ledgers {first.ledgers[0]}..{first.ledgers[-1]}: {first.detail}",
                report=self,
            )

"""The scrub report: counts, every damaged ledger (or streaming segment, with what became
of each ledger in it) with its findings and what was done.

Written as JSON where the caller says (``offloader scrub --report PATH``; the Spark job to
the file or object a URL names, offloader/scrub/output.py) and summarised for people.
Schema: docs/OPERATIONS.md.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from offloader.exceptions import ScrubFailedError
from offloader.fsutil import fsync_dir
from offloader.scrub.check import Finding, LedgerScrubResult

REPORT_FORMAT = "offloader-scrub-report"
REPORT_VERSION = 1


class Action(StrEnum):
    """What became of a damaged ledger. Only ``repaired`` and ``changed`` let a run pass."""

    REPAIRED = "repaired"  # offloaded again from its hot copy; the new objects scrub clean
    CHANGED = "changed"  # the ledger no longer names these objects (trimmed, or replaced)
    NOT_REPAIRED = "not-repaired"  # --no-repair: reported, nothing changed
    NO_HOT_COPY = "no-hot-copy"  # nothing to offload again from: the data is damaged
    IN_PROGRESS = "in-progress"  # another replacement attempt holds the ledger
    REPAIR_FAILED = "repair-failed"  # the new offload failed, or its objects are damaged too
    UNREADABLE = "unreadable"  # the store could not be read: nothing known, nothing done
    NOT_OFFLOADED = "not-offloaded"  # in a damaged segment, still being streamed: no swap yet


PASSING = frozenset({Action.REPAIRED, Action.CHANGED})


@dataclass(frozen=True)
class Counts:
    ledgers: int = 0
    objects: int = 0
    blocks: int = 0
    bytes: int = 0
    entries: int = 0

    @classmethod
    def of(cls, results: list[LedgerScrubResult]) -> Counts:
        return cls(
            ledgers=len(results),
            objects=sum(r.objects for r in results),
            blocks=sum(r.blocks for r in results),
            bytes=sum(r.bytes for r in results),
            entries=sum(r.entries for r in results),
        )


@dataclass(frozen=True)
class LedgerRepair:
    """What became of one ledger with entries in a damaged streaming segment (or of a
    damaged ledger's own objects): the action, why, the attempt that replaced them, and
    the findings of a replacement that is damaged too."""

    ledger_id: int
    action: Action
    detail: str
    replaced_by: str | None = None
    findings: tuple[Finding, ...] = ()

    @property
    def failed(self) -> bool:
        return self.action not in PASSING


@dataclass(frozen=True)
class LedgerVerdict:
    """A damaged ledger: its findings, what was done, and the attempt that replaced it.
    For a damaged streaming segment (``offload_uuid`` is its id, ``ledger_id`` its first
    ledger) ``ledgers`` says what became of each ledger in it; ``action`` is the first
    failed one's, else ``repaired`` (or ``changed`` when none needed a repair)."""

    topic: str
    ledger_id: int
    offload_uuid: str  # the attempt whose objects were scrubbed
    action: Action
    detail: str
    findings: tuple[Finding, ...]
    replaced_by: str | None = None  # the new committed attempt (repaired)
    ledgers: tuple[LedgerRepair, ...] = ()  # a segment's: one per ledger it holds

    @property
    def failed(self) -> bool:
        return self.action not in PASSING

    @property
    def failed_ledgers(self) -> list[tuple[int, Action]]:
        """The ledgers left damaged, by id, with their action."""
        if self.ledgers:
            return [(x.ledger_id, x.action) for x in self.ledgers if x.failed]
        return [(self.ledger_id, self.action)] if self.failed else []


@dataclass(frozen=True)
class ScrubReport:
    topics: list[str] | None  # None: every topic
    repair: bool
    started_ms: int
    finished_ms: int
    counts: Counts
    damaged: list[LedgerVerdict] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for v in self.damaged for f in v.findings]

    @property
    def failed(self) -> bool:
        return any(v.failed for v in self.damaged)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT,
            "format_version": REPORT_VERSION,
            "topics": self.topics,
            "repair": self.repair,
            "started_ms": self.started_ms,
            "finished_ms": self.finished_ms,
            "counts": asdict(self.counts),
            "failed": self.failed,
            "damaged_ledgers": [
                {
                    "topic": v.topic,
                    "ledger_id": v.ledger_id,
                    "offload_uuid": v.offload_uuid,
                    "action": v.action.value,
                    "failed": v.failed,
                    "detail": v.detail,
                    "replaced_by": v.replaced_by,
                    "findings": [_finding_json(f) for f in v.findings],
                    "ledgers": [
                        {
                            "ledger_id": x.ledger_id,
                            "action": x.action.value,
                            "failed": x.failed,
                            "detail": x.detail,
                            "replaced_by": x.replaced_by,
                            "findings": [_finding_json(f) for f in x.findings],
                        }
                        for x in v.ledgers
                    ],
                }
                for v in self.damaged
            ],
        }

    def __str__(self) -> str:
        c = self.counts
        lines = [
            f"scrubbed {c.ledgers} ledgers: {c.objects} objects, {c.blocks} blocks, "
            f"{c.bytes} bytes, {c.entries} entries; {len(self.damaged)} damaged, "
            f"{sum(not v.failed for v in self.damaged)} settled, "
            f"{sum(v.failed for v in self.damaged)} failed"
        ]
        for v in self.damaged:
            lines.append(f"{v.topic}/{v.ledger_id} ({v.offload_uuid}): {v.action}: {v.detail}")
            lines += [f"  {f.where}: {f.reason}" for f in v.findings]
            lines += [
                f"  ledger {v.topic}/{x.ledger_id}: {x.action}: {x.detail}" for x in v.ledgers
            ]
        return "\n".join(lines)

    def raise_for_failure(self) -> None:
        """ScrubFailedError naming the ledgers left damaged, if any (those of a damaged
        segment each by name)."""
        failed = [(v.topic, n, a) for v in self.damaged for n, a in v.failed_ledgers]
        if failed:
            shown = ", ".join(f"{topic}/{n} ({action})" for topic, n, action in failed[:10])
            more = f" and {len(failed) - 10} more" if len(failed) > 10 else ""
            raise ScrubFailedError(
                f"scrub found {len(failed)} damaged ledger(s) it did not repair: {shown}{more}",
                report=self,
            )

    def to_bytes(self) -> bytes:
        """The JSON document as written (sorted keys, indented, a final newline)."""
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()

    def write(self, path: str | os.PathLike[str]) -> Path:
        """The JSON report at ``path``, replaced atomically (a reader never sees half)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(self.to_bytes())
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(target.parent)
        return target


def check_report_path(path: str | os.PathLike[str]) -> Path:
    """``path`` if a report can be written there (a file, in an existing directory this
    process can write); ValueError naming it otherwise. Checked before a scrub reads or
    repairs anything, so a bad path changes nothing: a missing directory is not made (a
    typo in it would scatter reports where nobody looks)."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"scrub report {str(path)!r} is a directory: name a file")
    if not target.parent.is_dir():
        what = "is not a directory" if target.parent.exists() else "does not exist"
        raise ValueError(f"scrub report {str(path)!r}: the directory {str(target.parent)!r} {what}")
    if not os.access(target.parent, os.W_OK | os.X_OK):
        raise ValueError(f"scrub report {str(path)!r}: its directory is not writable")
    return target


def _finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "key": finding.key,
        "offset": finding.offset,
        "kind": finding.kind.value,
        "reason": finding.reason,
    }

"""Which sealed ledgers are due for offload, oldest first."""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import datetime

from offloader.metadata import HotState, Ledger, LedgerState, OffloadState
from offloader.policy import OffloadPolicy


@dataclass(frozen=True)
class CreationWindow:
    """Ledgers created in ``[start_ms, end_ms)`` (epoch milliseconds, UTC): the data
    interval of a backfill run, which offloads a past period whatever the policy says."""

    start_ms: int
    end_ms: int

    def __post_init__(self) -> None:
        for name in ("start_ms", "end_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be epoch milliseconds >= 0, got {value!r}")
        if self.start_ms >= self.end_ms:
            raise ValueError(
                f"the creation window [{self.start_ms}, {self.end_ms}) is empty: its start "
                "must be before its end (a zero-length data interval selects nothing)"
            )

    @classmethod
    def between(cls, start: datetime, end: datetime) -> CreationWindow:
        """From two timezone-aware datetimes (a run's data interval); naive ones are refused,
        since the same wall time is a different instant in every zone."""
        for name, value in (("start", start), ("end", end)):
            if not isinstance(value, datetime):
                raise TypeError(f"window {name} must be a datetime, got {value!r}")
            if value.utcoffset() is None:
                raise ValueError(f"window {name} {value.isoformat()} has no timezone")
        return cls(_epoch_ms(start), _epoch_ms(end))

    def contains(self, ledger: Ledger) -> bool:
        return self.start_ms <= ledger.created_ms < self.end_ms


def _epoch_ms(moment: datetime) -> int:
    """Floored to the millisecond, in integers (no float rounding); plain arithmetic on the
    fields, so datetime subclasses (Airflow hands over pendulum's) convert the same way."""
    seconds = calendar.timegm(moment.utctimetuple())
    return seconds * 1000 + moment.microsecond // 1000


def due_ledgers(
    ledgers: list[Ledger],
    policy: OffloadPolicy,
    now_ms: int,
    up_to: int | None = None,
    window: CreationWindow | None = None,
) -> list[Ledger]:
    """Sealed, not yet offloaded ledgers that a rule makes due, and empty ones to retire.

    ``up_to`` (an explicit prefix, like Pulsar's manual offload) makes every such ledger
    with an id <= ``up_to`` due whatever the policy says; ``window`` likewise every such
    ledger created inside it (both given: ledgers that pass both). Otherwise the size rule
    keeps at most ``offload_threshold_bytes`` of the topic hot (the open ledger counts but
    cannot move) and the age rule takes ledgers sealed longer than ``offload_age_seconds``
    ago. A sealed empty ledger (a writer killed right after a rollover leaves one) has
    nothing to offload or to wait for: it is always due, to be retired.
    """
    ordered = sorted(ledgers, key=lambda x: x.ledger_id)
    candidates = [
        ledger
        for ledger in ordered
        if ledger.state is LedgerState.SEALED
        and ledger.entry_count > 0
        and ledger.offload_state is not OffloadState.OFFLOADED
        and ledger.has_hot_copy
    ]
    empty = [ledger for ledger in ordered if is_retirable_empty(ledger)]
    if up_to is not None or window is not None:
        wanted = [
            ledger
            for ledger in candidates + empty
            if (up_to is None or ledger.ledger_id <= up_to)
            and (window is None or window.contains(ledger))
        ]
        return sorted(wanted, key=lambda x: x.ledger_id)

    due: dict[int, Ledger] = {ledger.ledger_id: ledger for ledger in empty}
    if policy.offload_threshold_bytes is not None:
        hot_bytes = sum(
            ledger.size_bytes
            for ledger in ledgers
            if ledger.has_hot_copy and ledger.offload_state is not OffloadState.OFFLOADED
        )
        for ledger in candidates:
            if hot_bytes <= policy.offload_threshold_bytes:
                break
            due[ledger.ledger_id] = ledger
            hot_bytes -= ledger.size_bytes
    if policy.offload_age_seconds is not None:
        cutoff = now_ms - int(policy.offload_age_seconds * 1000)
        for ledger in candidates:
            if ledger.sealed_ms is not None and ledger.sealed_ms <= cutoff:
                due[ledger.ledger_id] = ledger
    return [due[k] for k in sorted(due)]


def is_retirable_empty(ledger: Ledger) -> bool:
    """Sealed with no entries and a hot file still present (or half deleted by a crash).

    An open empty ledger is the writer's current one and is never touched.
    """
    return (
        ledger.state is LedgerState.SEALED
        and ledger.entry_count == 0
        and ledger.offload_state is OffloadState.NONE
        and ledger.attempt_id is None
        and ledger.hot_state is not HotState.DELETED
    )

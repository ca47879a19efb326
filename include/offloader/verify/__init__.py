"""Verify: check the promises the offloader makes against the metadata and the object
stores, and say exactly what is broken (docs/OPERATIONS.md, "After an incident: verify").

``objects`` is the LIST pass (recorded objects present and of their size; no orphan),
``checks`` the metadata's promises (one commit a ledger, readable at or above the start,
nothing readable below it, the deletion queue), ``deep`` the block reads of ``--deep``,
``report`` the breaches and counts, ``run`` the entry point.
"""

from offloader.verify.report import Breach, BreachKind, VerifyCounts, VerifyReport
from offloader.verify.run import verify_promises

__all__ = ["Breach", "BreachKind", "VerifyCounts", "VerifyReport", "verify_promises"]

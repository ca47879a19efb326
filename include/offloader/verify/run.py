"""`offloader verify`: prove after an incident that nothing was lost or leaked.

Cost: one LIST pass of each recorded store (paged, each page judged with a few statements),
the metadata's own questions, and with ``deep`` one read of every block. The checks run in
the order of the promises; a store that cannot be opened is one breach and the rest goes on.
Run it while the system is quiet: a commit made after it started is not judged, but an
object deleted under it while it lists may be reported missing (run it again to confirm).
"""

from __future__ import annotations

from offloader.runtime import Runtime
from offloader.scrub import check_topics
from offloader.verify.checks import check_below_start, check_commits, check_queue, check_readable
from offloader.verify.deep import check_blocks
from offloader.verify.objects import check_stores
from offloader.verify.report import VerifyReport


def verify_promises(rt: Runtime, *, topic: str | None = None, deep: bool = False) -> VerifyReport:
    """Check every promise (docs/OPERATIONS.md, "After an incident: verify") for every topic
    not deleted, or ``topic`` alone (NotFoundError if it does not exist, ValueError if it
    was deleted, before anything is read)."""
    names = check_topics(rt.metadata, [topic] if topic is not None else None)
    topics = [rt.metadata.get_topic(name) for name in names]
    report = VerifyReport(deep=deep, topics=names)
    started_ms = rt.metadata.db_now_ms()
    seen = check_stores(rt, report, started_ms=started_ms, topic=topic)
    check_commits(rt, report, topic)
    check_readable(rt, report, topics, seen)
    check_below_start(rt, report, topics)
    check_queue(rt, report, topic)
    if deep:
        check_blocks(rt, report, names, seen)
    return report

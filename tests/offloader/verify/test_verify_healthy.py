"""A healthy system verifies: offload, streaming, trim and GC leave every promise kept."""

from __future__ import annotations

from fixtures.verify import assert_verified, healthy_topics
from offloader.runtime import Runtime


def test_a_healthy_system_verifies(runtime: Runtime) -> None:
    healthy_topics(runtime)
    report = assert_verified(runtime)
    c = report.counts
    assert report.topics == ["orders", "s"] and not report.deep
    assert c.stores == 1 and c.segments >= 1 and c.blocks_read == 0
    # orders: 2 live ledgers of 6 entries, both v1 offloaded (4 objects); s: 3 ledgers
    assert c.ledgers == 2 + 3
    assert c.entries_checked == 2 * 6 + sum(
        x.entry_count for x in runtime.metadata.list_ledgers("s")
    )
    assert c.objects_listed == c.referenced + c.awaiting_sweep + c.foreign
    assert c.objects_listed >= 4 + 2 * c.segments


def test_a_healthy_system_verifies_deep(runtime: Runtime) -> None:
    healthy_topics(runtime)
    report = assert_verified(runtime, deep=True)
    assert report.deep and report.counts.blocks_read >= 2 + report.counts.segments

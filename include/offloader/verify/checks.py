"""Promises 3 to 6 of `offloader verify`, from the metadata (one statement each) and, for
readability, from what the LIST passes found missing:

- no ledger has two committed offloads (``double_commit``);
- every entry at or above a topic's start is readable from a tier: a hot copy, or
  offloaded objects all present (``unreadable``);
- nothing below the start is readable: every ledger wholly below it is deleting or
  deleted, and the topic reader refuses the entry just below it (``readable_below_start``);
- the deletion queue holds no key a live row references (``queued_but_referenced``).
"""

from __future__ import annotations

from offloader.exceptions import TrimmedError
from offloader.metadata import Ledger, LedgerState, OffloadMode, Segment, SegmentState, Topic
from offloader.metadata.promises import (
    double_commits,
    last_entry_below,
    live_below_start,
    queued_but_referenced,
)
from offloader.read.topic_reader import TopicReader
from offloader.runtime import Runtime
from offloader.verify.objects import ObjectsSeen
from offloader.verify.report import BreachKind, VerifyReport


def check_commits(rt: Runtime, report: VerifyReport, topic: str | None) -> None:
    for d in double_commits(rt.metadata, topic):
        report.add(
            BreachKind.DOUBLE_COMMIT,
            f"ledger {d.topic}/{d.ledger_id} has committed attempts {', '.join(d.committed)}; "
            f"its row names {d.recorded or 'none'} (offload mode {d.mode})",
            topic=d.topic,
            ledger_id=d.ledger_id,
        )


def check_queue(rt: Runtime, report: VerifyReport, topic: str | None) -> None:
    for q in queued_but_referenced(rt.metadata, topic):
        report.add(
            BreachKind.QUEUED_BUT_REFERENCED,
            f"deletion {q.deletion_id} ({q.reason}) would delete {q.key}, which {q.owner} "
            "still references",
            topic=q.topic,
            key=q.key,
        )


def check_below_start(rt: Runtime, report: VerifyReport, topics: list[Topic]) -> None:
    """Ledgers below the start still live, then the reader's refusal just below it."""
    names = {t.name for t in topics}
    for x in live_below_start(rt.metadata, topics[0].name if len(topics) == 1 else None):
        if x.topic not in names:
            continue
        report.add(
            BreachKind.READABLE_BELOW_START,
            f"ledger {x.topic}/{x.ledger_id} is below the topic's start {x.start} but not "
            f"deleting (offload {x.offload_state}, hot copy {x.hot_state})",
            topic=x.topic,
            ledger_id=x.ledger_id,
        )
    reader = TopicReader(rt)
    for topic in topics:
        below = _entry_below(rt, topic)
        if below is None:
            continue
        ledger_id, entry_id = below
        try:
            reader.read_entry(topic.name, ledger_id, entry_id)
        except TrimmedError:
            continue  # refused, as it must be
        except Exception:
            continue  # gone (a missing copy, a deleted row): not readable either
        report.add(
            BreachKind.READABLE_BELOW_START,
            f"entry {ledger_id}:{entry_id} of topic {topic.name!r}, below its start "
            f"{topic.start}, was read",
            topic=topic.name,
            ledger_id=ledger_id,
        )


def _entry_below(rt: Runtime, topic: Topic) -> tuple[int, int] | None:
    start = topic.start
    if start.entry_id > 0:
        return start.ledger_id, start.entry_id - 1
    return last_entry_below(rt.metadata, topic.name, start.ledger_id)


def check_readable(
    rt: Runtime, report: VerifyReport, topics: list[Topic], seen: ObjectsSeen
) -> None:
    """Every live ledger's entries at or above the start: from its hot copy, or from
    offloaded objects none of which is missing (objects in a store that could not be
    listed are not judged: that store is its own breach)."""
    for topic in topics:
        segments = {
            s.segment_id: s
            for s in rt.metadata.segments.of_topic(topic.name, [SegmentState.OFFLOADED])
        }
        report.counts.segments += len(segments)
        pieces: dict[int, list[tuple[int, int, Segment]]] = {}
        for segment_id, ranges in rt.metadata.segments.offloaded_pieces(topic.name).items():
            segment = segments.get(segment_id)
            if segment is None:
                continue
            for r in ranges:
                pieces.setdefault(r.ledger_id, []).append((r.first, r.last, segment))
        for ledger in rt.metadata.list_ledgers(topic.name, live=True):
            if ledger.ledger_id < topic.start.ledger_id:
                continue  # below the start: readable_below_start's, not a readability breach
            _check_ledger(rt, report, topic, ledger, pieces.get(ledger.ledger_id, []), seen)


def _check_ledger(
    rt: Runtime,
    report: VerifyReport,
    topic: Topic,
    ledger: Ledger,
    pieces: list[tuple[int, int, Segment]],
    seen: ObjectsSeen,
) -> None:
    first = topic.start.entry_id if ledger.ledger_id == topic.start.ledger_id else 0
    hot = ledger.has_hot_copy and rt.hot.exists(topic.name, ledger.ledger_id)
    if ledger.state is LedgerState.OPEN:
        last = rt.hot.info(topic.name, ledger.ledger_id).entry_count - 1 if hot else -1
    else:
        last = ledger.entry_count - 1
    report.counts.ledgers += 1
    if last < first:
        return  # nothing at or above the start
    if hot:
        report.counts.entries_checked += last - first + 1
        return
    verdict = _tiered(ledger, pieces, first, last, seen)
    if verdict is None:
        report.counts.entries_checked += last - first + 1
        return
    if verdict == "":
        return  # its store could not be listed: reported as store_unavailable
    report.add(
        BreachKind.UNREADABLE,
        f"ledger {topic.name}/{ledger.ledger_id}: entries {first}..{last} are readable from no "
        f"tier: no hot copy (hot state {ledger.hot_state}) and {verdict}",
        topic=topic.name,
        ledger_id=ledger.ledger_id,
    )


def _tiered(
    ledger: Ledger,
    pieces: list[tuple[int, int, Segment]],
    first: int,
    last: int,
    seen: ObjectsSeen,
) -> str | None:
    """None when the offloaded copy holds ``first..last`` with every object present; ""
    when that cannot be told (a store not listed); else why not."""
    if not ledger.is_offloaded:
        return f"not offloaded (offload state {ledger.offload_state})"
    if ledger.offload_mode is OffloadMode.LEDGER:
        if ledger.store_id in seen.unavailable:
            return ""
        gone = [k for k in (ledger.data_key, ledger.index_key) if k is None or k in seen.missing]
        return f"its object(s) {', '.join(map(str, gone))} missing" if gone else None
    covered = first
    for lo, hi, segment in sorted(pieces, key=lambda p: p[0]):
        if hi < covered:
            continue
        if lo > covered:
            break
        if segment.store_id in seen.unavailable:
            return ""
        lost = [k for k in (segment.data_key, segment.index_key) if k in seen.missing]
        if lost:
            return f"segment {segment.segment_id}'s object(s) {', '.join(lost)} missing"
        covered = hi + 1
        if covered > last:
            return None
    return f"no offloaded segment holds entry {covered}"

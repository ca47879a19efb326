"""apply_retention on a topic with hot and offloaded ledgers, both pairings: what is kept
and what is deleted match the policy exactly."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from fixtures.backends import make_topic, unaccounted_objects
from fixtures.metadata import pending_deletions
from fixtures.retention import assert_trimmed, digest, gc_leaves_only_the_kept
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.metadata import StreamCut
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.retention.cuts import take_cut
from offloader.retention.policy import choose_cut, in_list, retention_bounds
from offloader.retention.run import apply_retention
from offloader.runtime import Runtime

TOPIC = "orders"
# entries per ledger: ledger sizes differ, so every cut keeps a distinct number of bytes
SHAPES = [(3, 700), (2, 900), (4, 300), (1, 2000), (5, 100), (2, 650)]


def build(rt: Runtime) -> tuple[list[int], list[StreamCut]]:
    """Six ledgers: 1-2 offloaded with their hot copies gone, 3 offloaded and still hot,
    4-6 hot only. A cut before the first ledger and after each (cuts[i] = start of the
    i-th ledger; the last is the end), 5 ms apart on the database's clock."""
    make_topic(rt, TOPIC)
    cuts = [take_cut(rt, TOPIC)]
    ids = []
    with ManagedLedgerWriter(rt.metadata, rt.hot, TOPIC) as writer:
        for number, (count, size) in enumerate(SHAPES):
            for entry in range(count):
                writer.append(bytes([number, entry]) * (size // 2))
            sealed = writer.roll_over()
            assert sealed is not None
            ids.append(sealed.ledger_id)
            time.sleep(0.005)
            cuts.append(take_cut(rt, TOPIC))
    LedgerOffloader(rt).offload_topic(TOPIC, up_to=ids[1])
    delete_hot_copies(rt.metadata, rt.hot, TOPIC)
    LedgerOffloader(rt).offload_topic(TOPIC, up_to=ids[2])
    ledgers = rt.metadata.list_ledgers(TOPIC)
    assert [(x.is_offloaded, x.has_hot_copy) for x in ledgers] == [
        (True, False),
        (True, False),
        (True, True),
        (False, True),
        (False, True),
        (False, True),
    ]
    return ids, cuts


def digests(rt: Runtime, ledger_ids: list[int]) -> dict[int, str]:
    return {i: digest(rt, TOPIC, i) for i in ledger_ids}


def assert_trimmed_at(rt: Runtime, ids: list[int], cut: StreamCut, before: dict[int, str]):
    """The start is at the cut; below it deleting and unreadable, above it intact; after
    a GC pass the store holds exactly the kept ledgers' objects."""
    assert rt.metadata.get_topic(TOPIC).start == cut.position
    below = [i for i in ids if i < cut.ledger_id]
    kept = [i for i in ids if i >= cut.ledger_id]
    assert_trimmed(rt, TOPIC, below, kept, before)
    gc_leaves_only_the_kept(rt, TOPIC, below, kept)


def sizes(rt: Runtime) -> dict[int, int]:
    return {x.ledger_id: x.size_bytes for x in rt.metadata.list_ledgers(TOPIC)}


@pytest.mark.parametrize("keep_ledgers", [1, 3, 4])
@pytest.mark.parametrize("extra", [0, 1])
def test_size_retention_truncates_at_the_lowest_upper_bound(
    runtime: Runtime, keep_ledgers: int, extra: int
) -> None:
    """S = the bytes of the newest k ledgers (+1): exactly k ledgers kept (k+1 with +1)."""
    rt = runtime
    ids, cuts = build(rt)
    before = digests(rt, ids)
    size = sum(list(sizes(rt).values())[-keep_ledgers:]) + extra
    policy = rt.metadata.get_topic(TOPIC).policy.updated({"retention_size_bytes": size})
    rt.metadata.set_policy(rt.metadata.get_topic(TOPIC), policy)
    assert cuts[-1].offset_bytes == sum(sizes(rt).values())  # offsets are committed bytes

    result = apply_retention(rt, TOPIC)
    expected = cuts[len(SHAPES) - keep_ledgers - extra]
    assert result.chosen == expected
    assert result.retained_bytes == sum(list(sizes(rt).values())[-(keep_ledgers + extra) :])
    assert result.retained_bytes >= size
    later = cuts[cuts.index(expected) + 1]
    assert result.end.offset_bytes - later.offset_bytes < size  # the least that is enough
    assert result.trim is not None and result.trim.changed
    assert result.trim.ledgers_deleting == ids[: len(SHAPES) - keep_ledgers - extra]
    assert_trimmed_at(rt, ids, expected, before)

    again = apply_retention(rt, TOPIC)
    assert not again.changed
    assert rt.metadata.get_topic(TOPIC).start == expected.position


@pytest.mark.parametrize("index", [1, 3, 5])
def test_time_retention_truncates_at_the_newest_cut_older_than_t(
    runtime: Runtime, index: int
) -> None:
    rt = runtime
    ids, cuts = build(rt)
    before = digests(rt, ids)
    end = take_cut(rt, TOPIC)
    topic = rt.metadata.get_topic(TOPIC)
    seconds = (end.created_ms - cuts[index].created_ms) / 1000

    # a hair more than the age of cuts[index]: the cut before it is the newest old enough
    older = topic.policy.updated({"retention_time_seconds": seconds + 0.001})
    dry = apply_retention(rt, TOPIC, dry_run=True, end=end, policy=older)
    assert dry.chosen == cuts[index - 1]
    assert dry.trim is not None and dry.trim.ledgers_deleting == ids[: index - 1]

    rt.metadata.set_policy(topic, topic.policy.updated({"retention_time_seconds": seconds}))
    result = apply_retention(rt, TOPIC, end=end)
    assert result.chosen == cuts[index]  # exactly T old counts as old enough
    assert_trimmed_at(rt, ids, cuts[index], before)


def test_both_rules_the_one_keeping_more_wins(runtime: Runtime) -> None:
    rt = runtime
    ids, cuts = build(rt)
    before = digests(rt, ids)
    end = take_cut(rt, TOPIC)
    policy = rt.metadata.get_topic(TOPIC).policy
    seconds = (end.created_ms - cuts[4].created_ms) / 1000  # time alone: cut 4
    size = end.offset_bytes - cuts[2].offset_bytes  # size alone: cut 2
    for fields, expected in (
        ({"retention_time_seconds": seconds}, cuts[4]),
        ({"retention_size_bytes": size}, cuts[2]),
        ({"retention_time_seconds": seconds, "retention_size_bytes": size}, cuts[2]),
        ({"retention_time_seconds": 3600, "retention_size_bytes": size}, None),
    ):
        dry = apply_retention(rt, TOPIC, dry_run=True, end=end, policy=policy.updated(fields))
        assert dry.chosen == expected, fields
    # the other way round: time is the stricter one
    both = policy.updated(
        {
            "retention_time_seconds": (end.created_ms - cuts[1].created_ms) / 1000,
            "retention_size_bytes": end.offset_bytes - cuts[5].offset_bytes,
        }
    )
    result = apply_retention(rt, TOPIC, end=end, policy=both)
    assert result.chosen == cuts[1]
    assert_trimmed_at(rt, ids, cuts[1], before)


def test_dry_run_and_no_policy_change_nothing(runtime: Runtime) -> None:
    rt = runtime
    ids, cuts = build(rt)
    ledgers = rt.metadata.list_ledgers(TOPIC)
    assert apply_retention(rt, TOPIC).chosen is None  # no retention set: keep forever
    assert rt.metadata.retention.list_cuts(TOPIC)[-1].cut_id > cuts[-1].cut_id  # it took its cut
    cut_count = len(rt.metadata.retention.list_cuts(TOPIC))

    policy = rt.metadata.get_topic(TOPIC).policy.updated({"retention_size_bytes": 0})
    rt.metadata.set_policy(rt.metadata.get_topic(TOPIC), policy)
    dry = apply_retention(rt, TOPIC, dry_run=True)
    assert dry.end.cut_id == 0 and dry.end.position == cuts[-1].position
    assert dry.chosen is not None and dry.chosen.position == cuts[-1].position
    assert dry.trim is not None and dry.trim.ledgers_deleting == ids
    assert dry.retained_bytes == 0
    assert len(rt.metadata.retention.list_cuts(TOPIC)) == cut_count
    assert rt.metadata.list_ledgers(TOPIC) == ledgers
    assert rt.metadata.get_topic(TOPIC).start.key() == (0, 0)
    assert pending_deletions(rt.metadata) == []


def test_an_upload_in_flight_never_counts_toward_size(runtime: Runtime) -> None:
    """Ledger 4 has an attempt in flight with a partial object already in the store: the
    end's offset is still the sealed ledgers' recorded sizes, each once, and the choice is
    the one without the attempt."""
    rt = runtime
    ids, cuts = build(rt)
    ledger = rt.metadata.get_ledger(TOPIC, ids[3])
    _, attempt = rt.metadata.attempts.begin(
        ledger,
        "in-flight",
        "orders/in-flight-d",
        "orders/in-flight-i",
        "other",
        60_000,
        store_id=rt.stores.default_id(),
    )
    rt.objects.put(attempt.data_key, b"\0" * 5000)
    end = take_cut(rt, TOPIC)
    assert end.offset_bytes == cuts[-1].offset_bytes == sum(sizes(rt).values())
    assert rt.metadata.retention.end_cut(TOPIC).offset_bytes == end.offset_bytes

    size = end.offset_bytes - cuts[4].offset_bytes  # keep ledgers 5 and 6
    policy = rt.metadata.get_topic(TOPIC).policy.updated({"retention_size_bytes": size})
    result = apply_retention(rt, TOPIC, end=end, policy=policy)
    assert result.chosen == cuts[4]
    # the trimmed ledger's attempt is superseded and its objects queued: nothing leaks
    assert rt.metadata.attempts.get("in-flight").state.value == "superseded"
    assert {attempt.data_key, attempt.index_key} <= {
        d.object_key for d in pending_deletions(rt.metadata)
    }
    assert unaccounted_objects(rt) == set()


def test_sql_selection_matches_the_list_rules(runtime: Runtime) -> None:
    """The store's newest-cut queries choose what the pure rules choose over list_cuts."""
    rt = runtime
    _, cuts = build(rt)
    end = cuts[-1]
    listed = rt.metadata.retention.list_cuts(TOPIC)
    policy = rt.metadata.get_topic(TOPIC).policy

    def from_sql(field: str, at_most: int) -> StreamCut | None:
        return rt.metadata.retention.newest_cut(TOPIC, field, at_most)

    ages = [0.0, *((end.created_ms - c.created_ms) / 1000 for c in cuts), 3600.0]
    kept = [0, *(end.offset_bytes - c.offset_bytes for c in cuts), end.offset_bytes + 1]
    for seconds in ages:
        for size in kept:
            for extra in (0, 1):
                bounds = retention_bounds(
                    policy.updated(
                        {"retention_time_seconds": seconds, "retention_size_bytes": size + extra}
                    ),
                    end.created_ms,
                    end.offset_bytes,
                )
                assert choose_cut(bounds, from_sql) == choose_cut(bounds, in_list(listed))
    with pytest.raises(ValueError, match="created_ms or offset_bytes"):
        rt.metadata.retention.newest_cut(TOPIC, "ledger_id", 1)


def test_an_override_breaking_pip17_is_refused(runtime: Runtime) -> None:
    make_topic(runtime, TOPIC, offload_threshold_bytes=10_000)
    policy = runtime.metadata.get_topic(TOPIC).policy
    with pytest.raises(ValidationError, match="PIP-17"):
        policy.updated({"retention_size_bytes": 10_000})


def test_cut_offsets_are_exact_with_an_open_ledger_between_cuts(runtime: Runtime) -> None:
    """Cuts sum only the ledgers since the newest cut: the result equals the full sum of
    the sealed ledgers below the end, whatever was open when earlier cuts were taken."""
    rt = runtime
    make_topic(rt, TOPIC)
    seen = []
    with ManagedLedgerWriter(rt.metadata, rt.hot, TOPIC) as writer:
        for round_ in range(3):
            writer.append(b"a" * (100 + round_))
            seen.append(take_cut(rt, TOPIC))  # the ledger is open: not counted yet
            writer.append(b"b" * 50)
            writer.roll_over()
            seen.append(take_cut(rt, TOPIC))
    for cut in [*seen, rt.metadata.retention.end_cut(TOPIC)]:
        below = [x for x in rt.metadata.list_ledgers(TOPIC) if x.ledger_id < cut.ledger_id]
        assert cut.entry_id == 0
        assert cut.offset_bytes == sum(x.size_bytes for x in below)
    assert [c.ledger_id for c in seen] == [1, 2, 2, 3, 3, 4]
    assert seen[0].offset_bytes == 0 < seen[1].offset_bytes == seen[2].offset_bytes


def test_what_retention_did_is_one_line_and_logged(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    ids, cuts = build(rt)
    end = cuts[-1]
    policy = rt.metadata.get_topic(TOPIC).policy
    too_much = policy.updated({"retention_size_bytes": end.offset_bytes + 1})
    last_ledger = policy.updated({"retention_size_bytes": 1300})  # 2 entries of 650 bytes
    with caplog.at_level("INFO", logger="offloader.retention.run"):
        results = [
            apply_retention(rt, TOPIC, dry_run=True, end=end),
            apply_retention(rt, TOPIC, dry_run=True, end=end, policy=too_much),
            apply_retention(rt, TOPIC, dry_run=True, end=end, policy=last_ledger),
            apply_retention(rt, TOPIC, end=end, policy=last_ledger),
        ]
    plain, none_old_enough, dry, done = results
    for kept in (plain, none_old_enough):
        assert (kept.topic, kept.chosen, kept.trim, kept.changed) == (TOPIC, None, None, False)
    ending = f"end {end.position}, {end.offset_bytes} bytes)"
    assert str(plain) == f"keeps everything (no retention rule set; {ending}"
    assert str(none_old_enough) == f"keeps everything (no cut old enough; {ending}"
    chosen = cuts[5]
    assert (done.topic, done.chosen, done.changed) == (TOPIC, chosen, True)
    what = (
        f"at cut {chosen.cut_id} ({chosen.position}), keeping 1300 bytes; start 0:0 -> "
        f"{chosen.position}, ledgers deleting {ids[:5]}, 6 keys queued"
    )
    assert str(dry) == f"would trim {what}"
    assert str(done) == f"trimmed {what}"
    logged = [r.getMessage() for r in caplog.records if r.name == "offloader.retention.run"]
    assert logged == [f"retention of {TOPIC}: {r}" for r in results]

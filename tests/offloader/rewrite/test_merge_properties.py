"""Any merge of adjacent segments (any ledgers, cuts, block, chunk and part sizes, unwanted
ledgers, sources in another store, parts in flight) reads back identical through three
readers, keeps S3's part rules, copies big sources without reading them, and records
what it holds. On the filesystem store given S3-like part limits."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from hypothesis import event, given, settings
from hypothesis import strategies as st

from fixtures.counting import CountingStore
from fixtures.merges import files_store, read_back, run_merge, store_segments
from fixtures.segments import SegmentEntries
from offloader.format import ENTRY_FRAME, HEADER_LEN, decode_segment_index
from offloader.metadata.records import PieceRange

KiB = 1024


@st.composite
def merges(draw: st.DrawFn) -> dict:
    block = draw(st.sampled_from([1 * KiB, 4 * KiB, 16 * KiB]))
    size = st.integers(0, min(block - HEADER_LEN - ENTRY_FRAME, 3 * KiB))
    rng = random.Random(draw(st.integers(0, 1 << 32)))
    entries: SegmentEntries = []
    for n, ledger_id in enumerate(
        sorted(draw(st.sets(st.integers(0, 60), min_size=1, max_size=5)))
    ):
        first = draw(st.integers(0, 1000)) if n == 0 else 0
        sizes = draw(st.lists(size, min_size=1 if n else 2, max_size=40))
        entries += [(ledger_id, first + i, rng.randbytes(s)) for i, s in enumerate(sizes)]
    cuts = (
        sorted(draw(st.sets(st.integers(1, len(entries) - 1), min_size=1, max_size=8)))
        if len(entries) > 1
        else []
    )
    # the minimum part near the segments' mean size: some are copied, some downloaded
    mean = sum(ENTRY_FRAME + len(p) for _, _, p in entries) // (len(cuts) + 1)
    min_part = max(1, int(mean * draw(st.sampled_from([0, 0.5, 1, 1, 1.5, 3]))))
    max_part = draw(st.sampled_from([5 << 30, 2 * min_part + 4 * block]))
    ledgers = sorted({e[0] for e in entries})
    return dict(
        entries=entries,
        cuts=cuts,
        block=block,
        chunk=draw(st.integers(100, 8 * KiB)),
        min_part=min_part,
        max_part=max_part,
        part_size=min(draw(st.integers(1, 50 * KiB)), max_part),
        unwanted=draw(st.sets(st.sampled_from(ledgers))),
        foreign=draw(st.sets(st.integers(0, len(cuts)), max_size=2)),
        concurrency=draw(st.integers(1, 3)),
        part_copy=draw(st.sampled_from([True, True, True, False])),
    )


def _times(entries: SegmentEntries, cuts: list[int]) -> list[dict[int, tuple[int, int]]]:
    """Per segment, its ledgers' times: created known everywhere, sealed only where a
    ledger's last piece is."""
    bounds = [0, *cuts, len(entries)]
    last_segment = {
        lid: i for i in range(len(bounds) - 1) for lid, _, _ in entries[bounds[i] : bounds[i + 1]]
    }
    return [
        {
            lid: (1000 + lid, 2000 + lid if last_segment[lid] == i else -1)
            for lid, _, _ in entries[bounds[i] : bounds[i + 1]]
        }
        for i in range(len(bounds) - 1)
    ]


@settings(max_examples=100, deadline=None)  # the rest from tests/fixtures/hypothesis_profiles
@given(merges())
def test_any_merge_reads_back_identical_with_s3_part_rules(case: dict) -> None:
    entries, cuts, unwanted = case["entries"], case["cuts"], case["unwanted"]
    with tempfile.TemporaryDirectory() as tmp:
        own = files_store(
            Path(tmp) / "own",
            min_part_size=case["min_part"],
            max_part_size=case["max_part"],
            part_copy=case["part_copy"],
        )
        other = files_store(Path(tmp) / "other")
        target = CountingStore(own)
        stored = []
        times = _times(entries, cuts)
        bounds = [0, *cuts, len(entries)]
        for i in range(len(bounds) - 1):
            store = other if i in case["foreign"] else target
            (one,) = store_segments(
                store,
                entries[bounds[i] : bounds[i + 1]],
                [],
                block=case["block"],
                chunk=case["chunk"],
                times=times[i],
            )
            stored.append(one)
        copyable = [
            case["part_copy"] and s.store is target and s.data_len >= case["min_part"]
            for s in stored
        ]
        pinned = {
            lid for s, c in zip(stored, copyable, strict=True) if c for lid, _, _ in s.entries
        }
        dropped = set(unwanted) - pinned
        expected = [e for e in entries if e[0] not in dropped]
        if not expected:
            return  # a merge of nothing is refused: test_merge.py
        target.calls.clear()

        seen = []
        key, merged = run_merge(
            target,
            [s.source(unwanted) for s in stored],
            on_part=seen.append,
            part_size=case["part_size"],
            concurrency=case["concurrency"],
        )

        assert read_back(own, key, merged) == expected
        # parts: numbered 1..n, reported in order, S3's size rules (complete enforced them)
        assert seen == merged.parts
        assert [p.part_number for p in merged.parts] == list(range(1, len(merged.parts) + 1))
        assert all(p.size >= case["min_part"] for p in merged.parts[:-1])
        assert all(p.size <= case["max_part"] for p in merged.parts)
        assert sum(p.size for p in merged.parts) == merged.data_len
        # what it holds: every kept ledger whole, its metadata summed over its pieces
        index = decode_segment_index(merged.index)
        ranges = {}
        for lid, eid, _ in expected:
            ranges.setdefault(lid, [eid, eid])[1] = eid
        assert merged.pieces == [PieceRange(lid, a, b) for lid, (a, b) in ranges.items()]
        assert {p.ledger_id for p in merged.dropped} == dropped
        for lid, view in zip(index.ledger_ids, index.ledgers, strict=True):
            assert view.metadata is not None
            payload = sum(len(p) for x, _, p in expected if x == lid)
            assert (view.metadata.length, view.metadata.created_ms) == (payload, 1000 + lid)
            assert view.metadata.sealed_ms == 2000 + lid
        # big sources of the target's store are copied, at most their leading blocks read
        copies = [args[2] for verb, args in target.calls if verb == "upload_part_copy"]
        reads = [args for verb, args in target.calls if verb == "read_range"]
        assert not {s.data_key for s in stored} & set(target.keys("get"))
        event(f"parts copied: {bool(copies)}, downloaded: {bool(reads)}")
        event(f"ledgers dropped: {bool(dropped)}, unwanted kept: {bool(set(unwanted) - dropped)}")
        for s, c in zip(stored, copyable, strict=True):
            if c and 0 < sum(a[2] for a in reads if a[0] == s.data_key) < s.data_len:
                event("leading blocks of a copied source downloaded")
            if copies.count(s.data_key) > 1:
                event("a copied source split into several parts")
            if not c:
                assert s.data_key not in copies
                continue
            read = sum(args[2] for args in reads if args[0] == s.data_key)
            assert read <= 2 * case["min_part"] + 2 * case["block"], (s.data_len, read)
            assert read == s.data_len or s.data_key in copies
        if not dropped:  # whole blocks moved as they were: the sources' bytes, joined
            assert own.get(key) == b"".join(s.store.get(s.data_key) for s in stored)

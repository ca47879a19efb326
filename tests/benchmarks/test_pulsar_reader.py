"""The Pulsar-style reference reader of the random-read benchmark reads what our reader
reads, and fetches what a block scan in fixed-size ranged reads must fetch."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the benchmarks package lives beside tests/

from benchmarks.pulsar_reader import PulsarV1Reader  # noqa: E402
from fixtures.backends import make_topic, produce_ledgers  # noqa: E402
from offloader.offload.ledger_offloader import LedgerOffloader  # noqa: E402
from offloader.read.tiered import IndexCache, TieredLedgerReader  # noqa: E402
from offloader.runtime import Runtime  # noqa: E402

BUFFER = 16 << 10


@pytest.mark.parametrize(
    "backend_settings",
    # the scan counts ranges, the same on both stores: S3's 18 s only in the long form
    ["fs-sqlite", pytest.param("s3-postgres", marks=pytest.mark.long)],
    indirect=True,
)
def test_block_scan_reads_the_entry_and_counts_every_range(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, read_buffer_size=16 << 10)
    (ledger_id,) = produce_ledgers(rt, "orders", [(1500, 8000)])  # about 6 MiB: 2 blocks
    LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    ours = TieredLedgerReader(
        rt.objects, ledger.data_key, ledger.index_key, index_cache=IndexCache()
    )
    pulsar = PulsarV1Reader(rt.objects, ledger.data_key, ledger.index_key, BUFFER)
    blocks = ours.index.blocks
    assert len(blocks) >= 2
    for entry_id in [0, ledger.entry_count - 1, *random.Random(5).sample(range(1500), 20)]:
        before = pulsar.bytes_fetched
        assert pulsar.read_entry(entry_id) == ours.read_entry(entry_id)
        fetched = pulsar.bytes_fetched - before
        block = next(b for b in reversed(blocks) if b.first_entry_id <= entry_id)
        # whole ranges from the block start, the last one cut at the block end
        assert fetched % BUFFER == 0 or fetched == block.length
        assert 0 < fetched <= block.length
    # the last entry of a block sits near its end: the scan fetched nearly the whole block
    last_of_first_block = blocks[1].first_entry_id - 1
    before = pulsar.bytes_fetched
    pulsar.read_entry(last_of_first_block)
    assert pulsar.bytes_fetched - before > blocks[0].length - BUFFER - 8000

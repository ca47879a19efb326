"""The codec benchmark script runs and reports what it promises (tiny sizes, for speed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "format_codec.py"


def test_benchmark_reports_every_operation_and_size() -> None:
    spec = importlib.util.spec_from_file_location("format_codec_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.run(1 << 20)
    ops = {(r["op"], r["entry_size"]) for r in results}
    assert ops == {
        (op, size)
        for op in ("encode_blocks", "decode_chunk", "decode_block")
        for size in (1024, 65536)
    }
    for r in results:
        assert r["mb_per_s"] > 0 and r["raw_mb_per_s"] > 0 and r["ratio_to_raw"] > 0

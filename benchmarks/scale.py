"""What the history-scale benchmarks (metadata_scale, retention_scale) share: one way to
time a call and take its peak memory, and one summary of how both grow with the rows."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any


def measure(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Best time of ``repeats`` calls, then the peak traced memory of one more call."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {"seconds": round(min(times), 4), "peak_kib": round(peak / 1024, 1)}


def growth(by_size: Sequence[dict[str, Any]], measured: Sequence[str]) -> dict[str, Any]:
    """Time and memory of the largest size over the smallest, per measured call, and
    whether every call stayed under a second."""
    first, last = by_size[0], by_size[-1]
    return {
        "growth_first_to_last": {
            what: {
                "time": round(last[what]["seconds"] / max(first[what]["seconds"], 1e-6), 2),
                "memory": round(last[what]["peak_kib"] / max(first[what]["peak_kib"], 1e-6), 2),
            }
            for what in measured
        },
        "under_a_second": all(s[w]["seconds"] < 1.0 for s in by_size for w in measured),
    }

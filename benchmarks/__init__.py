"""Benchmarks: ``python -m benchmarks.run [--quick]`` runs them all (see docs/BENCHMARKS.md)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def use_test_fixtures() -> None:
    """Make ``tests/fixtures`` importable (the SeaweedFS launcher lives there)."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)

"""The chaos soak (tests/soak/driver.py): ``make soak``, or
``python scripts/soak.py [--minutes M | --cycles N] [--seed S]``; ``--write-docs RESULT.json``
puts a run's figures into docs/RELIABILITY.md."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# this checkout's library and the test fixtures the soak reuses (SeaweedFS, PostgreSQL); not
# scripts/ itself, where this file would shadow the tests' `soak` package
sys.path[:1] = [str(ROOT / "include"), str(ROOT / "tests")]

from soak.driver import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

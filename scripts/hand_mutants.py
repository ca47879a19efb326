"""Issue 11's four hand mutants, each applied to a checkout in turn and the tests that
guard it run (fast selection, stop at the first failure); prints which tests failed.

    CHECKOUT/.venv/bin/python scripts/hand_mutants.py [CHECKOUT]   (default: this repo)

Run it with the checkout's own Python (its editable install is what the tests import).
Each mutant must fail at least one test; the file is restored after each run, but do not
edit the checkout meanwhile: the script rewrites its source files while it runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: name -> (file, original text, mutant text, tests that must catch it)
MUTANTS = {
    "verify_chunk removed": (
        "include/offloader/read/tiered.py",
        "                verify_chunk(data, chunk, at=at)\n",
        "                pass\n",
        ["tests/offloader/read"],
    ),
    "plain v1 path returns nothing": (
        "include/offloader/read/tiered.py",
        "            yield from self._read_blocks(first, last)\n            return\n",
        "            return\n",
        ["tests/offloader/read", "tests/offloader/format"],
    ),
    "hot deletion without marking": (
        "include/offloader/offload/hot_deletion.py",
        "                ledger = metadata.mark_hot_deleting(ledger, lag_ms)\n",
        "                pass\n",
        ["tests/offloader/offload"],
    ),
    "stale attempt never taken over": (
        "include/offloader/offload/ledger_offloader.py",
        "            if (ledger.attempt_lease_ms or 0) > self.metadata.db_now_ms():\n",
        "            if True:\n",
        ["tests/offloader/offload"],
    ),
}


def main(checkout: Path) -> int:
    survived = []
    for name, (path, original, mutant, tests) in MUTANTS.items():
        source = checkout / path
        text = source.read_text()
        if text.count(original) != 1:
            print(f"{name}: the original line is not in {path} exactly once; update this script")
            return 2
        source.write_text(text.replace(original, mutant))
        try:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-n", "2", "-m", "not long", *tests],
                cwd=checkout,
                capture_output=True,
                text=True,
            )
        finally:
            source.write_text(text)
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        print(f"{name}: {'killed by ' + failed[0] if failed else 'SURVIVED'}", flush=True)
        if not failed:
            survived.append(name)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent))

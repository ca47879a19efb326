"""``python -m offloader_airflow.upgrade [--check] [--conn-id ID]``: `offloader db upgrade`
(or `db check`) on the database and store an Airflow offloader connection names.

The init container has only the Airflow connections, not OFFLOADER_* variables; building
the settings through the hook guarantees the upgrade records exactly the store the tasks
use for rows written before revision 0002. Exit 2 with one line on failure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from offloader.exceptions import OffloaderError
from offloader.runtime import check_database, upgrade_database
from offloader_airflow.hooks import OffloaderHook


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offloader_airflow.upgrade")
    parser.add_argument("--check", action="store_true", help="only check the revision")
    parser.add_argument("--conn-id", default=OffloaderHook.default_conn_name)
    args = parser.parse_args(argv)
    try:
        settings = OffloaderHook(args.conn_id).get_settings()
        if args.check:
            print(f"metadata database at revision {check_database(settings)} (head)")
        else:
            before, after = upgrade_database(settings)
            print(f"metadata database at revision {after} (was {before})")
    except (OffloaderError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

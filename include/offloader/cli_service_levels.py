"""``offloader check-service-levels [--topic T]``: every topic's service levels (the
``max_*`` fields of its policy) against the metrics; exit 0 when all are met, 1 with one
line per breach, 2 on an error. It opens the metadata store only, like ``offloader
metrics``: a check makes no object-store request.
"""

from __future__ import annotations

import argparse
from typing import Any

from offloader.metrics.service_levels import read_service_levels
from offloader.settings import Settings

HELP = (
    "check every topic's service levels (the policy's max_* fields) against the metrics: "
    "exit 0 when all are met, 1 with one line per breach"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", default=None, help="one topic's levels (default: every topic)")
    parser.set_defaults(without_runtime=True)


def cmd_check_service_levels(args: argparse.Namespace, settings: Settings) -> tuple[Any, str]:
    report = read_service_levels(settings, args.topic)
    return report, str(report)

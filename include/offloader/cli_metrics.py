"""``offloader metrics [--json] [--otlp]``: the tier metrics from the metadata alone.

Prometheus text by default; ``--json`` the observations and the families; ``--otlp`` one
push to ``OFFLOADER_OTEL_ENDPOINT`` and what was sent. It opens the metadata store only (no
object store, no hot tier), so scraping makes no store request and creates no directory.
"""

from __future__ import annotations

import argparse
from typing import Any

from offloader.metadata import MetadataStore
from offloader.metrics import families, observe, prometheus_text
from offloader.metrics.families import MetricFamily
from offloader.runtime import database_deadlines
from offloader.settings import Settings

HELP = "tier metrics from the metadata: Prometheus text (default), --json, or --otlp (push)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--otlp",
        action="store_true",
        help="push one collection to OFFLOADER_OTEL_ENDPOINT (OTLP/HTTP) and say what was sent",
    )
    parser.set_defaults(without_runtime=True)


def cmd_metrics(args: argparse.Namespace, settings: Settings) -> tuple[Any, str]:
    metadata = MetadataStore.open(settings.resolved_metadata_url, database_deadlines(settings))
    try:
        obs = observe(metadata, settings)
    finally:
        metadata.close()
    fams = families(obs)
    if args.otlp:
        return push(settings, fams)
    return {"observations": obs, "families": fams}, prometheus_text(fams).rstrip("\n")


def push(settings: Settings, fams: list[MetricFamily]) -> tuple[Any, str]:
    """One OTLP push of ``fams``; what was sent (endpoint without credentials)."""
    from offloader.metrics.otel import export_once, safe_endpoint  # the SDK: only when asked

    points = export_once(settings, lambda: fams)
    sent = {
        "endpoint": safe_endpoint(settings.otel_endpoint or ""),  # set: export_once ran
        "families": sum(1 for f in fams if f.samples),
        "points": points,
    }
    text = f"pushed {sent['families']} families, {points} points to {sent['endpoint']}"
    return sent, text

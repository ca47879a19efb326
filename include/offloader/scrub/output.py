"""Where a scrub report goes when a URL names it (the Spark job's ``report`` param): a local
file, replaced atomically, or one object PUT (a reader sees the old report or the new one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from offloader.exceptions import ObjectNotFoundError
from offloader.objectstore.location import FILE
from offloader.objectstore.registry import open_object_store
from offloader.scrub.params import report_location
from offloader.scrub.report import ScrubReport
from offloader.settings import Settings


def write_report_at(report: ScrubReport, url: str, settings: Settings) -> None:
    """``report`` as JSON at ``url`` (``file:///abs/x.json`` or ``s3://bucket/key.json``,
    S3 clients from ``settings``)."""
    location, name = report_location(url)
    if location.kind == FILE:
        report.write(Path(location.location) / name)
        return
    store = open_object_store(location.store_url, settings)
    try:
        store.put(name, report.to_bytes())
    finally:
        store.close()


def read_report_at(url: str, settings: Settings) -> dict[str, Any] | None:
    """The JSON report at ``url``; None if there is none."""
    location, name = report_location(url)
    if location.kind == FILE:
        try:
            data = (Path(location.location) / name).read_bytes()
        except FileNotFoundError:
            return None
    else:
        store = open_object_store(location.store_url, settings)
        try:
            data = store.get(name)
        except ObjectNotFoundError:
            return None
        finally:
            store.close()
    report: dict[str, Any] = json.loads(data)
    return report

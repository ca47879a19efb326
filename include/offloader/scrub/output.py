"""Where a scrub report goes when a URL names it (the Spark job's ``report`` param): a local
file, replaced atomically, or one object PUT (a reader sees the old report or the new one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from offloader.exceptions import FormatError, ObjectNotFoundError
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
    try:
        report = json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8 (both ValueErrors)
        raise FormatError(f"scrub report {url} is damaged: not JSON ({exc})") from None
    if not isinstance(report, dict):
        raise FormatError(f"scrub report {url} is damaged: not a JSON object")
    _check_summary(report, url)
    return report


def _check_summary(report: dict[str, Any], url: str) -> None:
    """What the scrub operator reads of a report is there, with the types it was written
    with; FormatError naming the first field that is not."""
    counts, failed, damaged = (report.get(k) for k in ("counts", "failed", "damaged_ledgers"))
    if not isinstance(counts, dict) or not isinstance(failed, bool):
        raise FormatError(f"scrub report {url} is damaged: no counts or failed")
    if not isinstance(damaged, list):
        raise FormatError(f"scrub report {url} is damaged: damaged_ledgers is not a list")
    for n, entry in enumerate(damaged):
        ledgers = entry.get("ledgers") if isinstance(entry, dict) else None
        inner = ledgers if isinstance(ledgers, list) and ledgers else [entry]
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("topic"), str)
            or not all(isinstance(x, dict) and "ledger_id" in x and "action" in x for x in inner)
        ):
            raise FormatError(f"scrub report {url} is damaged: damaged_ledgers entry {n}")

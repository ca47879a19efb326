"""Operator extra links: from a task to the objects it wrote.

As the amazon provider's links do, the operator persists the link's parts in XCom at run
time (:meth:`OffloadedObjectsLink.persist`: the location of the store the ledger's offload
was recorded in, and the object's key; a location never holds a credential), and
:meth:`OffloadedObjectsLink.get_link` builds the URL from them. The ledger's recorded store,
not the default one: the default may have moved since. Missing or malformed parts give an
empty link, never a broken page.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from urllib.parse import quote, urlparse

from airflow.sdk import BaseOperatorLink, BaseXCom, Context

from offloader.objectstore.location import StoreLocation

XCOM_KEY = "offloaded_objects"


def object_browser_url(store_url: str, endpoint_url: str | None, key_prefix: str) -> str:
    """Where a person can look at the objects: the S3 console, the endpoint, or the folder."""
    parsed = urlparse(store_url)
    if parsed.scheme == "file":
        return f"{store_url.rstrip('/')}/{quote(key_prefix)}"
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    full = f"{prefix}/{key_prefix}" if prefix else key_prefix
    if endpoint_url:
        return f"{endpoint_url.rstrip('/')}/{bucket}/{quote(full)}"
    return f"https://s3.console.aws.amazon.com/s3/buckets/{bucket}?prefix={quote(full)}"


def link_parts(location: StoreLocation, key: str) -> dict[str, str]:
    """What the link is built from: the store's kind, bucket or root directory, key prefix
    and endpoint (:class:`StoreLocation`), and the object's key."""
    return {**asdict(location), "key": key}


def url_from_parts(parts: Any) -> str:
    """The link for persisted ``parts`` (:func:`link_parts`); '' for missing or malformed
    ones."""
    if not isinstance(parts, dict):
        return ""
    fields = ("kind", "location", "prefix", "endpoint", "key")
    if set(parts) != set(fields) or not all(isinstance(parts[f], str) for f in fields):
        return ""
    try:
        location = StoreLocation(
            parts["kind"], parts["location"], parts["prefix"], parts["endpoint"]
        )
    except ValueError:
        return ""
    return object_browser_url(location.store_url, location.endpoint or None, parts["key"])


class OffloadedObjectsLink(BaseOperatorLink):
    name = "Offloaded objects"

    @staticmethod
    def persist(context: Context, location: StoreLocation, key: str) -> None:
        """Keep the link's parts for this task: ``key`` in the store at ``location``."""
        context["ti"].xcom_push(key=XCOM_KEY, value=link_parts(location, key))

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        try:  # the task SDK's public XCom API; Airflow stores the link when the task ends
            parts = BaseXCom.get_value(ti_key=ti_key, key=XCOM_KEY)
        except Exception:
            return ""
        return url_from_parts(parts)

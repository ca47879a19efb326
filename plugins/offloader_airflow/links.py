"""Operator extra links: from a task to the objects it wrote.

Like the amazon provider's links, the parts are stored in XCom at run time and the link
is built from them on demand; any failure yields an empty link, never a broken page.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlparse

from airflow.sdk import BaseOperatorLink, BaseXCom

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


class OffloadedObjectsLink(BaseOperatorLink):
    name = "Offloaded objects"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        try:  # the task SDK's public XCom API; Airflow stores the link when the task ends
            value = BaseXCom.get_value(ti_key=ti_key, key=XCOM_KEY)
        except Exception:
            return ""
        return value if isinstance(value, str) else ""

"""Where an offload went (invariant 7): a store's location, never a credential.

A location is what the metadata records with every attempt, committed ledger and queued
deletion, so reads and deletes find the objects even after the default store changed.
Credentials are not part of it: they come from the current settings when it is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse, urlunparse

FILE, S3 = "file", "s3"


@dataclass(frozen=True)
class StoreLocation:
    """``kind`` file: ``location`` is the root directory. ``kind`` s3: ``location`` is the
    bucket, ``prefix`` the key prefix (no slashes at the ends), ``endpoint`` the S3 endpoint
    without user or password ('' for the default AWS endpoint)."""

    kind: str
    location: str
    prefix: str = ""
    endpoint: str = ""

    def __post_init__(self) -> None:
        if self.kind not in (FILE, S3):
            raise ValueError(f"store kind {self.kind!r}: must be 'file' or 's3'")
        if not self.location:
            raise ValueError(f"{self.kind} store location must not be empty")
        if self.kind == FILE and (self.prefix or self.endpoint):
            raise ValueError("a file store has a root directory only, no prefix or endpoint")

    @classmethod
    def from_url(cls, url: str, endpoint_url: str | None = None) -> StoreLocation:
        """The location of ``file:///abs/dir`` or ``s3://bucket/prefix`` (at ``endpoint_url``)."""
        parsed = urlparse(url)
        if parsed.scheme == FILE:
            path = unquote(parsed.path)
            if parsed.netloc not in ("", "localhost") or not path.startswith("/"):
                raise ValueError(f"object store URL {url!r}: expected file:///absolute/dir")
            return cls(FILE, str(Path(path)))
        if parsed.scheme == S3:
            if not parsed.netloc or "@" in parsed.netloc or ":" in parsed.netloc:
                raise ValueError(f"object store URL {url!r}: expected s3://bucket/prefix")
            return cls(S3, parsed.netloc, parsed.path.strip("/"), safe_endpoint(endpoint_url))
        raise ValueError(
            f"object store URL {url!r}: scheme must be 'file' (file:///abs/dir) or 's3' "
            "(s3://bucket/prefix)"
        )

    @property
    def store_url(self) -> str:
        """The URL ``open_object_store`` takes (the endpoint is passed separately)."""
        if self.kind == FILE:
            return Path(self.location).as_uri()
        return f"s3://{self.location}/{self.prefix}" if self.prefix else f"s3://{self.location}"

    def __str__(self) -> str:
        """Safe to log: no credential is ever part of a location."""
        return f"{self.store_url} at {self.endpoint}" if self.endpoint else self.store_url


def safe_endpoint(endpoint_url: str | None) -> str:
    """The endpoint without any user:password part; '' when there is none."""
    if not endpoint_url:
        return ""
    parsed = urlparse(endpoint_url)
    host = parsed.hostname or ""
    netloc = f"{host}:{parsed.port}" if parsed.port else host
    return urlunparse(parsed._replace(netloc=netloc)).rstrip("/")

"""Process-wide settings from the environment (prefix ``OFFLOADER_``) or an Airflow connection.

Defaults put everything under one local data directory, so the embedded setup (local files,
SQLite) needs no configuration at all.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

# False while from_values builds settings: only the given values and the defaults count.
_READ_ENVIRONMENT: ContextVar[bool] = ContextVar("offloader_settings_env", default=True)


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "offloader"


#: The settings an object store binding reads (Settings.for_object_stores).
OBJECT_STORE_FIELDS = frozenset(
    {
        "s3_endpoint_url",
        "s3_region",
        "s3_access_key_id",
        "s3_secret_access_key",
        "s3_session_token",
        "upload_concurrency",
        "read_prefetch",
        "s3_connect_timeout_seconds",
        "s3_read_timeout_seconds",
        "s3_max_attempts",
        "s3_operation_deadline_seconds",
    }
)


class Settings(BaseSettings):
    """Where the metadata, objects and hot ledgers live, and how hard to push the store."""

    model_config = SettingsConfigDict(env_prefix="OFFLOADER_", frozen=True, extra="forbid")

    data_dir: Path = Field(default_factory=_default_data_dir)
    metadata_url: SecretStr | None = None  # a SQLAlchemy URL may hold a password
    object_store_url: str | None = None
    ledger_dir: Path | None = None

    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_access_key_id: SecretStr | None = None
    s3_secret_access_key: SecretStr | None = None
    s3_session_token: SecretStr | None = None

    # Deadlines (invariant 8): a store that stops answering fails an operation in bounded
    # time. One attempt waits at most connect + read timeout; retries stop once the
    # operation's deadline is spent. Worst case per operation: docs/CONFIGURATION.md.
    s3_connect_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    s3_read_timeout_seconds: float = Field(default=15.0, gt=0, le=3600)
    s3_max_attempts: int = Field(default=3, ge=1, le=20)
    s3_operation_deadline_seconds: float = Field(default=30.0, gt=0, le=3600)
    # the metadata database: connecting, one statement, waiting for a row or table lock
    # (PostgreSQL), waiting for the database lock (SQLite's busy timeout)
    db_connect_timeout_seconds: int = Field(default=10, ge=1, le=300)
    db_statement_timeout_seconds: float = Field(default=600.0, gt=0)
    db_lock_timeout_seconds: float = Field(default=60.0, gt=0)

    upload_concurrency: int = Field(default=4, ge=1, le=64)
    read_prefetch: int = Field(default=4, ge=0, le=64)
    attempt_lease_seconds: float = Field(default=300.0, gt=0)
    # a streaming pass's claim on its topic, renewed by the running pass every third of it:
    # a pass that dies blocks its topic for about this long (stream/lease.py)
    stream_lease_seconds: float = Field(default=30.0, gt=0)
    delete_retry_base_seconds: float = Field(default=5.0, ge=0)
    delete_retry_max_seconds: float = Field(default=3600.0, ge=0)
    # ledgers a trim marks (and whose hot copies it removes) per transaction
    trim_batch_ledgers: int = Field(default=1000, ge=1, le=10_000)
    # the orphan sweep (gc/sweep.py): an unreferenced object younger than the grace period
    # is left alone (it may belong to a write not yet visible); stale uploads are aborted
    sweep_grace_seconds: float = Field(default=86400.0, ge=0)
    multipart_max_age_seconds: float = Field(default=86400.0, ge=0)
    # objects an offload stops naming (a scrub repair, a rewrite) are queued for deletion
    # due this much later: a reader (or a bulk export's plan) that looked them up before
    # the swap still finds them
    replaced_object_grace_seconds: float = Field(default=86400.0, ge=0)
    metadata_snapshots_keep: int = Field(default=7, ge=1, le=1000)
    # one DeleteObjects request per batch: S3 takes at most 1,000 keys per request
    gc_batch_keys: int = Field(default=1000, ge=1, le=1000)
    # a queued key that failed this many times is reported as failing (status, GC summary)
    gc_failing_tries: int = Field(default=5, ge=1)
    # `offloader metrics --otlp` (metrics/otel.py): the OTLP/HTTP metrics endpoint, built as
    # Airflow builds its own from [metrics] otel_host/otel_port/otel_ssl_active; headers
    # (an API key, say) are ``k=v,k2=v2`` as OTEL_EXPORTER_OTLP_HEADERS, a secret
    otel_endpoint: str | None = None
    otel_headers: SecretStr | None = None
    otel_timeout_seconds: float = Field(default=10.0, gt=0, le=300)

    @classmethod
    def from_values(cls, **values: Any) -> Settings:
        """Settings of exactly ``values`` and the defaults, never the ``OFFLOADER_*``
        environment: settings built from an Airflow connection must not change with the
        worker they happen to run on."""
        token = _READ_ENVIRONMENT.set(False)
        try:
            return cls(**values)
        finally:
            _READ_ENVIRONMENT.reset(token)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if not _READ_ENVIRONMENT.get():
            return (init_settings,)
        return (init_settings, env_settings, dotenv_settings, file_secret_settings)

    def environment(self) -> dict[str, str]:
        """The ``OFFLOADER_*`` variables that make another process (a Spark driver) build
        these settings, secrets included: for a child's environment, never a command line."""
        env = {}
        for name, value in self.model_dump(exclude_none=True).items():
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            env[f"OFFLOADER_{name.upper()}"] = str(value)
        return env

    def for_object_stores(self) -> Settings:
        """Only what opening an object store needs (endpoint, region, keys, tuning): what a
        Spark executor gets in its task closure. No metadata URL, no local paths."""
        return Settings.from_values(**self.model_dump(include=set(OBJECT_STORE_FIELDS)))

    @field_validator("data_dir", "ledger_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().resolve()

    @field_validator("object_store_url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("file:///", "s3://")):
            raise ValueError("must start with file:/// (absolute path) or s3://bucket")
        return value

    @field_validator("otel_endpoint")
    @classmethod
    def _otlp_http_url(cls, value: str | None) -> str | None:
        """``http(s)://host:port`` gets Airflow's ``/v1/metrics`` path; a given path stays."""
        if value is None or not value.strip():
            return None
        url = urlsplit(value.strip())
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(
                "must be an http:// or https:// URL (OTLP/HTTP), e.g. http://127.0.0.1:4318"
            )
        if url.path in ("", "/"):
            url = url._replace(path="/v1/metrics")
        return urlunsplit(url)

    @field_validator("otel_headers")
    @classmethod
    def _header_pairs(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            _parse_headers(value.get_secret_value())  # never echoes the value
        return value

    @model_validator(mode="after")
    def _backoff_order(self) -> Settings:
        if self.delete_retry_max_seconds < self.delete_retry_base_seconds:
            raise ValueError("delete_retry_max_seconds must be >= delete_retry_base_seconds")
        return self

    @property
    def resolved_metadata_url(self) -> str:
        if self.metadata_url is not None:
            return self.metadata_url.get_secret_value()
        return f"sqlite:///{self.data_dir / 'metadata.db'}"

    @property
    def resolved_object_store_url(self) -> str:
        return self.object_store_url or (self.data_dir / "objects").as_uri()

    def otel_header_map(self) -> dict[str, str]:
        """The OTLP headers as a mapping (secret values: for the request only)."""
        if self.otel_headers is None:
            return {}
        return _parse_headers(self.otel_headers.get_secret_value())

    @property
    def resolved_ledger_dir(self) -> Path:
        return self.ledger_dir or self.data_dir / "ledgers"


def _parse_headers(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (values URL-encoded, as OTEL_EXPORTER_OTLP_HEADERS); a malformed item
    is refused by its position, never by its text (it may hold a key)."""
    headers = {}
    for i, item in enumerate(filter(None, (p.strip() for p in text.split(","))), 1):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"item {i} is not NAME=VALUE (items are separated by commas)")
        headers[unquote(name.strip()).lower()] = unquote(value.strip())
    return headers

"""OffloaderHook: Airflow connections -> the library's validated Settings and Runtime.

The offloader connection (conn type ``generic``) names the metadata database and the object
store in its extra; S3 credentials and the endpoint come from an amazon-provider AWS
connection (``aws_conn_id`` in the extra, ``aws_default`` by default). Secrets are
registered with Airflow's masker the moment they are read, and never enter repr or errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import ValidationError
from sqlalchemy.engine import make_url

from offloader.policy import describe_validation_error
from offloader.runtime import Runtime
from offloader.settings import Settings

try:  # Airflow is optional for the library, required here
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException
    from airflow.sdk.log import mask_secret
except ImportError as exc:  # pragma: no cover - the plugin only loads inside Airflow
    raise ImportError("offloader_airflow needs apache-airflow>=3") from exc

#: Extra keys the offloader connection accepts besides the ones below.
TUNING_KEYS = (
    "upload_concurrency",
    "read_prefetch",
    "attempt_lease_seconds",
    "delete_retry_base_seconds",
    "delete_retry_max_seconds",
    "trim_batch_ledgers",
    "sweep_grace_seconds",
    "multipart_max_age_seconds",
    "metadata_snapshots_keep",
    "gc_batch_keys",
    "gc_failing_tries",
)


class OffloaderConnectionError(ValueError):
    """A connection is missing or malformed; the message says which and how to fix it."""


@dataclass(frozen=True)
class OffloaderConnection:
    """The offloader connection, parsed once. Secret-bearing fields stay out of repr."""

    conn_id: str
    metadata_url: str = field(repr=False)
    object_store_url: str
    ledger_dir: str | None
    aws_conn_id: str | None
    tuning: dict[str, Any]

    @classmethod
    def parse(cls, conn_id: str, extra: dict[str, Any]) -> OffloaderConnection:
        known = {"metadata_url", "object_store_url", "ledger_dir", "aws_conn_id", *TUNING_KEYS}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise OffloaderConnectionError(
                f"connection {conn_id!r}: unknown extra key(s) {unknown}; known: {sorted(known)}"
            )
        missing = [k for k in ("metadata_url", "object_store_url") if not extra.get(k)]
        if missing:
            raise OffloaderConnectionError(
                f"connection {conn_id!r}: extra needs {missing} (SQLAlchemy URL of the "
                "metadata database; file:///abs/dir or s3://bucket/prefix)"
            )
        aws_conn_id = extra.get("aws_conn_id")
        if aws_conn_id is None and str(extra["object_store_url"]).startswith("s3://"):
            aws_conn_id = "aws_default"
        return cls(
            conn_id=conn_id,
            metadata_url=str(extra["metadata_url"]),
            object_store_url=str(extra["object_store_url"]),
            ledger_dir=extra.get("ledger_dir"),
            aws_conn_id=aws_conn_id,
            tuning={k: extra[k] for k in TUNING_KEYS if k in extra},
        )

    @property
    def safe_metadata_url(self) -> str:
        return make_url(self.metadata_url).render_as_string(hide_password=True)


class OffloaderHook(BaseHook):
    """Builds the library's Settings from Airflow connections; opens a Runtime on them."""

    conn_name_attr = "offloader_conn_id"
    default_conn_name = "offloader_default"
    conn_type = "generic"
    hook_name = "Offloader"

    def __init__(self, offloader_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.offloader_conn_id = offloader_conn_id

    @cached_property
    def connection(self) -> OffloaderConnection:
        conn = self._get(self.offloader_conn_id, "offloader")
        try:
            extra = conn.extra_dejson
        except json.JSONDecodeError as exc:
            raise OffloaderConnectionError(
                f"connection {self.offloader_conn_id!r}: extra is not valid JSON"
            ) from exc
        if not isinstance(extra, dict):
            raise OffloaderConnectionError(
                f"connection {self.offloader_conn_id!r}: extra must be a JSON object"
            )
        parsed = OffloaderConnection.parse(self.offloader_conn_id, extra)
        password = make_url(parsed.metadata_url).password
        if password:
            mask_secret(password)
        return parsed

    def get_settings(self) -> Settings:
        """Validated settings; a bad value raises OffloaderConnectionError naming the field."""
        parsed = self.connection
        values: dict[str, Any] = {
            "metadata_url": parsed.metadata_url,
            "object_store_url": parsed.object_store_url,
            **parsed.tuning,
        }
        if parsed.ledger_dir:
            values["ledger_dir"] = parsed.ledger_dir
        if parsed.object_store_url.startswith("s3://"):
            values.update(self._s3_values(parsed.aws_conn_id or "aws_default"))
        try:
            return Settings(**values)
        except ValidationError as exc:
            raise OffloaderConnectionError(
                f"connection {parsed.conn_id!r}: {describe_validation_error(exc)}"
            ) from None

    def get_runtime(self) -> Runtime:
        return Runtime.open(self.get_settings())

    def test_connection(self) -> tuple[bool, str]:
        """Reach the metadata database and the object store; never echo a secret."""
        try:
            with self.get_runtime() as runtime:
                runtime.metadata.counts()
                runtime.objects.exists("offloader-connection-test")
                store = runtime.objects.url
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"metadata {self.connection.safe_metadata_url} and store {store} reachable"

    def _s3_values(self, aws_conn_id: str) -> dict[str, Any]:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        self._get(aws_conn_id, "AWS")  # fail clearly: the provider would fall back silently
        aws = AwsBaseHook(aws_conn_id=aws_conn_id, client_type="s3")
        config = aws.conn_config
        credentials = aws.get_credentials()
        values: dict[str, Any] = {
            "s3_endpoint_url": config.endpoint_url,
            "s3_region": config.region_name or "us-east-1",
        }
        for name, secret in (
            ("s3_access_key_id", credentials.access_key),
            ("s3_secret_access_key", credentials.secret_key),
            ("s3_session_token", credentials.token),
        ):
            if secret:
                mask_secret(secret)
                values[name] = secret
        return values

    def _get(self, conn_id: str, what: str):  # type: ignore[no-untyped-def]
        try:
            return self.get_connection(conn_id)
        except AirflowNotFoundException:
            raise OffloaderConnectionError(
                f"the {what} connection {conn_id!r} is not defined: create it in the UI "
                f"(Admin > Connections) or set AIRFLOW_CONN_{conn_id.upper()}"
            ) from None

"""OffloaderHook: Airflow connections -> the library's Settings, Runtime and S3 clients.

The offloader connection (conn type ``generic``) names the metadata database and the object
store in its extra (:class:`OffloaderConnectionExtra`, unknown keys refused). S3 clients
come from an amazon-provider AWS connection (``aws_conn_id`` in the extra, ``aws_default``
by default) through ``AwsBaseHook``'s session: assume-role, profiles, ``credential_process``
and other refreshing credentials keep refreshing, and ``verify`` and ``botocore_config``
apply. No credential is copied into the settings, and the settings never read the worker's
``OFFLOADER_*`` environment. Secrets are masked the moment they are read.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, create_model
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

#: Settings an offloader connection may tune in its extra (same names, same rules).
TUNING_KEYS = (
    "upload_concurrency",
    "read_prefetch",
    "attempt_lease_seconds",
    "stream_lease_seconds",
    "delete_retry_base_seconds",
    "delete_retry_max_seconds",
    "trim_batch_ledgers",
    "sweep_grace_seconds",
    "multipart_max_age_seconds",
    "replaced_object_grace_seconds",
    "metadata_snapshots_keep",
    "gc_batch_keys",
    "gc_failing_tries",
    "s3_connect_timeout_seconds",
    "s3_read_timeout_seconds",
    "s3_max_attempts",
    "s3_operation_deadline_seconds",
    "db_connect_timeout_seconds",
    "db_statement_timeout_seconds",
    "db_lock_timeout_seconds",
)

DEFAULT_AWS_CONN_ID = "aws_default"


class OffloaderConnectionError(ValueError):
    """A connection is missing or malformed; the message says which and how to fix it."""


class _ExtraBase(BaseModel):
    """The keys every offloader connection has; the tuning keys are added from Settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metadata_url: SecretStr = Field(
        description="SQLAlchemy URL of the metadata database, e.g. "
        "`postgresql+psycopg2://user:pass@host/db`; a secret, never shown with its password"
    )
    object_store_url: str = Field(
        description="where new offloads go: `file:///abs/dir` or `s3://bucket/prefix`"
    )
    ledger_dir: str | None = Field(default=None, description="the hot tier's ledger files")
    aws_conn_id: str | None = Field(
        default=None,
        description="the AWS connection S3 clients come from (`aws_default` when the store "
        "is S3); its endpoint, region, credentials, `verify` and `botocore_config` apply",
    )
    lineage_host: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$",
        description="the host OpenLineage names local paths under (`file://{host}`: a "
        "`file://` store, the hot tier); default: the worker's fully qualified name. Set it "
        "when workers share the volume, so every task names the same paths alike",
    )

    @property
    def safe_metadata_url(self) -> str:
        return make_url(self.metadata_url.get_secret_value()).render_as_string(hide_password=True)

    @property
    def is_s3(self) -> bool:
        return self.object_store_url.startswith("s3://")

    def tuning(self) -> dict[str, Any]:
        """The tuning keys the connection sets (the rest keep the Settings defaults)."""
        return {k: getattr(self, k) for k in TUNING_KEYS if k in self.model_fields_set}


def _tuning_field(name: str) -> tuple[Any, Any]:
    """Settings' field ``name``, optional, with Settings' bounds (one rule, two models)."""
    source = Settings.model_fields[name]
    assert source.annotation is not None  # every Settings field is annotated
    bounds = ("ge", "gt", "le", "lt")
    rules = {b: getattr(m, b) for m in source.metadata for b in bounds if hasattr(m, b)}
    described = f"see `OFFLOADER_{name.upper()}` (default {source.default})"
    return source.annotation | None, Field(None, description=described, **rules)


# create_model's field definitions, (annotation, FieldInfo) by name; Any, as `**` spreads
# them over create_model's own keywords (__config__, ...) too
_tuning_fields: dict[str, Any] = {name: _tuning_field(name) for name in TUNING_KEYS}

#: The offloader connection's extra: one model for the hook, the docs table and its test.
OffloaderConnectionExtra: type[_ExtraBase] = create_model(
    "OffloaderConnectionExtra",
    __base__=_ExtraBase,
    __doc__="The offloader connection's extra; unknown keys are refused.",
    **_tuning_fields,
)


def extra_docs_table() -> str:
    """The extra's keys as the Markdown table in docs/CONFIGURATION.md (a test holds the
    two equal, so the docs cannot drift from the model)."""
    schema = OffloaderConnectionExtra.model_json_schema()
    required = set(schema.get("required", []))
    lines = ["| key | value | meaning |", "|---|---|---|"]
    for name, prop in schema["properties"].items():
        kinds = [k for k in prop.get("anyOf", [prop]) if k.get("type") != "null"]
        kind = kinds[0]
        value = "string" if kind.get("format") == "password" else kind["type"]
        low = kind.get("minimum", kind.get("exclusiveMinimum"))
        high = kind.get("maximum")
        if low is not None or high is not None:
            above = f"> {low}" if "exclusiveMinimum" in kind else f">= {low}"
            value += f", {low}..{high}" if high is not None else f", {above}"
        if name in required:
            value += ", required"
        lines.append(f"| `{name}` | {value} | {prop.get('description', '')} |")
    return "\n".join(lines)


class OffloaderHook(BaseHook):
    """Builds the library's Settings and S3 clients from Airflow connections; opens a
    Runtime on them. ``aws_conn_id`` overrides the one the offloader connection names."""

    conn_name_attr = "offloader_conn_id"
    default_conn_name = "offloader_default"
    conn_type = "generic"
    hook_name = "Offloader"

    def __init__(
        self, offloader_conn_id: str = default_conn_name, aws_conn_id: str | None = None
    ) -> None:
        super().__init__()
        self.offloader_conn_id = offloader_conn_id
        self._aws_conn_id = aws_conn_id

    @cached_property
    def connection(self) -> _ExtraBase:
        """The offloader connection's extra, validated (OffloaderConnectionError if not)."""
        conn = self._get(self.offloader_conn_id, "offloader")
        where = f"connection {self.offloader_conn_id!r}"
        try:
            extra = conn.extra_dejson
        except json.JSONDecodeError:
            raise OffloaderConnectionError(f"{where}: extra is not valid JSON") from None
        if not isinstance(extra, dict):
            raise OffloaderConnectionError(f"{where}: extra must be a JSON object")
        password = _url_password(extra.get("metadata_url"))
        if password:
            mask_secret(password)
        try:
            return OffloaderConnectionExtra.model_validate(extra)
        except ValidationError as exc:
            raise OffloaderConnectionError(
                f"{where}: extra {describe_validation_error(exc)} "
                f"(keys: {', '.join(OffloaderConnectionExtra.model_fields)})"
            ) from None

    @property
    def aws_conn_id(self) -> str | None:
        """The AWS connection S3 clients come from; None for a filesystem store."""
        if self._aws_conn_id:
            return self._aws_conn_id
        if self.connection.aws_conn_id:
            return self.connection.aws_conn_id
        return DEFAULT_AWS_CONN_ID if self.connection.is_s3 else None

    @cached_property
    def aws_hook(self) -> Any:
        """The amazon provider's hook on :attr:`aws_conn_id` (which must exist)."""
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        conn_id = self.aws_conn_id or DEFAULT_AWS_CONN_ID
        conn = self._get(conn_id, "AWS")  # fail clearly: the provider would fall back silently
        for secret in (conn.password, *_extra_secrets(conn)):
            if secret:
                mask_secret(secret)
        return AwsBaseHook(aws_conn_id=conn_id, client_type="s3")

    @cached_property
    def _session(self) -> Any:
        return self.aws_hook.get_session(region_name=self._region)

    @property
    def _region(self) -> str:
        return self.aws_hook.region_name or "us-east-1"

    def get_settings(self) -> Settings:
        """Validated settings, from the connections only (never ``OFFLOADER_*``) and
        without credentials; a bad value raises OffloaderConnectionError naming the field."""
        extra = self.connection
        values: dict[str, Any] = {
            "metadata_url": extra.metadata_url,
            "object_store_url": extra.object_store_url,
            **extra.tuning(),
        }
        if extra.ledger_dir:
            values["ledger_dir"] = extra.ledger_dir
        if extra.is_s3:
            wrapper = self.aws_hook.conn_config
            values["s3_endpoint_url"] = wrapper.get_service_endpoint_url("s3")
            values["s3_region"] = self._region
        try:
            return Settings.from_values(**values)
        except ValidationError as exc:
            raise OffloaderConnectionError(
                f"connection {self.offloader_conn_id!r}: {describe_validation_error(exc)}"
            ) from None

    def get_portable_settings(self) -> Settings:
        """:meth:`get_settings` plus the AWS connection's current credentials, for processes
        that cannot reach Airflow's connections (a Spark driver and its executors). They are
        frozen: a refreshing session's token expires when it would have been refreshed.
        Every secret is masked here, before anything can log it."""
        settings = self.get_settings()
        if self.aws_conn_id is None:
            return settings
        credentials = self._session.get_credentials()
        if credentials is None:
            raise OffloaderConnectionError(
                f"the AWS connection {self.aws_conn_id!r} yields no credentials: Spark's "
                "executors need keys (login/password, a role, or a profile) to read the store"
            )
        frozen = credentials.get_frozen_credentials()
        for secret in (frozen.secret_key, frozen.token):
            if secret:
                mask_secret(secret)
        return settings.model_copy(
            update={
                "s3_access_key_id": SecretStr(frozen.access_key),
                "s3_secret_access_key": SecretStr(frozen.secret_key),
                "s3_session_token": SecretStr(frozen.token) if frozen.token else None,
            }
        )

    def s3_client(self, settings: Settings) -> Any:
        """An S3 client for ``settings``' endpoint (the library's S3ClientFactory): the AWS
        connection's session (credentials refresh in it), ``verify`` and ``botocore_config``
        over the library's client config."""
        from offloader.objectstore.s3 import client_config

        config = client_config(settings)
        own = self.aws_hook.conn_config.botocore_config
        if own is not None:
            config = config.merge(own)
        # a store recorded on S3 while the default is now a directory has no endpoint in
        # ``settings``: it comes from the AWS connection like everything else (invariant 7)
        endpoint = settings.s3_endpoint_url or self.aws_hook.conn_config.get_service_endpoint_url(
            "s3"
        )
        return self._session.client(
            "s3",
            endpoint_url=endpoint,
            region_name=self._region,
            config=config,
            verify=self.aws_hook.verify,
        )

    def get_runtime(self) -> Runtime:
        settings = self.get_settings()
        # always the AWS connection's clients, also for S3 stores recorded before the default
        # store became a directory; the AWS hook is only built when such a store is opened
        return Runtime.open(settings, self.s3_client)

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

    def _get(self, conn_id: str, what: str) -> Any:
        try:
            return self.get_connection(conn_id)
        except AirflowNotFoundException:
            raise OffloaderConnectionError(
                f"the {what} connection {conn_id!r} is not defined: create it in the UI "
                f"(Admin > Connections) or set AIRFLOW_CONN_{conn_id.upper()}"
            ) from None


def _url_password(url: Any) -> str | None:
    try:
        return make_url(str(url)).password if url else None
    except Exception:  # a malformed URL is reported by validation, without its text
        return None


def _extra_secrets(conn: Any) -> list[str]:
    """Secrets an AWS connection may hold in its extra besides the password."""
    try:
        extra = conn.extra_dejson
    except Exception:
        return []
    keys = ("aws_secret_access_key", "aws_session_token")
    return [str(extra[k]) for k in keys if isinstance(extra, dict) and extra.get(k)]

"""What the plugin's ``/offloader/metrics`` route serves: the tier metrics in Prometheus's
text format, read from the offloader's metadata alone (no Runtime: a scrape must not open
the object store, nor create the hot tier's directories on the API server's host).
"""

from __future__ import annotations

import logging

from offloader.exceptions import OffloaderError
from offloader.metadata import MetadataStore
from offloader.metrics import CONTENT_TYPE, families, observe, prometheus_text
from offloader.runtime import database_deadlines
from offloader_airflow.hooks import OffloaderConnectionError, OffloaderHook

log = logging.getLogger(__name__)

__all__ = ["CONTENT_TYPE", "MetricsUnavailableError", "metrics_text"]


class MetricsUnavailableError(ValueError):
    """The metrics cannot be read; the message names what is wrong, never a secret."""


def metrics_text(hook: OffloaderHook) -> str:
    """The Prometheus text of the tiers the hook's connection points at (served as
    :data:`CONTENT_TYPE`); MetricsUnavailableError when they cannot be read."""
    try:
        settings = hook.get_settings()
        metadata = MetadataStore.open(settings.resolved_metadata_url, database_deadlines(settings))
        try:
            obs = observe(metadata, settings)
        finally:
            metadata.close()
    except (OffloaderConnectionError, OffloaderError) as exc:
        # ours name the field or the revision and carry no secret
        raise MetricsUnavailableError(str(exc)) from None
    except Exception as exc:
        # a driver's message may quote a URL: the log has it (masked), the answer not
        log.exception("offloader metrics: reading the offloader metadata failed")
        raise MetricsUnavailableError(
            f"{type(exc).__name__} reading the offloader metadata; see the log"
        ) from None
    return prometheus_text(families(obs))

"""OpenLineage for the tasks that move data: what they report, named here and nowhere else.

A task records what it moved while it runs (:class:`Moved`: the hot topics it read, the
stores or folders it read and wrote, as URLs, from its own results); the provider's
listener asks the operator (:class:`LineageMixin`) once the task ended, and only then are
datasets built, so a deployment without OpenLineage pays nothing. Names follow the
OpenLineage naming spec through the client's helpers (``openlineage.client.naming``), as
the amazon provider names S3 data:

- an S3 store ``s3://bucket/prefix``: namespace ``s3://bucket``, name ``prefix`` (``/`` at
  the bucket's root). Keys are flat under the prefix (docs/FORMAT.md), so a store is one
  dataset whatever topics it holds; which topics went in is the run's inputs;
- a directory (a ``file://`` store, an export folder): namespace ``file://{host}``, name
  its absolute path; ``host`` is the connection's ``lineage_host``, else the worker's name;
- a hot topic: its folder in the hot tier, ``{ledger_dir}/{folder}`` (the folder name of
  :func:`offloader.hottier.names.encode_topic`), on the same host; a task over more than
  :data:`MAX_TOPICS` topics reports the hot tier's directory instead (bounded);
- an export: its folder, ``{output}/{export id}``.

No credential reaches a dataset: stores are named by their URLs, which
:class:`~offloader.objectstore.location.StoreLocation` refuses with a user or password, and
no endpoint is part of a name. A task that failed reports what it recorded before it
failed (a streaming pass records the topics it moved, then fails for the others), which is
nothing for every other task: never what it only meant to move.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from offloader.hottier.names import encode_topic
from offloader.objectstore.location import FILE, StoreLocation

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    from offloader.settings import Settings
    from offloader_airflow.hooks import OffloaderHook

#: the most hot topics one task names one by one; above, the hot tier's directory
MAX_TOPICS = 20

log = logging.getLogger(__name__)


class Moved(BaseModel):
    """What one task moved: ``topics`` of the hot tier at ``ledger_dir`` and the stores or
    folders ``read``, into those ``written`` (URLs); ``rows``, ``size`` and ``files`` of
    what was written, when known (an export)."""

    model_config = ConfigDict(frozen=True)

    host: str
    ledger_dir: str | None = None
    topics: list[str] = []
    read: list[str] = []
    written: list[str] = []
    rows: int | None = None
    size: int | None = None
    files: int | None = None


def lineage_host(hook: OffloaderHook) -> str:
    """The host local paths are named under: the connection's ``lineage_host``, else this
    worker's fully qualified name."""
    return hook.connection.lineage_host or socket.getfqdn()


def from_hot_tier(
    hook: OffloaderHook, settings: Settings, topics: list[str], stores: list[StoreLocation]
) -> Moved | None:
    """``topics`` of the hot tier moved into ``stores``; None when nothing was written."""
    if not topics or not stores:
        return None
    return Moved(
        host=lineage_host(hook),
        ledger_dir=str(settings.resolved_ledger_dir),
        topics=topics,
        written=[s.store_url for s in stores],
    )


def names(url: str, host: str) -> tuple[str, str]:
    """(namespace, name) of a store or folder URL (``s3://bucket/prefix``,
    ``file:///abs/dir``); ValueError for any other URL."""
    from openlineage.client.naming.dataset import S3, RemoteFileSystem

    location = StoreLocation.from_url(url)
    naming: S3 | RemoteFileSystem
    if location.kind == FILE:
        naming = RemoteFileSystem(host=host, path=location.location)
    else:
        naming = S3(bucket_name=location.location, object_key=location.prefix or "/")
    return naming.get_namespace(), naming.get_name()


def hot_topic_urls(ledger_dir: str, topics: list[str]) -> list[str]:
    """The hot topics' folders as URLs; the hot tier's own above :data:`MAX_TOPICS`."""
    root = Path(ledger_dir)
    if len(set(topics)) > MAX_TOPICS:
        return [root.as_uri()]
    return [(root / encode_topic(t)).as_uri() for t in sorted(set(topics))]


def operator_lineage(moved: Moved | None) -> OperatorLineage:
    """The provider's lineage of ``moved``; empty when the task moved nothing."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    if moved is None or not moved.written:
        return OperatorLineage()
    hot = hot_topic_urls(moved.ledger_dir, moved.topics) if moved.ledger_dir else []
    inputs = [_dataset(u, moved.host) for u in dict.fromkeys([*hot, *moved.read])]
    outputs = [_dataset(u, moved.host, _statistics(moved)) for u in dict.fromkeys(moved.written)]
    return OperatorLineage(inputs=inputs, outputs=outputs)


def _dataset(url: str, host: str, output_facets: dict[str, Any] | None = None) -> Dataset:
    from openlineage.client.event_v2 import InputDataset, OutputDataset

    namespace, name = names(url, host)
    if output_facets is None:
        return InputDataset(namespace=namespace, name=name)
    return OutputDataset(namespace=namespace, name=name, outputFacets=output_facets)


def _statistics(moved: Moved) -> dict[str, Any]:
    from openlineage.client.facet_v2 import output_statistics_output_dataset as stats

    if len(moved.written) != 1 or moved.size is None:
        return {}
    facet = stats.OutputStatisticsOutputDatasetFacet(
        rowCount=moved.rows, size=moved.size, fileCount=moved.files
    )
    return {"outputStatistics": facet}


class LineageMixin:
    """OpenLineage for an operator whose ``execute`` sets :attr:`moved` (after resetting
    it: a retry of the same operator object must not report an earlier try's data)."""

    moved: Moved | None = None

    def record_moved(self, read: Callable[[], Moved | None]) -> None:
        """Set :attr:`moved` from ``read`` (which may ask the metadata which stores were
        written). Lineage is a report: when it cannot be read, the task whose data moved
        still succeeds, reporting no datasets, and the log says why (the error's class only:
        a driver's message may quote a URL)."""
        try:
            self.moved = read()
        except Exception as exc:
            self.moved = None
            log.warning(
                "OpenLineage: what this task moved could not be read (%s)", type(exc).__name__
            )

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage:
        return operator_lineage(self.moved)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> OperatorLineage:
        # without it the provider asks on_complete: the same answer, said on purpose
        return operator_lineage(self.moved)

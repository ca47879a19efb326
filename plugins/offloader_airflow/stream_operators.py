"""Thin operators of the ``streaming_offload`` DAG: list the topics, one streaming pass
(PIP-76) per topic.

The work is the library's (``offloader.stream.runs``); these validate the run's params,
open a Runtime from the connection, call it and log what happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import AssetAlias, Context
from pydantic import JsonValue

from offloader.stream.params import StreamRunParams
from offloader.stream.runs import FAILED, run_streaming, stores_written, streaming_topics
from offloader_airflow.assets import DELETION_QUEUE, OFFLOADED_LEDGERS
from offloader_airflow.base import OffloaderBaseOperator, offloader_template_fields
from offloader_airflow.lineage import LineageMixin, Moved, from_hot_tier

if TYPE_CHECKING:
    from offloader.runtime import Runtime
    from offloader_airflow.hooks import OffloaderHook

#: List it in the operator's ``outlets``: through it a pass updates
#: ``offloader_offloaded_ledgers`` only when it committed segments or settled ledgers, and
#: ``offloader_deletion_queue`` only when a failed segment queued its keys, rather than
#: every minute.
STREAM_OUTLETS = AssetAlias(name="offloader_streaming_outlets", group="offloader")

_DEFAULTS = StreamRunParams()


class _StreamParamsOperator(OffloaderBaseOperator):
    """Takes the run's params (:class:`StreamRunParams`): a ``dag.param(...)`` or a literal
    for each; :meth:`run_params` checks them, and the run's conf (Airflow keeps a key no
    Param declares: the model refuses it), before anything is read or changed."""

    template_fields: Sequence[str] = offloader_template_fields(*StreamRunParams.model_fields)

    def __init__(
        self,
        *,
        topic: str | None = _DEFAULTS.topic,
        close_now: bool = _DEFAULTS.close_now,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.close_now = close_now

    def run_params(self, context: Context) -> StreamRunParams:
        given = {name: getattr(self, name) for name in StreamRunParams.model_fields}
        dag_run = context.get("dag_run")
        conf = dict(getattr(dag_run, "conf", None) or {})
        return StreamRunParams.parse({**conf, **given})


class PlanStreamOperator(_StreamParamsOperator):
    """Validate the run's params and list the topics to stream: the one named (NotFoundError
    if unknown) or every topic whose policy has streaming on. Returns one kwargs dict per
    topic (``topic``, ``close_now``) for ``StreamPassOperator.partial(...).expand_kwargs``.
    Nothing changes here."""

    def execute(self, context: Context) -> list[dict[str, Any]]:
        params = self.run_params(context)
        with self.hook.get_runtime() as runtime:
            topics = streaming_topics(runtime.metadata, params.topic)
        self.log.info("streaming %s%s", topics or "no topic", " (close now)" * params.close_now)
        return [{"topic": topic, "close_now": params.close_now} for topic in topics]


class StreamPassOperator(LineageMixin, _StreamParamsOperator):
    """Validate the run's params, then run one streaming pass per topic (the one named or
    every streaming topic) and delete hot copies past their lag. Returns one dict per topic
    (status done, busy or failed; see ``offloader.stream.runs.run_streaming``).

    A topic another pass holds is ``busy``, not a failure; a failed topic fails the task
    after every other topic had its pass. Map it over :class:`PlanStreamOperator`'s output
    for a task per topic. The stream's owner names this try of this task instance (and map
    index), so a retry is a new owner, never mistaken for the try it replaces. List
    :data:`STREAM_OUTLETS` in ``outlets``. OpenLineage: the hot topics that moved entries
    into the stores of the segments they went to (also when another topic failed the task).
    """

    def execute(self, context: Context) -> list[dict[str, Any]]:
        self.moved = None
        params = self.run_params(context)
        with self.hook.get_runtime() as runtime:
            results = run_streaming(runtime, params, owner=_owner(context))
            self.record_moved(lambda: _moved(self.hook, runtime, results))
        for r in results:
            self.log.info("%s: %s", r["topic"], _describe(r))
        if not results:
            self.log.info("no topic has streaming on")
        _record_outlets(context, results)
        failed = [r for r in results if r["status"] == FAILED]
        if failed:
            shown = "; ".join(f"{r['topic']}: {r['detail']}" for r in failed)
            raise RuntimeError(f"the streaming pass failed for {len(failed)} topic(s): {shown}")
        return results


def _owner(context: Context) -> str:
    ti = context["ti"]
    mapped = f"[{ti.map_index}]" if ti.map_index is not None and ti.map_index >= 0 else ""
    return f"airflow:{ti.dag_id}/{ti.task_id}{mapped}/{ti.run_id}/try-{ti.try_number}"


def _describe(r: dict[str, Any]) -> str:
    if r["status"] != "done":
        return f"{r['status']}: {r['detail']}"
    return (
        f"epoch {r['epoch']}, {r['parts_uploaded']} parts ({r['bytes_uploaded']} bytes), "
        f"segments committed {r['committed'] or '-'}, failed {r['failed'] or '-'}, "
        f"open {r['open_segment'] or '-'} at {r['offloaded_to'] or '-'} "
        f"({r['waiting_bytes']} bytes waiting), ledgers settled {r['settled_ledgers'] or '-'}, "
        f"hot copies deleted {r['hot_deleted'] or '-'}"
    )


def _record_outlets(context: Context, results: list[dict[str, Any]]) -> None:
    # a committed segment settles the ledgers it completes in its own commit, so those are
    # not all in settled_ledgers: a commit counts as new offloaded data too
    offloaded: dict[str, JsonValue] = {
        r["topic"]: {"committed": r["committed"], "settled_ledgers": r["settled_ledgers"]}
        for r in results
        if r.get("committed") or r.get("settled_ledgers")
    }
    failed = {r["topic"]: r["failed"] for r in results if r.get("failed")}
    events = context["outlet_events"][STREAM_OUTLETS]
    if offloaded:
        events.add(OFFLOADED_LEDGERS, extra={"streamed": offloaded})
    if failed:
        events.add(DELETION_QUEUE, extra={"failed_segments": failed})


def _moved(hook: OffloaderHook, runtime: Runtime, results: list[dict[str, Any]]) -> Moved | None:
    """The hot topics that moved entries, into the stores of the segments they went to."""
    stores = {r["topic"]: stores_written(runtime.metadata, r) for r in results}
    moved = [t for t, written in stores.items() if written]
    return from_hot_tier(hook, runtime.settings, moved, [s for t in moved for s in stores[t]])

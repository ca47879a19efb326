"""Spark jobs submitted with the offloader connection's settings, secrets kept off the
command line, out of rendered fields and out of Spark's conf.

The Spark driver cannot reach Airflow's connections, so the task resolves them (the
offloader connection and its AWS connection, :meth:`OffloaderHook.get_portable_settings`)
and hands them to ``spark-submit`` through the child process's environment, built at
execute time: not ``env_vars``, which is a template field (rendered fields are stored) and
becomes ``--conf`` on YARN and Kubernetes. The driver passes executors what they need in
the task closure (docs/CONFIGURATION.md, "Spark jobs").

Only the Spark provider's public API is used: the task builds its ``SparkSubmitHook`` with
the hook's constructor from the operator's arguments (as ``SparkSubmitOperator`` builds its
own), hands the environment to the hook's ``submit`` (its keyword arguments go to
``Popen``), kills through the hook's ``on_kill``, and reads the deploy mode from the
connection (``BaseHook.get_connection``).
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook, Context
from airflow.sdk.exceptions import AirflowException

from offloader.bulk.params import ExportParams
from offloader.keys import export_prefix
from offloader.rewrite.params import RewriteParams
from offloader.scrub.params import ScrubParams
from offloader.scrub.targets import check_topics
from offloader.settings import Settings
from offloader_airflow.hooks import OffloaderHook
from offloader_airflow.lineage import LineageMixin, Moved, lineage_host

#: include/spark_jobs/ beside plugins/ (the repo's layout, and the image's /opt/offloader)
SPARK_JOBS = Path(__file__).parent.parent.parent / "include" / "spark_jobs"

#: ``SparkSubmitHook``'s constructor arguments that ``SparkSubmitOperator`` renders as
#: template fields: read from the operator when the hook is built
RENDERED_HOOK_ARGUMENTS = tuple(
    name
    for name in inspect.signature(SparkSubmitHook).parameters
    if name in SparkSubmitOperator.template_fields
)
#: the other ones (but ``conn_id``): taken as they were given to the operator
GIVEN_HOOK_ARGUMENTS = tuple(
    name
    for name in inspect.signature(SparkSubmitHook).parameters
    if name not in SparkSubmitOperator.template_fields and name != "conn_id"
)


def child_environment(parent: Mapping[str, str], settings: Settings) -> dict[str, str]:
    """``parent`` without any ``OFFLOADER_*`` variable of the worker, plus ``settings``'
    (the driver must see exactly the connection's settings, as tasks do)."""
    env = {k: v for k, v in parent.items() if not k.startswith("OFFLOADER_")}
    return {**env, **settings.environment()}


def connection_deploy_mode(conn_id: str) -> str | None:
    """The deploy mode the Spark connection's extra asks for, read as ``SparkSubmitHook``
    reads it: None when the connection cannot be loaded (the hook then submits to yarn)."""
    try:
        extra = BaseHook.get_connection(conn_id).extra_dejson
    except AirflowException:
        return None
    mode = extra.get("deploy-mode")
    return mode if isinstance(mode, str) else None


class OffloaderSparkOperator(SparkSubmitOperator):
    """Submit an offloader Spark application (include/spark_jobs/) with the offloader
    connection's settings in the driver's environment.

    Subclasses check their params, then call :meth:`submit_app` with the params as JSON
    (no secret). The driver runs in client mode (its settings travel in its environment);
    the library goes to executors as a zip that the application adds with ``addPyFile``.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "offloader_conn_id",
        "aws_conn_id",
    )

    def __init__(
        self,
        *,
        application: str,
        conn_id: str = SparkSubmitHook.default_conn_name,
        offloader_conn_id: str = OffloaderHook.default_conn_name,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(application=application, conn_id=conn_id, **kwargs)
        self.spark_conn_id = conn_id
        self.offloader_conn_id = offloader_conn_id
        self.aws_conn_id = aws_conn_id
        #: the spark-submit options given that are not template fields (the rendered ones
        #: are the operator's attributes): ``SparkSubmitOperator`` keeps them private
        self.submit_options = {k: v for k, v in kwargs.items() if k in GIVEN_HOOK_ARGUMENTS}
        #: the hook of this task's spark-submit once it is built (``on_kill`` stops it)
        self.submit_hook: SparkSubmitHook | None = None

    @cached_property
    def offloader_hook(self) -> OffloaderHook:
        return OffloaderHook(self.offloader_conn_id, aws_conn_id=self.aws_conn_id)

    def portable_settings(self) -> Settings:
        """The settings the driver gets (:meth:`OffloaderHook.get_portable_settings`);
        ``env_vars`` is refused: it is rendered, stored, and a ``--conf`` on some masters."""
        if self.env_vars:
            raise ValueError("env_vars is not taken: the job's settings come from the connection")
        return self.offloader_hook.get_portable_settings()

    def make_submit_hook(self) -> SparkSubmitHook:
        """A hook for this task's spark-submit, built from the operator's arguments (the
        template fields as rendered) as ``SparkSubmitOperator`` builds its own."""
        rendered = {name: getattr(self, name) for name in RENDERED_HOOK_ARGUMENTS}
        return SparkSubmitHook(conn_id=self.spark_conn_id, **self.submit_options, **rendered)

    def deploy_mode(self) -> str | None:
        """The deploy mode spark-submit gets: the operator's ``deploy_mode``, else the
        connection's (the order ``SparkSubmitHook`` resolves them in)."""
        return self.submit_options.get("deploy_mode") or connection_deploy_mode(self.spark_conn_id)

    def on_kill(self) -> None:
        """Kill the spark-submit (the driver runs in it, client mode), if one was started."""
        if self.submit_hook is not None:
            self.submit_hook.on_kill()

    def submit_app(
        self, params_json: str, settings: Settings, *, want_result: bool = False
    ) -> dict[str, Any] | None:
        """spark-submit the application with ``params_json`` and the library zip as its
        arguments and ``settings`` in the driver's environment; raises if it fails. With
        ``want_result``, the JSON the driver wrote to the result file it was given (None
        if it wrote none)."""
        from offloader.bulk.shipping import library_zip

        with tempfile.TemporaryDirectory(prefix="offloader-spark-") as scratch:
            # the application ships it to executors (addPyFile): not --py-files, which
            # would shadow the driver's installed library with a zip
            self.application_args = [params_json, str(library_zip(Path(scratch)))]
            result = Path(scratch) / "result.json"
            if want_result:  # the driver runs here (client mode): a local file reaches it
                self.application_args.append(str(result))
            hook = self.make_submit_hook()
            if self.deploy_mode() == "cluster":
                raise ValueError(
                    f"connection {self.spark_conn_id!r} asks for deploy mode 'cluster': the "
                    "job's driver gets its settings from the submitting task's environment, "
                    "so it runs in client mode; set the extra deploy-mode to client"
                )
            self.submit_hook = hook
            # spark-submit's output pipe is left to the garbage collector: the hook reads it
            # to the end but does not close it, and offers no public way to
            hook.submit(self.application, env=child_environment(os.environ, settings))
            if not want_result or not result.exists():
                return None
            answer: dict[str, Any] = json.loads(result.read_text())
            return answer


class BulkExportOperator(LineageMixin, OffloaderSparkOperator):
    """Export offloaded entries as Parquet with include/spark_jobs/bulk_export.py.

    ``export_params`` (a dict of :class:`ExportParams` fields, e.g. the DAG's Params) is
    checked before anything is submitted. The export id defaults to the run's id, the output
    to ``exports/`` under the offloader's store. Returns the published manifest's summary
    (the params, in a dry run). OpenLineage: the stores the job read (the driver says which)
    into the export's folder.
    """

    template_fields: Sequence[str] = (*OffloaderSparkOperator.template_fields, "export_params")

    def __init__(
        self,
        *,
        export_params: dict[str, Any] | None = None,
        application: str = str(SPARK_JOBS / "bulk_export.py"),
        **kwargs: Any,
    ) -> None:
        super().__init__(application=application, **kwargs)
        self.export_params = export_params

    # the result is the task's XCom; the provider's SparkSubmitOperator.execute says -> None
    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        from offloader.bulk.export import published_manifest  # pyarrow: not at parse time
        from offloader.bulk.manifest import BulkExportResult

        self.moved = None
        params = ExportParams.parse(self.export_params or {})
        settings = self.portable_settings()
        params = params.with_defaults(context["run_id"], settings.resolved_object_store_url)
        assert params.output is not None and params.export_id is not None
        job = self.submit_app(params.model_dump_json(), settings, want_result=True)
        if params.dry_run:
            return {"dry_run": True, "params": params.model_dump(mode="json")}
        manifest = published_manifest(params.output, params.export_id, settings)
        if manifest is None:
            raise RuntimeError(f"the job ended but export {params.export_id} is not published")
        summary = BulkExportResult(manifest, params.output).to_json()
        self.moved = Moved(
            host=lineage_host(self.offloader_hook),
            read=(job or {}).get("sources", []),
            written=[f"{params.output.rstrip('/')}/{export_prefix(params.export_id)}"],
            rows=manifest.rows,
            size=manifest.bytes,
            files=len(manifest.files),
        )
        self.log.info("export published: %s", summary)
        return summary


class ScrubOperator(OffloaderSparkOperator):
    """Scrub offloaded objects with include/spark_jobs/scrub.py: executors read and check
    every block, the driver repairs from hot copies and writes the report.

    ``scrub_params`` (a dict of :class:`ScrubParams` fields, e.g. the DAG's Params) is
    checked before anything is submitted, the named topics against the metadata store too.
    The report defaults to ``scrub-reports/<run id>.json`` under the offloader's store. The
    task fails when the job leaves damage unrepaired (the driver's log, in the task's, says
    which ledgers and why). Returns the report's counts and verdicts (the params, in a dry
    run).
    """

    template_fields: Sequence[str] = (*OffloaderSparkOperator.template_fields, "scrub_params")

    def __init__(
        self,
        *,
        scrub_params: dict[str, Any] | None = None,
        application: str = str(SPARK_JOBS / "scrub.py"),
        **kwargs: Any,
    ) -> None:
        super().__init__(application=application, **kwargs)
        self.scrub_params = scrub_params

    # the result is the task's XCom; the provider's SparkSubmitOperator.execute says -> None
    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        from offloader.scrub.output import read_report_at

        params = ScrubParams.parse(self.scrub_params or {})
        settings = self.portable_settings()
        params = params.with_defaults(context["run_id"], settings.resolved_object_store_url)
        assert params.report is not None
        with self.offloader_hook.get_runtime() as runtime:
            check_topics(runtime.metadata, params.topics)  # an unknown one: nothing submitted
        self.submit_app(params.model_dump_json(), settings)
        if params.dry_run:
            return {"dry_run": True, "params": params.model_dump(mode="json")}
        report = read_report_at(params.report, settings)
        if report is None:
            raise RuntimeError(f"the job ended but wrote no report at {params.report}")
        summary = {
            "report": params.report,
            "counts": report["counts"],
            "failed": report["failed"],
            # a damaged segment's entry lists each ledger in it
            "damaged": {
                f"{v['topic']}/{x['ledger_id']}": x["action"]
                for v in report["damaged_ledgers"]
                for x in v.get("ledgers") or [v]
            },
        }
        self.log.info("scrub done: %s", summary)
        return summary


class BulkRewriteOperator(LineageMixin, OffloaderSparkOperator):
    """Compact small objects or migrate formats with include/spark_jobs/bulk_rewrite.py:
    the driver records every intent and swap, executors write the output segments' parts.

    ``rewrite_params`` (a dict of :class:`RewriteParams` fields, e.g. the DAG's Params) is
    checked before anything is submitted, the named topics against the metadata store too.
    The task fails when a group failed (after the others were done; the driver's log, in
    the task's, names it). Returns the report's totals and one line per group.
    OpenLineage: the stores the rewritten groups were read from into the one they were
    written to (nothing for a dry run, or a run that rewrote nothing).
    """

    template_fields: Sequence[str] = (*OffloaderSparkOperator.template_fields, "rewrite_params")

    def __init__(
        self,
        *,
        rewrite_params: dict[str, Any] | None = None,
        application: str = str(SPARK_JOBS / "bulk_rewrite.py"),
        **kwargs: Any,
    ) -> None:
        super().__init__(application=application, **kwargs)
        self.rewrite_params = rewrite_params

    # the result is the task's XCom; the provider's SparkSubmitOperator.execute says -> None
    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        self.moved = None
        params = RewriteParams.parse(self.rewrite_params or {})
        settings = self.portable_settings()
        with self.offloader_hook.get_runtime() as runtime:
            check_topics(runtime.metadata, params.topics)  # an unknown one: nothing submitted
        report = self.submit_app(params.model_dump_json(), settings, want_result=True)
        if report is None:
            raise RuntimeError("the rewrite job ended without a report")
        self.moved = Moved(
            host=lineage_host(self.offloader_hook),
            read=report.get("stores_read", []),
            written=report.get("stores_written", []),
        )
        summary = {
            "mode": report["mode"],
            "dry_run": report["dry_run"],
            "totals": report["totals"],
            "left": report["left"],
            "recovered": report["recovered"],
            "groups": [_group_line(g) for g in report["groups"]],
        }
        self.log.info("rewrite done: %s", summary)
        return summary


def _group_line(group: dict[str, Any]) -> str:
    ledgers = group["ledgers"]
    return f"{group['topic']} ledgers {ledgers[0]}..{ledgers[-1]}: {group['outcome']}"

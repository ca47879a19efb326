"""What every offloader Spark application's driver shares (include/spark_jobs/*.py).

    spark-submit APP.py '<params as JSON>' [offloader.zip [result.json]]

The driver builds its ``Settings()`` from the ``OFFLOADER_*`` environment that the
submitting task set (secrets never on a command line or in Spark's conf); executors get
only :meth:`Settings.for_object_stores` in their task closure. ``offloader.zip`` (the
library, offloader/bulk/shipping.py) is added for executors only, with ``addPyFile`` once
the driver has imported the library from its install: the driver needs the real package
(its schema check reads the migration scripts from disk), and ``--py-files`` would put the
zip first on the driver's path too. A bad parameter or setting ends the driver with one
clear line (no secret in it) and exit status 2, as the CLI does. ``result.json`` is a
path on the submitting machine (the driver runs there, in client mode) where an
application writes what the task returns.

Functions that run on executors must be the library's or defined in the application's
``__main__`` (pickled by value): this module is not shipped to executors.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from offloader.diagnostics import describe_error
from offloader.exceptions import OffloaderError
from offloader.settings import Settings

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger("offloader_app")


@dataclass(frozen=True)
class AppArgs:
    """The application's command line: the run's params (JSON), the library zip and where
    to write the result for the submitting task."""

    params_json: str
    library_zip: str | None
    result_file: str | None = None


Job = Callable[[AppArgs, Settings], int]


def main(name: str, job: Job) -> None:
    """Run ``job`` as the driver of application ``name`` and exit with its status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(run(name, sys.argv[1:], job))


def run(name: str, argv: Sequence[str], job: Job) -> int:
    """``job``'s exit status; 2 with one clear line for a bad command line, parameter or
    setting (the library's errors, ValueError, LookupError)."""
    if len(argv) not in (1, 2, 3):
        print(f"usage: {name}.py '<params as JSON>' [offloader.zip [result.json]]", file=sys.stderr)
        return 2
    settings: Settings | None = None
    try:
        settings = Settings()
        return job(AppArgs(*argv), settings)
    except (OffloaderError, ValueError, LookupError) as err:
        log.error("%s failed: %s", name, describe_error(err, settings))
        return 2


@contextmanager
def spark_context(app_name: str, library_zip: str | None) -> Iterator[SparkContext]:
    """A Spark session's context for the job, the library shipped to executors; stopped
    at the end."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(app_name).getOrCreate()
    try:
        if library_zip is not None:
            spark.sparkContext.addPyFile(library_zip)  # executors import this copy
        yield spark.sparkContext
    finally:
        spark.stop()


def spread(
    sc: SparkContext, items: Sequence[Any], work: Callable[[Iterable[Any]], Iterable[Any]]
) -> list[Any]:
    """``work`` over ``items``, one item a Spark task (partitions spread over executors);
    everything ``work`` returned, in the items' order."""
    return sc.parallelize(list(items), max(1, len(items))).mapPartitions(work).collect()

# syntax=docker/dockerfile:1
# One image for every Airflow component AND the Spark master/worker: the driver runs inside
# the Airflow scheduler (SparkSubmitOperator, client mode) and the executors on the Spark
# workers, so both sides must have the same Spark, the same Python and the same offloader
# library, byte for byte. Building one image is the simplest way to guarantee that.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Spark 4 needs Java 17+. The man directory must exist or the JRE's postinst fails on slim
# images. tini reaps the spark-submit/JVM children that tasks leave behind; procps gives
# `ps`, which Spark's and Airflow's scripts call. /opt/java: an architecture-independent
# JAVA_HOME (the JRE's own path contains amd64/arm64).
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
    && rm -rf /var/lib/apt/lists/* \
    && ln -sfn "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java
ENV JAVA_HOME=/opt/java

# A virtualenv at a fixed path, so SPARK_HOME below is known at build time.
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv

WORKDIR /opt/offloader

# Dependencies first, in their own layer: code changes do not re-download 500 MB.
# Same three steps as `make install`: the pinned set from constraints.txt; then drop
# pyspark-client (pulled by the spark provider, it shares the pyspark/ folder) and
# reinstall the full pyspark over it so spark-submit, spark-class and the jars exist.
COPY requirements.txt constraints.txt ./
RUN pip install -r requirements.txt -c constraints.txt \
    && pip uninstall -y pyspark-client \
    && pip install --force-reinstall --no-deps \
       "pyspark==$(sed -n 's/^pyspark==//p' requirements.txt)"

# Airflow 3 opens an async engine on its metadata database too, and for PostgreSQL derives
# the asyncpg driver from the URL: without asyncpg every `airflow` command dies at import.
# Fail the build with the reason instead of shipping an image that crash-loops airflow-init.
RUN python -c "import asyncpg" 2>/dev/null \
    || { echo "asyncpg is not installed: Airflow 3 on PostgreSQL needs it." \
              "Pin it in requirements.txt and constraints.txt." >&2; exit 1; }

# Spark's launch scripts find everything from SPARK_HOME: point it at the pyspark package.
# The RUN check fails the build if the path ever stops matching the installed pyspark.
ENV SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark
RUN python -c "import pathlib, pyspark, os; \
home = pathlib.Path(pyspark.__file__).parent; \
assert home == pathlib.Path(os.environ['SPARK_HOME']), home; \
assert (home / 'jars').is_dir(), 'full pyspark missing (pyspark-client only?)'; \
assert (home / 'bin' / 'spark-class').is_file(), 'spark-class missing'" \
    && spark-submit --version

# The project itself. Editable, so the read-only bind mounts of ./include in
# docker-compose.yaml (development) take effect without rebuilding; in production the
# copied files are used as they are.
COPY pyproject.toml ./
COPY include/ include/
COPY plugins/ plugins/
COPY dags/ dags/
RUN pip install --no-deps -e . \
    && python -c "import offloader"

# Non-root. GID 0 like the official Airflow image, so an arbitrary UID (OpenShift) still
# gets group write access. The directories are created here, owned by that user, because a
# fresh named volume copies the ownership of the image directory it is mounted over.
ARG AIRFLOW_UID=50000
RUN useradd --uid "${AIRFLOW_UID}" --gid 0 --home-dir /opt/airflow --create-home \
       --shell /bin/bash airflow \
    && mkdir -p /opt/airflow/logs /data/ledgers /opt/spark/work \
    && chown -R "${AIRFLOW_UID}:0" /opt/airflow /data /opt/spark \
    && chmod -R g+rwX /opt/airflow /data /opt/spark

ENV AIRFLOW_HOME=/opt/airflow \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/offloader/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/offloader/plugins \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    OFFLOADER_LEDGER_DIR=/data/ledgers \
    PYSPARK_PYTHON=python \
    PYSPARK_DRIVER_PYTHON=python \
    SPARK_WORKER_DIR=/opt/spark/work

USER ${AIRFLOW_UID}
WORKDIR /opt/airflow

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["airflow", "version"]

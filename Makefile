# One entry point for people and CI. `make test` builds .venv from nothing and runs the suite.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PYSPARK_VERSION := $(shell sed -n 's/^pyspark==//p' requirements.txt)
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install test test-long lint demo airflow bench constraints clean soak mutate mutate-smoke mutate-survivors mutate-unchecked mutate-docs \
	browser doc-screenshots

install: $(VENV)/.installed

# The spark provider pulls pyspark-client, which shares the pyspark/ folder with the full
# pyspark: drop it and reinstall the full pyspark so spark-submit and the jars are there.
$(VENV)/.installed: requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-dev.txt -c constraints.txt
	$(BIN)/pip uninstall -y -q pyspark-client
	$(BIN)/pip install -q --force-reinstall --no-deps pyspark==$(PYSPARK_VERSION)
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/python -c "import pyspark, offloader; from pathlib import Path; \
	  assert (Path(pyspark.__file__).parent / 'jars').is_dir(), 'full pyspark missing'"
	touch $@

# The short form (CI's): every case but the `long` ones, longer forms of cases it runs in
# another form (docs/TESTING.md). `make test-long` runs them all.
TEST_SELECT ?= not long
# Three workers on the 2-core machine: on two, the suite left a third of the CPU idle while
# it waited on child processes, servers and leases (docs/TESTING.md, "Suite time")
TEST_WORKERS ?= 3
test: install lint browser
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25 -m "$(TEST_SELECT)" $(PYTEST_ARGS)

test-long:
	$(MAKE) test TEST_SELECT="long or not long"

# mypy checks the files pyproject.toml's [tool.mypy] names (include/, plugins/), not strict.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check include tests benchmarks plugins dags scripts
	$(BIN)/mypy

# The main job on the embedded default: Airflow on SQLite, local files, the demo checks.
demo: install
	. scripts/demo_env.sh && $(BIN)/python scripts/demo.py

# The same settings behind the Airflow UI, on loopback only (http://127.0.0.1:8080, or
# AIRFLOW__API__PORT; `make demo` first). The login's password is in the file it names.
airflow: install
	. scripts/demo_env.sh && airflow db migrate >/dev/null \
	  && offloader db upgrade \
	  && airflow pools set offload_uploads 4 "bounded concurrent uploads" >/dev/null \
	  && $(BIN)/python scripts/airflow_login.py \
	  && exec airflow standalone

# Debian's chromium and its driver for the browser tests (tests/ui/), from apt, only when
# missing; sudo when not root. `make test` runs it first.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then exit 0; fi; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo "sudo -n" ); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q \
	  && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	       chromium chromium-driver

# Rerun the browser tests and copy the screenshots docs/OPERATIONS.md shows to docs/images/.
doc-screenshots: install browser
	$(BIN)/python -m pytest -p no:xdist tests/ui --update-doc-screenshots

bench: install
	$(BIN)/python -m benchmarks.run

# The chaos soak (docs/TESTING.md): SeaweedFS behind a fault-injecting proxy, PostgreSQL,
# kills and dropped connections, verified after every cycle. SOAK_SEED replays a run; the
# figures land in var/soak/<date>-seed<S>.json and .md.
SOAK_MINUTES ?= 60
soak: install
	$(BIN)/python scripts/soak.py --minutes $(SOAK_MINUTES) $(if $(SOAK_SEED),--seed $(SOAK_SEED))

# Mutation testing (docs/TESTING.md): slow, not in CI; verdicts kept in mutation/results.json
# (and var/mutation/full), so a rerun only tests what changed.
# MUTANTS="offloader.offload.planner.*" narrows it, MUTATE_CHILDREN sets the parallelism (the
# default 2 suits a shared 2-core machine).
MUTATE_CHILDREN ?= 2
mutate: install
	$(BIN)/python scripts/mutation_run.py $(if $(FRESH),--fresh) --max-children $(MUTATE_CHILDREN) $(MUTANTS)

# After adding tests: rerun only the mutants that survived (MUTANTS= narrows it by glob;
# UNCHECKED=1 adds the mutants without a verdict, in the same run).
mutate-survivors: install
	$(BIN)/python scripts/mutation_run.py --retest-survivors $(if $(UNCHECKED),--unchecked) \
	    --max-children $(MUTATE_CHILDREN) $(MUTANTS)

# Only the mutants without a kept verdict (MUTANTS= narrows it by glob): a long run in pieces.
mutate-unchecked: install
	$(BIN)/python scripts/mutation_run.py --unchecked --max-children $(MUTATE_CHILDREN) $(MUTANTS)

# The short run CI does before `make test`: proves the setup kills known mutants.
mutate-smoke: install
	$(BIN)/python scripts/mutation_run.py --smoke --max-children $(MUTATE_CHILDREN)

# docs/TESTING.md's score table and mutation/report.md (runs, survivors), from the kept verdicts.
mutate-docs: install
	$(BIN)/python scripts/mutation_report.py --write-docs

constraints:
	$(BIN)/pip freeze --exclude-editable | grep -v '^-e' > constraints.txt.new
	echo "pyspark-client==$$(sed -n 's/^pyspark-client==//p' constraints.txt)" >> constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .mypy_cache

# Local stack without Docker (same components as docker-compose.yaml, on 127.0.0.1, state
# under var/stack): see docs/DEPLOYMENT.md. `make stack STACK_EXECUTOR=celery STACK_WORKERS=2`
# runs the tasks on Celery workers (Redis on 127.0.0.1:6379 as the broker).
.PHONY: stack stack-down stack-status

stack: install
	scripts/stack.sh up

stack-down:
	scripts/stack.sh down

# Exit status 3 means "something is stopped": informative here, not a make failure.
stack-status:
	scripts/stack.sh status || true

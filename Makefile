# Two commands matter on a fresh machine: `make demo` and `make test`.
# Every target that needs Python packages creates .venv/ first when it is missing.

PYTHON ?= python3.11
# The pinned set to install: constraints.txt (the newest tested versions) or constraints-min.txt
# (the oldest supported: Airflow 3.1, Spark 3.5); `make setup CONSTRAINTS=constraints-min.txt`.
CONSTRAINTS ?= constraints.txt
VENV   ?= .venv
BIN    := $(VENV)/bin
# One stamp per constraints file: a venv built from another set is rebuilt from scratch (pip
# would leave the other set's extra packages behind, e.g. provider 6's pyspark-client over pyspark 3.5).
STAMP  := $(VENV)/.installed-$(notdir $(CONSTRAINTS))
# make test-compat: the end-to-end subset on the oldest supported set, in its own venv.
COMPAT_VENV ?= .venv-min
COMPAT_TESTS ?= \
  tests/unit/test_catalog_trigger.py \
  tests/unit/test_submit_operator.py \
  tests/unit/test_airflow_compat.py \
  tests/unit/test_ui_status.py::test_api_tables \
  tests/unit/test_ui_status.py::test_the_airflow_plugin_module \
  tests/integration/test_dag_integrity.py \
  tests/integration/test_compat_e2e.py
# Every target runs this checkout's own packages (plugins/iceberg_cdc, cdc_devtools), even when
# another checkout is installed in the venv.
export PYTHONPATH := $(CURDIR)/plugins:$(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH),)
# pytest-xdist workers: the Airflow/Spark end-to-end modules run beside the in-process tests. Two on two
# cores: three measured slower (38 min against 33-35), the JVM starts of the end-to-end modules collide.
TEST_WORKERS ?= 2
# Random histories per property test in make test-fast (make test runs 200; CDC_HISTORIES sets both).
FAST_HISTORIES ?= 20

.PHONY: help prereqs stack-prereqs stack-setup setup java-setup test-java test test-fast test-compat test-stack demo demo-engine sync status verify airflow airflow-stop stack stack-stop lint format bench bench-scale bench-tables wheel clean

help:
	@echo "make demo    the whole pipeline on a demo table: local S3, SQLite catalog, Airflow, Spark"
	@echo "             (WRITE_MODE=merge-on-read: the source written with position and equality deletes;"
	@echo "              WRITE_MODE=merge-on-read-v3: a format-v3 source whose MERGE writes deletion vectors)"
	@echo "make sync CONFIG=path.yaml   run each table's DAG until its sink has caught up (SNAPSHOTS=N: at most N runs per table)"
	@echo "make status CONFIG=path.yaml   each table's sink watermark against its source's current snapshot, and its mirrors'"
	@echo "make verify CONFIG=path.yaml   prove every mirror equals its source; repair drift (REPAIR=0: only report;"
	@echo "             TABLE=ns.t MIRROR=name: one mirror). Both run the iceberg-cdc command (docs/operating.md),"
	@echo "             whose exit code (0 done, 1 left, 2 error) make reports as 'Error 1' / 'Error 2'"
	@echo "make airflow Airflow on the demo config at http://127.0.0.1:8080 (PORT=...), with the CDC view"
	@echo "             (CONFIG=path.yaml: that config's tables instead, no demo servers)"
	@echo "make airflow-stop   stop the make airflow running in another shell (as Ctrl-C there would)"
	@echo "make stack   the production topology on this machine: PostgreSQL (Airflow DB and Iceberg catalog), Redis,"
	@echo "             CeleryExecutor with two Celery workers on hosts of their own, a Spark cluster with Spark Connect,"
	@echo "             the local S3 server; the demo table caught up at once (docs/stack.md; PORT=...: the UI's port)"
	@echo "make stack-stop   stop the make stack running in another shell, and whatever a failed one left"
	@echo "make test-stack   the stack's smoke test (minutes; not part of make test)"
	@echo "make demo-engine   only the shuffle engine, on one generated snapshot (seconds)"
	@echo "make test    install into .venv/ when missing, lint, run the test suite"
	@echo "make test-compat   the end-to-end subset on the oldest supported versions (constraints-min.txt), in .venv-min/"
	@echo "make test-fast   lint, unit tests and short property runs: no Spark, no Airflow DAG runs (minutes)"
	@echo "make bench   the pipeline vs a Spark-native job and the floor, memory, S3 requests (QUICK=1: short; SCHEDULER=0: no figures under the scheduler)"
	@echo "make bench-scale   a 50 M-row copy-on-write snapshot through the pipeline beside a 5 M one (ROWS=...: another size)"
	@echo "make bench-tables  100 and 1,000 configured tables: DAG parse, idle DAG processor, triggerer, commit to run start"
	@echo "             (BEFORE=ref: the tree at git ref beside this one; TABLES=\"100 1000\"; SCHEDULER=0: parse only)"
	@echo "make setup   create .venv/ with everything installed (idempotent; CONSTRAINTS=constraints-min.txt: the oldest supported set)"
	@echo "make wheel   dist/iceberg_cdc-<version>-py3-none-any.whl: the provider to pip install into Airflow"

prereqs:
	@command -v $(PYTHON) >/dev/null 2>&1 || { \
	  echo "error: $(PYTHON) not found. Install Python 3.11 (or run: make PYTHON=/path/to/python3.11 ...)."; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || { \
	  echo "error: $(PYTHON) is $$($(PYTHON) --version 2>&1); Python 3.11 is required."; exit 1; }
	@command -v java >/dev/null 2>&1 || { \
	  echo "error: java not found. Install Java 17 (e.g. apt-get install openjdk-17-jre-headless) for Spark."; exit 1; }
	@java -version 2>&1 | head -n 1 | grep -q '"17' || { \
	  echo "error: Spark here needs Java 17; found: $$(java -version 2>&1 | head -n 1)."; exit 1; }

# make stack's two Debian packages (neither is on PyPI): .ci/run installs them when it runs as root.
stack-prereqs: prereqs
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "error: redis-server not found: make stack's Celery broker. Install it: apt-get install redis-server"; exit 1; }
	@test -f /usr/share/java/postgresql.jar || { \
	  echo "error: /usr/share/java/postgresql.jar not found: Iceberg Java reaches make stack's catalog by JDBC."; \
	  echo "       Install it: apt-get install libpostgresql-jdbc-java"; exit 1; }

$(STAMP): requirements.txt requirements-dev.txt $(CONSTRAINTS) pyproject.toml
	@$(MAKE) --no-print-directory prereqs
	@test -f "$(CONSTRAINTS)" || { echo "error: constraints file $(CONSTRAINTS) not found"; exit 2; }
	@if ls $(VENV)/.installed-* >/dev/null 2>&1 && [ ! -e $@ ]; then \
	  echo "$(VENV) was built from another constraints file: rebuilding it from $(CONSTRAINTS)"; rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt -c $(CONSTRAINTS)
	$(BIN)/pip install --quiet --no-deps -e .
	@touch $@

setup: $(STAMP)

# make stack's extra packages (requirements-stack.txt), on top of the newest set.
STACK_STAMP := $(VENV)/.stack-packages
$(STACK_STAMP): requirements-stack.txt $(STAMP)
	$(BIN)/pip install --quiet -r requirements-stack.txt -c $(CONSTRAINTS)
	@touch $@

stack-setup: setup $(STACK_STAMP)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Apache Iceberg's Java implementation (Iceberg 1.10.2 on Spark 3.5.9, in .venv-java/) for the tests
# that judge the tables written here: make test sets it up; elsewhere than CI a machine without it
# skips those tests, naming why.
java-setup: setup
	$(BIN)/python -m cdc_devtools.iceberg_java setup

test-java: java-setup
	$(BIN)/python -m pytest -m java $(PYTEST_ARGS)

test: setup
	@$(MAKE) --no-print-directory prereqs
	@$(MAKE) --no-print-directory java-setup || { test -z "$$CI" || exit 1; \
	  echo "note: Iceberg Java is not set up here; the tests it judges will skip (make java-setup says why)"; }
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not stack" $(COMPAT_ONLY) $(PYTEST_ARGS)

# The oldest set's own end-to-end history: make test-compat runs it there; on the newest set the
# pipeline, mirror and sync end-to-end tests cover the same paths.
COMPAT_ONLY := --deselect tests/integration/test_compat_e2e.py

# The stack's tests (marker stack): make stack's whole topology, minutes each, so not in make test
# (CI's run is near its budget); run before changing what runs where (docs/stack.md).
test-stack: stack-setup stack-prereqs
	$(BIN)/python -m pytest -m stack tests/integration/test_stack.py $(PYTEST_ARGS)

# The oldest supported set (constraints-min.txt) in its own venv, and the end-to-end subset there:
# a copy-on-write and a merge-on-read snapshot through make sync, a mirror, the DAGs, the CDC view's API.
test-compat:
	@$(MAKE) --no-print-directory VENV=$(COMPAT_VENV) CONSTRAINTS=constraints-min.txt setup
	$(COMPAT_VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(COMPAT_TESTS) $(PYTEST_ARGS)

# The tests that need neither Spark nor Airflow DAG runs, and the property tests on fewer histories.
test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	CDC_HISTORIES=$${CDC_HISTORIES:-$(FAST_HISTORIES)} $(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not e2e" tests/unit tests/property $(PYTEST_ARGS)

demo: setup
	$(BIN)/python scripts/demo.py $(if $(WRITE_MODE),--write-mode $(WRITE_MODE),)

demo-engine: setup
	$(BIN)/python scripts/demo_engine.py

sync: setup
	@test -n "$(CONFIG)" || { echo "usage: make sync CONFIG=path/to/config.yaml"; exit 2; }
	$(BIN)/python -m cdc_devtools.sync --config "$(CONFIG)" --home "$(or $(AIRFLOW_HOME_DIR),.cdc/airflow)" \
	  $(if $(SNAPSHOTS),--snapshots $(SNAPSHOTS),)

# The iceberg-cdc command (iceberg_cdc/cli.py) as a module: a venv made before it was declared has no script.
# make's own exit code is 2 for any failure; the command's (1 drift left or pending, 2 error) is in
# make's "Error N" line.
CLI := $(BIN)/python -m iceberg_cdc.cli

status: setup
	@test -n "$(CONFIG)" || { echo "usage: make status CONFIG=path/to/config.yaml [TABLE=ns.t]"; exit 2; }
	$(CLI) status --config "$(CONFIG)" $(if $(TABLE),--table "$(TABLE)",)

verify: setup
	@test -n "$(CONFIG)" || { echo "usage: make verify CONFIG=path/to/config.yaml [REPAIR=0] [TABLE=ns.t] [MIRROR=name]"; exit 2; }
	$(CLI) verify --config "$(CONFIG)" $(if $(filter 0,$(REPAIR)),--no-repair,) \
	  $(if $(TABLE),--table "$(TABLE)",) $(if $(MIRROR),--mirror "$(MIRROR)",)

airflow: setup
	$(BIN)/python scripts/airflow_ui.py $(if $(PORT),--port $(PORT),) $(if $(CONFIG),--config "$(CONFIG)",)

# The running make airflow's pid is in .cdc/airflow-ui.pid; SIGTERM takes its Ctrl-C path.
airflow-stop:
	$(BIN)/python scripts/airflow_ui.py --stop

# The production topology on this machine until Ctrl-C (scripts/stack.py; docs/stack.md); its pid is
# in .cdc/stack/stack.pid, and make stack-stop stops it (and, by pid, what a failed start left).
stack: stack-setup stack-prereqs
	$(BIN)/python scripts/stack.py $(if $(PORT),--port $(PORT),)

stack-stop:
	$(BIN)/python scripts/stack.py --stop

# The peer (Iceberg's create_changelog_view) runs on Iceberg Java: java-setup builds it once.
bench: java-setup
	@$(MAKE) --no-print-directory prereqs
	$(BIN)/python bench/run.py $(if $(QUICK),--quick,) $(if $(filter 0,$(SCHEDULER)),--no-scheduler,)

bench-scale: setup
	@$(MAKE) --no-print-directory prereqs
	$(BIN)/python bench/scale.py $(if $(ROWS),--rows $(ROWS),)

# What N configured tables cost Airflow (bench/tables.py): about 25 minutes for N = 100 and 1000.
bench-tables: setup
	$(BIN)/python bench/tables.py --tables $(or $(TABLES),100 1000) $(if $(BEFORE),--before $(BEFORE),) \
	  $(if $(filter 0,$(SCHEDULER)),--no-scheduler,)

# The provider distribution: iceberg_cdc only, dependencies from requirements.txt (docs/operating.md).
wheel: setup
	rm -rf build dist/iceberg_cdc-*.whl
	$(BIN)/python -m pip wheel --no-deps --quiet -w dist .
	@ls dist/iceberg_cdc-*.whl

clean:
	rm -rf $(VENV) $(COMPAT_VENV) .pytest_cache .ruff_cache .hypothesis build dist

# The two commands of the README, and the pieces they are made of.
#   make demo   set up, then run the main job on the embedded default lake and print a summary
#   make test   set up, then run the test suite (what .ci/run calls)
#   make lint   ruff: lint (pyflakes, pycodestyle, isort, pyupgrade, bugbear) and the format check (.ci/run, before the tests)
#   make format ruff: sort the imports and format the tree in place
#   make ui     start the Dagster UI on http://127.0.0.1:3000
#   make ui-test  the UI in headless Chromium (several minutes; skipped by `make test`)
#   make cluster-test  the lakehouse on a Spark standalone cluster on loopback (several minutes; skipped by `make test`)
#   make reliability-test  the multi-process crash and concurrency scenarios (minutes; skipped by `make test`)
#   make s3-test  the lakehouse on an S3 server on loopback (minutes; skipped by `make test`)
#   make deploy-test  Dagster as deployed: a code server, the daemon and the webserver as processes (minutes; skipped by `make test`)
#   make extended-test  the extended tier: properties `make test` proves more cheaply, again on slower paths (skipped by `make test`)
#   make long-test  every long target above, one after the other, then which passed and which failed
#   make test-pythons  on Python 3.12 and 3.13 (make test-py312, make test-py313): the demo and a fast subset (.ci/run)

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DAGSTER_HOME := $(CURDIR)/.dagster_home
export DAGSTER_HOME

.PHONY: setup postgres-setup s3-setup demo test lint format ui ui-test cluster-test reliability-test s3-test deploy-test long-test bench clean-lake \
	test-pythons test-py312 test-py313

# A virtual environment with the pinned packages, Delta's jars from Maven Central, our log stores
# (delta-jars/logstore, built by Maven), and the class archive the Spark driver's JVM starts from
# (runtime/jvm_startup.py: a small demo, about a minute). Then the project's own bytecode, which the
# editable install does not write: without it a process under PYTHONDONTWRITEBYTECODE (or a read-only
# tree) compiles every module it imports, most of a `databuild-assets query` call (docs/decisions/0057).
LOGSTORE_JAR = delta-jars/lib/databuild-logstore-1.jar
setup: $(VENV)/.installed delta-jars/lib/.fetched $(LOGSTORE_JAR) delta-jars/lib/spark-classes.jsa $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m compileall -q databuild_assets

# The tests of Dagster's instance storage in PostgreSQL start a private server of their own
# (databuild_assets_tests/postgres_server.py) from Debian's postgresql package: installed here
# with apt-get when no initdb is found. The package's own cluster is not used.
postgres-setup:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || { \
	  echo "installing Debian's postgresql for the tests of instance storage in PostgreSQL"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q postgresql; }

# uv installs the pinned set (3 to 3.5 times pip's speed: docs/decisions/0050-python-3-11-to-3-13.md);
# pip installs uv itself, at the version [test] pins, and builds the one wheel below.
UV_PIN = $(shell grep -o '"uv==[^"]*"' pyproject.toml | tr -d '"')
# pyspark is published only as a source archive, which uv builds again (and keeps again) for each
# venv when the index answers its revalidation as modified. So pip builds the wheel once into WHEELS
# (pip's own wheel cache serves the next clone) and uv installs it from there (decision 0050).
PYSPARK_PIN = $(shell grep -o '"pyspark\[sql\]==[^"]*"' pyproject.toml | tr -d '"' | sed 's/\[sql\]//')
WHEELS := .wheels
# $(call uv_install,VENV_DIR): uv (from the main venv) installing into the venv at VENV_DIR.
# --compile-bytecode: the bytecode is written once here, not left to each process, which cannot write
# it under PYTHONDONTWRITEBYTECODE or a read-only venv (a container's): importing dagster, pyspark.sql
# and pandas took 6.3 s without it, 2.5 s with it, for ~20 s more at set-up.
uv_install = VIRTUAL_ENV=$(CURDIR)/$(1) $(BIN)/uv pip install --quiet --compile-bytecode --find-links $(WHEELS) --python $(1)/bin/python
# Its own target, so that a clone set up before it gets the wheel too.
$(WHEELS)/.built: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip wheel --quiet --disable-pip-version-check --no-deps "$(PYSPARK_PIN)" --wheel-dir $(WHEELS)
	touch $@

$(VENV)/.installed: pyproject.toml $(WHEELS)/.built
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "$(UV_PIN)"
	$(call uv_install,$(VENV)) -e ".[test]"
	touch $@

delta-jars/lib/.fetched: delta-jars/pom.xml $(VENV)/.installed
	$(BIN)/python -m databuild_assets.runtime.delta_jars fetch
	touch $@

# After the fetch, which empties delta-jars/lib of older jars.
$(LOGSTORE_JAR): delta-jars/lib/.fetched delta-jars/logstore/pom.xml $(wildcard delta-jars/logstore/src/main/java/io/databuild/delta/*.java)
	$(BIN)/python -m databuild_assets.runtime.delta_jars build-logstore

delta-jars/lib/spark-classes.jsa: delta-jars/lib/.fetched $(LOGSTORE_JAR)
	$(BIN)/python -m databuild_assets.runtime.jvm_startup create

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

demo: setup
	$(BIN)/databuild-assets demo

# `dg check defs` first: the definitions load through Dagster's project tooling ([tool.dg] in pyproject.toml).
# Then the suite, which prints its 25 slowest steps (to tell a slow test from a slow machine) and the
# line coverage of databuild_assets ([tool.coverage.*] in pyproject.toml).
# TEST_WORKERS: pytest-xdist worker processes, each with its own JVM (CI has 2 cores); 0 runs in one process.
TEST_WORKERS ?= 2
test: setup postgres-setup
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/dg check defs
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25 --cov --cov-report=term

# The other supported interpreters (requires-python): the suite runs whole on $(PYTHON) (make test);
# on each of these, in a venv of its own (.venv-3.12, .venv-3.13) installed by uv (pinned in [test]:
# a venv in seconds from a warm cache, where pip takes minutes; docs/decisions/0050-python-3-11-to-3-13.md),
# a small demo (Spark, Dagster's main job, Spark's Python workers on that interpreter) and the quick
# tests of PYTHON_FAST_TESTS (a materialization on Spark is the demo's, so none of them repeats one).
# The interpreter: python3.X on PATH, else pyenv's newest 3.X.
PYTHON_FAST_TESTS := \
	databuild_assets_tests/test_docs.py \
	databuild_assets_tests/test_cli_input.py \
	databuild_assets_tests/test_workload.py \
	databuild_assets_tests/test_jvm_free_log.py::test_an_append_is_read_at_once_by_the_same_log_and_by_a_log_in_another_process \
	databuild_assets_tests/test_jvm_free_log.py::test_a_read_with_a_staleness_bound_may_lag_other_writers_but_never_its_own_appends \
	databuild_assets_tests/test_serving_index.py::test_an_open_reuses_the_index_and_applies_only_the_commits_after_its_stamp \
	databuild_assets_tests/test_serving_index.py::test_a_torn_or_foreign_index_file_is_rebuilt_never_read
PYTHON_DEMO_EVENTS ?= 5000
python_312 := 3.12
python_313 := 3.13

test-pythons: test-py312 test-py313

test-py312: .venv-3.12/.installed
test-py313: .venv-3.13/.installed
test-py312 test-py313: test-py%: setup
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; mkdir "$$tmp/home"; cp dagster.yaml "$$tmp/home/"; \
	echo "Python $(python_$*): the demo ($(PYTHON_DEMO_EVENTS) events) on a lake of its own"; \
	DAGSTER_HOME="$$tmp/home" DATABUILD_LAKE_ROOT="$$tmp/lake" .venv-$(python_$*)/bin/databuild-assets demo --events $(PYTHON_DEMO_EVENTS)
	.venv-$(python_$*)/bin/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile $(PYTHON_FAST_TESTS)

.venv-%/.installed: pyproject.toml $(VENV)/.installed $(WHEELS)/.built
	@py=; for candidate in $$(command -v python$* 2>/dev/null) $$(ls -d $$HOME/.pyenv/versions/$*.*/bin/python$* 2>/dev/null | sort -rV); do \
	  if "$$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, "$*".split("."))))' 2>/dev/null; then py=$$candidate; break; fi; done; \
	if [ -z "$$py" ]; then \
	  echo "no Python $* found (python$* on PATH, or pyenv's $$HOME/.pyenv/versions/$*.*): install it (apt-get install python$* python$*-venv, or pyenv install $*)" >&2; exit 1; fi; \
	echo "Python $*: $$py"; rm -rf .venv-$*; "$$py" -m venv .venv-$*
	$(call uv_install,.venv-$*) -e ".[test]"
	touch $@

# Settings in [tool.ruff] (pyproject.toml). `make format` fixes what the formatter and the import sorter can.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --select I --fix .
	$(BIN)/ruff format .

ui: setup
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# dagster dev on a free loopback port, driven by Playwright in Debian's chromium (installed here
# with apt-get when missing; Playwright never downloads a browser). Screenshots: .ui-screenshots/
# Lakes on S3: hadoop-aws and the AWS SDK modules S3A uses (delta-jars/s3/pom.xml), and moto for the
# tests' S3 server on loopback. Not part of `make setup`: a local lake needs none of it. Our log store
# that commits with S3's conditional writes is in delta-jars/logstore, built by `make setup`.
s3-setup: setup delta-jars/s3/lib/.fetched $(VENV)/.s3-test-installed

delta-jars/s3/lib/.fetched: delta-jars/s3/pom.xml $(VENV)/.installed
	$(BIN)/python -m databuild_assets.runtime.delta_jars fetch-s3
	touch $@

$(VENV)/.s3-test-installed: pyproject.toml $(VENV)/.installed
	$(call uv_install,$(VENV)) -e ".[test,s3-test]"
	touch $@

s3-test: s3-setup
	DATABUILD_S3_TEST=1 $(BIN)/python -m pytest -m s3 databuild_assets_tests/test_object_store.py

reliability-test: setup
	DATABUILD_SLOW_TESTS=1 $(BIN)/python -m pytest -m slow databuild_assets_tests/test_reliability.py

ui-test: setup $(VENV)/.ui-test-installed
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the UI test"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }
	DATABUILD_UI_TEST=1 $(BIN)/python -m pytest -m ui databuild_assets_tests/test_ui.py

$(VENV)/.ui-test-installed: pyproject.toml $(VENV)/.installed
	$(call uv_install,$(VENV)) -e ".[test,ui-test]"
	touch $@

# A Spark standalone master and worker started from pyspark's jars on free loopback ports; the
# same ingestion, projections and compaction as local mode must give the same tables (docs/cluster.md).
cluster-test: setup
	DATABUILD_CLUSTER_TEST=1 $(BIN)/python -m pytest -m cluster -s databuild_assets_tests/test_spark_cluster.py

# Dagster in its production shape (docs/deployment.md): `dagster code-server start`, `dagster-daemon
# run` and `dagster-webserver` as processes of their own on loopback, workspace.yaml pointing at the
# code server; a landing file, a sensor's refresh, an erasure through the run queue and a scheduled
# compaction, checked in the lake.
deploy-test: setup postgres-setup
	DATABUILD_DEPLOY_TEST=1 $(BIN)/python -m pytest -m deploy -s databuild_assets_tests/test_deployment.py

# The tests marked `extended` (the Spark backend's shared cases, erasures through whole Dagster runs
# that `make test` proves on a cheaper path): out of CI's 30 minutes (docs/decisions/0033-test-suite.md).
extended-test: setup postgres-setup
	DATABUILD_EXTENDED_TESTS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m extended

# Run before calling an issue resolved that touches what they cover (the UI, a cluster, S3, crashes,
# the deployment's processes). Each runs even when one before it failed, so one run shows every drift.
LONG_TARGETS := ui-test cluster-test s3-test reliability-test deploy-test extended-test
long-test:
	@failed=""; for target in $(LONG_TARGETS); do $(MAKE) --no-print-directory $$target || failed="$$failed $$target"; done; \
	if [ -n "$$failed" ]; then echo "long targets failed:$$failed"; exit 1; fi; echo "long targets passed: $(LONG_TARGETS)"

bench: setup
	$(BIN)/python -m bench.ingest

# Removes the embedded lake (tables and landing files); the next `make demo` starts afresh.
clean-lake:
	rm -rf .lake

# iqkit: everything a fresh machine needs is done here (CI runs `make test`).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

LINTED := iqkit pyspark_iqkit tests bench notebooks/nbsetup.py notebooks/execute.py notebooks/conftest.py
# The notebooks run under strict nbval: every cell's outputs must equal the stored ones,
# after notebooks/nbval_sanitize.cfg; their kernels get IQKIT_STABLE_TIMINGS=1, which shows
# iqkit's wall-clock figures as a placeholder (notebooks/conftest.py, README "Notebooks").
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg
# Where `make demo` writes its stores and `make lab` reads them.
DEMO_ROOT ?= demo-stores
# Everything the tests write goes under one scratch folder of the clone, removed after a
# passing run, never /tmp: Python's tempfile and pytest's tmp_path (TMPDIR), the Spark
# driver JVM's java.io.tmpdir, which is also Spark's default local dir (SPARK_SUBMIT_OPTS
# reaches the JVM spark-submit starts), and no JVM perf data (/tmp/hsperfdata_<user>) from
# that JVM or spark-submit's launcher JVM (SPARK_LAUNCHER_OPTS), and no reader's cache in
# the user's home (IQKIT_CACHE: where readers of chain stores build their databases).
TEST_TMP := $(CURDIR)/.test-tmp
# Hadoop's S3A connector, for the tests where Spark itself writes to the test S3 server
# (a checkpoint on s3a://): from PyPI, as Maven Central cannot be reached (s3a_jars.py).
S3A_JARS := $(CURDIR)/$(VENV)/s3a-jars
# The tests' JVMs compile with C1 only, no C2: their Spark jobs are small and short, so
# C2's background compiling is CPU the run never gets back (a Spark session's start and a
# count took 22.7 CPU-s with it, 39.4 without; a module of checkpoint tests 46 CPU-s, not
# 89). Speed only: no flag here changes what a JVM computes. Tests that start a JVM with an
# environment of their own add it from IQKIT_TEST_JVM_FLAGS (tests/helpers.py).
TEST_JVM_FLAGS := -XX:TieredStopAtLevel=1
# And they map Spark's classes from one class data sharing archive, which a short Spark
# run dumps first (tests/spark/jvm_archive.py): a session's start and first jobs took
# 21.6 CPU-s without it, 12.9 with it. A JVM whose class path differs from the archive's
# loads its classes as before; -Xlog:...=off keeps it from saying so on stdout, which
# spark-class reads its launcher's command from.
JVM_ARCHIVE := $(TEST_TMP)/spark-classes.jsa
CDS_QUIET := -Xlog:cds=off,cds+dynamic=off
ARCHIVED_JVM_FLAGS := $(TEST_JVM_FLAGS) -XX:SharedArchiveFile=$(JVM_ARCHIVE) $(CDS_QUIET)
# $(call test_env,FOLDER[,JVM FLAGS]): the environment of a run whose scratch is FOLDER:
# the archive's training run and the tests each get a folder of their own under TEST_TMP.
test_env = TMPDIR=$(1) SPARK_SUBMIT_OPTS="-Djava.io.tmpdir=$(1) -XX:-UsePerfData $(or $(2),$(ARCHIVED_JVM_FLAGS))" \
           SPARK_LAUNCHER_OPTS="-XX:-UsePerfData $(TEST_JVM_FLAGS)" \
           IQKIT_TEST_JVM_FLAGS="$(or $(2),$(ARCHIVED_JVM_FLAGS))" \
           IQKIT_CACHE=$(1)/iqkit-cache IQKIT_TEST_S3A_JARS=$(S3A_JARS)
# The browser test drives Debian's chromium (Playwright's own browser download cannot
# work on a machine without network).
CHROMIUM ?= /usr/bin/chromium
# pytest-xdist processes for tests/ and the notebooks, in one run: each takes whole files
# (--dist loadfile, so a module's fixtures stay in one process; the local-cluster files
# count as one), in collection order (--no-loadscope-reorder: xdist 3.8 otherwise hands
# out the files with most tests first, which put the README, demo and cluster files, few
# tests but minutes each, at the run's tail; tests/conftest.py collects them first, then
# the notebooks, a kernel each) and starts its own Spark session when it needs one.
# Two keep both cores busy; a third process, or a second pytest run beside this one, only
# made CPU-starved tests (interrupts, timeouts) fail (docs/DECISIONS.md "Install,
# dependencies and CI"). TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2

.PHONY: test demo lab bench reliability lint check-java check-chromium install clean notebooks

test: $(STAMP) check-java check-chromium
	$(PY) -m ruff check $(LINTED)
	$(PY) tests/spark/s3a_jars.py $(S3A_JARS)
	rm -rf $(TEST_TMP) && mkdir -p $(TEST_TMP)/tests $(TEST_TMP)/archive
	$(call test_env,$(TEST_TMP)/archive,$(TEST_JVM_FLAGS) -XX:ArchiveClassesAtExit=$(JVM_ARCHIVE) $(CDS_QUIET)) \
	    $(PY) tests/spark/jvm_archive.py $(TEST_TMP)/archive > $(TEST_TMP)/archive.log 2>&1 \
	    || { cat $(TEST_TMP)/archive.log; exit 1; }
	$(call test_env,$(TEST_TMP)/tests) IQKIT_CHROMIUM=$(CHROMIUM) $(PY) -m pytest -q -p no:cacheprovider \
	    $(NBVAL) -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 tests notebooks
	rm -rf $(TEST_TMP)

# Re-run every notebook top to bottom and store its outputs in place (what `make test`
# compares against); `make notebooks NB=notebooks/03_streaming_positions_lag.ipynb` runs one.
notebooks: $(STAMP) check-java
	$(PY) notebooks/execute.py $(NB)

demo: $(STAMP) check-java
	$(PY) -m iqkit demo --root $(DEMO_ROOT)

# JupyterLab (the `lab` extra, installed with the rest) on notebooks/, with the demo's
# stores as IQKIT_ROOT (made first when missing). The venv's kernel is registered inside
# the venv (--sys-prefix), never in the user's own Jupyter folders. Jupyter refuses to run
# as root without --allow-root (containers, CI machines). LAB_ARGS: more options, e.g.
# LAB_ARGS="--no-browser --port=8890".
lab: $(STAMP)
	@[ -d $(DEMO_ROOT) ] || $(MAKE) --no-print-directory demo DEMO_ROOT=$(DEMO_ROOT)
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (iqkit)"
	IQKIT_ROOT=$(abspath $(DEMO_ROOT)) $(VENV)/bin/jupyter lab --ServerApp.root_dir=notebooks \
	  $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

bench: $(STAMP)
	$(PY) bench/bench_core.py
	$(PY) bench/bench_magic.py
	$(PY) bench/bench_render.py
	$(PY) bench/bench_sql.py
	$(PY) bench/bench_object_store.py
	$(PY) bench/bench_partitions.py
	$(PY) bench/bench_explore.py
	$(PY) bench/bench_keyquery.py
	$(PY) bench/bench_scale.py

# Every reliability probe's long variant; rewrites the table in RELIABILITY.md.
reliability: $(STAMP)
	$(PY) tests/reliability/run.py

lint: $(STAMP)
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "iqkit needs Python 3.11+, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)

# uv installs what pip would (the same pins, the same plain-path editable install of the
# setuptools backend), with downloads in parallel: a fresh venv in under half of pip's CPU
# time (96 CPU-s, not 206) spread over the cores: minutes off CI. No bytecode compiling up
# front (pip's default; uv's --compile-bytecode took 26 s of a 66 s install): Python
# compiles the modules a process imports, once, into __pycache__. The venv's own pip only
# installs uv (upgrading pip itself took 4 s more).
# --system-certs: the system's CA bundle, as pip uses it (a proxy's CA on some machines).
UV_VERSION := 0.13.9
$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install --quiet --python $(PY) --system-certs -e '.[dev,lab]'
	touch $(STAMP)

# Java 17+ for PySpark: installed from Debian's packages when missing and we are root
# (a fresh CI machine), otherwise one line saying what to install.
check-java:
	@if ! command -v java >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	   echo "Installing Java 17 (openjdk-17-jre-headless) for PySpark..."; \
	   apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	 fi
	@command -v java >/dev/null 2>&1 || { echo "Java 17+ is required for PySpark: install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; conda: conda env create -f environment.yml) and put java on PATH."; exit 1; }
	@v=$$(java -XX:-UsePerfData -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	 if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then echo "Java 17+ is required for PySpark, found: $$(java -version 2>&1 | head -1). Install openjdk 17 (apt-get install openjdk-17-jre-headless, or conda env create -f environment.yml)."; exit 1; fi

# Chromium for the browser test: Debian's package when missing and we are root (a fresh CI
# machine), otherwise one line saying what to install. Never a silent skip.
check-chromium:
	@if [ ! -x "$(CHROMIUM)" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	   echo "Installing Chromium (Debian's chromium package) for the browser test..."; \
	   apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 chromium >/dev/null; \
	 fi
	@[ -x "$(CHROMIUM)" ] || { echo "The browser test needs Chromium at $(CHROMIUM): install it (Debian/Ubuntu: apt-get install chromium) or run make test CHROMIUM=/path/to/chromium."; exit 1; }

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

# iqkit: everything a fresh machine needs is done here (CI runs `make test`).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

LINTED := iqkit pyspark_iqkit tests bench notebooks/nbsetup.py notebooks/execute.py
# The notebooks run under strict nbval: every cell's outputs must equal the stored ones,
# after notebooks/nbval_sanitize.cfg; IQKIT_STABLE_TIMINGS=1 shows iqkit's wall-clock
# figures as a placeholder (README "Notebooks").
NBVAL  := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg

.PHONY: test demo bench lint check-java install clean notebooks

test: $(STAMP) check-java
	$(PY) -m ruff check $(LINTED)
	$(PY) -m pytest -q -p no:cacheprovider tests
	IQKIT_STABLE_TIMINGS=1 $(PY) -m pytest -q -p no:cacheprovider $(NBVAL) notebooks

# Re-run every notebook top to bottom and store its outputs in place (what `make test`
# compares against); `make notebooks NB=notebooks/03_streaming_positions_lag.ipynb` runs one.
notebooks: $(STAMP) check-java
	$(PY) notebooks/execute.py $(NB)

demo: $(STAMP) check-java
	$(PY) -m iqkit demo

bench: $(STAMP)
	$(PY) bench/bench_core.py
	$(PY) bench/bench_magic.py
	$(PY) bench/bench_render.py
	$(PY) bench/bench_sql.py

lint: $(STAMP)
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "iqkit needs Python 3.11+, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --config-settings editable_mode=compat -e '.[dev]'
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

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

# iqkit: everything a fresh machine needs is done here (CI runs `make test`).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo bench reliability lint check-java install clean

test: $(STAMP) check-java
	$(PY) -m ruff check iqkit tests bench
	$(PY) -m pytest -q -p no:cacheprovider tests notebooks --nbval-lax --nbval-current-env

demo: $(STAMP) check-java
	$(PY) -m iqkit demo

bench: $(STAMP)
	$(PY) bench/bench_core.py
	$(PY) bench/bench_magic.py
	$(PY) bench/bench_render.py
	$(PY) bench/bench_sql.py

# Every reliability probe's long variant; rewrites the table in RELIABILITY.md.
reliability: $(STAMP)
	$(PY) tests/reliability/run.py

lint: $(STAMP)
	$(PY) -m ruff check iqkit tests bench
	$(PY) -m ruff format --check iqkit tests bench

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "iqkit needs Python 3.11+, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { echo "Java 17+ is required for PySpark: install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; conda: conda env create -f environment.yml) and put java on PATH."; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	 if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then echo "Java 17+ is required for PySpark, found: $$(java -version 2>&1 | head -1). Install openjdk 17 (apt-get install openjdk-17-jre-headless, or conda env create -f environment.yml)."; exit 1; fi

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

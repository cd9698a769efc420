# Every target builds .venv from scratch when it is missing or pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint docs dist bench perf-docs proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# setuptools prints a notice about editable installs on every build; nothing to act on.
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	scripts/ensure-java
	$(VENV)/bin/memwal demo
	$(VENV)/bin/memwal demo --spark

test: lint docs
	scripts/ensure-java
	$(PY) -m pytest -q -ra

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# The concept pages and the API reference (mkdocstrings), into build/site. --strict turns every
# warning (a broken link, a docstring the handler cannot read) into a failure; NO_MKDOCS_2_WARNING
# silences mkdocs-material's notice about MkDocs 2, which is nothing to act on here.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# An sdist and a wheel into dist/ (the version is memwal_sql.__version__). The wheel is built from
# the sdist, so a file the sdist leaves out fails here rather than on a user's machine.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not s3"

bench: $(STAMP)
	$(PY) benchmarks/bench_write.py
	$(PY) benchmarks/bench_wal_put.py
	$(PY) benchmarks/bench_read.py
	$(PY) benchmarks/bench_lookup.py
	$(PY) benchmarks/bench_maintenance.py
	$(PY) benchmarks/bench_search.py
	$(PY) benchmarks/bench_scale.py --scale 2m
	$(PY) benchmarks/bench_wal_tail.py
	$(PY) benchmarks/bench_cache.py
	$(PY) benchmarks/bench_inputs.py
	$(PY) benchmarks/bench_tpch.py
	$(PY) benchmarks/bench_memory.py
	$(PY) benchmarks/bench_spark.py
	$(MAKE) perf-docs

# docs/performance.md from whatever JSON the benchmarks left in benchmarks/results/.
perf-docs: $(STAMP)
	$(PY) benchmarks/report.py benchmarks/results docs/performance.md

proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=memwal_sql/_proto --pyi_out=memwal_sql/_proto proto/memwal.proto

clean:
	rm -rf $(VENV) build dist *.egg-info

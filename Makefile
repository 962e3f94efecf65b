# Quick start: `make demo` and `make test` each create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
BENCH_ARGS ?=
JOBS ?= 2
# Each test module runs in one worker (its module fixtures build once), in the order tests/conftest.py sorts them.
DIST := --dist loadfile --no-loadscope-reorder

.PHONY: venv demo test test-jax test-tensorflow test-torch bench clean

venv: $(STAMP)

# uv installs the 8 GB of dependencies in parallel, byte-compiled (about 45 s against pip's 110 s on
# 2 cores); pip takes over where uv cannot install. Folders of local wheels that pip is configured
# with on this kind of machine are passed on to uv, which does not read pip's configuration.
LOCAL_WHEELS := $(foreach d,$(wildcard /opt/pypi/files /opt/pypi-more/files),--find-links $(d))

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv
	$(VENV)/bin/uv pip install --quiet --python $(PY) --compile-bytecode $(LOCAL_WHEELS) -e ".[dev]" \
	  || $(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# The demo runs on JAX, the fastest backend for it on CPU, unless KERAS_BACKEND says otherwise.
demo: venv
	KERAS_BACKEND=$${KERAS_BACKEND:-jax} $(PY) -m keras_vit.demo

test: venv
	$(MAKE) test-jax test-tensorflow test-torch

test-jax: venv
	KERAS_BACKEND=jax $(PY) -m pytest -n $(JOBS) $(DIST) $(PYTEST_ARGS)

test-tensorflow: venv
	KERAS_BACKEND=tensorflow $(PY) -m pytest -n $(JOBS) $(DIST) $(PYTEST_ARGS)

test-torch: venv
	KERAS_BACKEND=torch $(PY) -m pytest -n $(JOBS) $(DIST) -m "not slow or parity" $(PYTEST_ARGS)

bench: venv
	$(PY) -m pip install --quiet --no-deps "keras-hub>=0.18"  # its tensorflow-text pin would pull a second TensorFlow (benchmarks/README.md)
	$(PY) benchmarks/benchmark.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

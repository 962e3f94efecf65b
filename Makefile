# Quick start: `make demo` and `make test` each create .venv when it is missing.
# The venv's Python: python3.11 (what the project is tested with) when it is on the PATH, else
# python3; `make venv PYTHON=python3.12` chooses another (the package needs 3.10 or later).
PYTHON ?= $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
PYTEST_ARGS ?=
BENCH_ARGS ?=
JOBS ?= 2
# Each test module runs in one worker (its module fixtures build once), in the order tests/conftest.py sorts them.
DIST := --dist loadfile --no-loadscope-reorder

.PHONY: venv venv-test demo test test-jax test-tensorflow test-torch bench clean

venv: $(STAMP)

venv-test: $(TEST_STAMP)

# uv installs the 8 GB of dependencies in parallel, byte-compiled (about 45 s against pip's 110 s on
# 2 cores); pip takes over where uv cannot install. uv reads neither pip's configuration files nor
# PIP_* variables, so the package sources pip is configured with (`pip config list`: find-links,
# index URLs, constraints) are handed to uv through its own variables, each unless UV_* already sets
# it; with pip's extra index URLs, uv considers every index as pip does (unsafe-best-match). With no
# pip configuration, uv gets nothing and uses PyPI, as pip does.
define PIP_SOURCES_FOR_UV
import ast, os, shlex, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
rank, found = {"global": 0, "install": 1, ":env:": 2}, {}
for line in listed.splitlines():
    key, sep, value = line.partition("=")
    scope, _, name = key.rpartition(".")
    if sep and scope in rank and rank[scope] >= found.get(name, (-1, ""))[0]:
        found[name] = (rank[scope], ast.literal_eval(value))
uv = {"find-links": ("UV_FIND_LINKS", ","), "index-url": ("UV_INDEX_URL", " "),
      "extra-index-url": ("UV_EXTRA_INDEX_URL", " "), "constraint": ("UV_CONSTRAINT", " ")}
handed = {variable: separator.join(found[name][1].split()) for name, (variable, separator) in uv.items()
          if name in found and variable not in os.environ}
if "UV_EXTRA_INDEX_URL" in handed and "UV_INDEX_STRATEGY" not in os.environ:
    handed["UV_INDEX_STRATEGY"] = "unsafe-best-match"
for variable, value in handed.items():
    print(f"export {variable}={shlex.quote(value)}")
print("make venv: uv gets from pip's configuration:", " ".join(handed) or "nothing", file=sys.stderr)
endef
export PIP_SOURCES_FOR_UV

# $(STAMP): the runtime install (the package and what it imports: keras, JAX, TensorFlow, tf.data, ...);
# $(TEST_STAMP): the same .venv plus the test extra (torch, timm, transformers, optax, the export runtimes).
$(STAMP): pyproject.toml
	@echo "make venv: $(VENV) with $(PYTHON) ($$($(PYTHON) --version 2>&1))"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv
	$(call INSTALL,.)
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(call INSTALL,.[test])
	touch $(TEST_STAMP)

define INSTALL
	eval "$$($(PY) -c "$$PIP_SOURCES_FOR_UV")"; \
	  $(VENV)/bin/uv pip install --quiet --python $(PY) --compile-bytecode -e "$(1)" \
	  || $(PY) -m pip install --quiet -e "$(1)"
endef

# The demo runs on JAX, the fastest backend for it on CPU, unless KERAS_BACKEND says otherwise.
demo: venv
	KERAS_BACKEND=$${KERAS_BACKEND:-jax} $(PY) -m keras_vit.demo

test: venv-test
	$(MAKE) test-jax test-tensorflow test-torch

test-jax: venv-test
	KERAS_BACKEND=jax $(PY) -m pytest -n $(JOBS) $(DIST) $(PYTEST_ARGS)

test-tensorflow: venv-test
	KERAS_BACKEND=tensorflow $(PY) -m pytest -n $(JOBS) $(DIST) $(PYTEST_ARGS)

test-torch: venv-test
	KERAS_BACKEND=torch $(PY) -m pytest -n $(JOBS) $(DIST) -m "not slow or parity" $(PYTEST_ARGS)

bench: venv-test
	$(PY) -m pip install --quiet --no-deps "keras-hub>=0.18"  # its tensorflow-text pin would pull a second TensorFlow (benchmarks/README.md)
	$(PY) benchmarks/benchmark.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

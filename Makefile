# The README's two commands are `make demo` and `make test`; .ci/run calls `make test`.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# Reinstall only when what decides the environment changed (a no-op `make test` starts
# testing at once instead of spending ~40 s in pip).
STAMP := $(VENV)/.ckptkit-installed
# Two pytest workers, one test module each at a time (module-scoped fixtures such as the
# warmed zygotes and the shared tiny-LM runs are built once): most tests wait on their own
# subprocesses or on I/O, so two workers keep both cores busy. XDIST= runs in one process.
XDIST ?= -n 2 --dist loadfile
# The suite starts hundreds of Python processes (drills, torchrun ranks, framework scripts):
# let them cache bytecode. With PYTHONDONTWRITEBYTECODE set (as on our CI machines) a fresh
# clone never got a .pyc, so every process compiled ckptkit from source (about 2.4 s of CPU
# each) and each pytest worker re-rewrote every test module at collection (40 s instead of 12).
# __pycache__/ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test check lint bench clean crash-matrix

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[test,plot,interop]'
	touch $(STAMP)

setup: $(STAMP)

# Main job on the bundled default: a resume drill of the bundled tiny LM (no downloads).
demo: setup
	$(BIN)/ckptkit drill --config drills/tiny_lm.toml --json out/drill.json --junit out/drill.xml --plot out/drill.png

# ruff, mypy, then the whole suite (slow tests included) and every docstring example.
test: setup
	$(BIN)/ruff check ckptkit tests benchmarks tools
	$(BIN)/mypy ckptkit
	$(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST) --durations=20 --doctest-modules tests ckptkit

# The fast lane for development (a few minutes): lint, the in-process tests of every layer,
# the CLI tests, docstring examples, the documented blocks, and one case of each heavy area
# (tests/conftest.py SMOKE; the rest of the `integration`-marked tests run in make test).
check: setup
	$(BIN)/ruff check ckptkit tests benchmarks tools
	$(BIN)/mypy ckptkit
	$(BIN)/python -m pytest -q -p no:cacheprovider --doctest-modules -m "not slow and not integration" tests ckptkit
	$(BIN)/python -m pytest -q -p no:cacheprovider -m smoke tests

# The crash matrix alone (make test runs it too): every framework x store x kill point of a
# save, each restart compared bitwise with an uninterrupted run (docs/testing.md).
crash-matrix: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 tests/integrations/test_crash_matrix.py

lint: setup
	$(BIN)/ruff check ckptkit tests benchmarks tools
	$(BIN)/mypy ckptkit

bench: setup
	$(BIN)/python benchmarks/io_bench.py

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache .mypy_cache

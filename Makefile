# The README's two commands are `make demo` and `make test`; .ci/run calls `make test`.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: setup demo test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)

setup: $(BIN)/python
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[test,plot,interop]'

# Main job on the bundled default: a resume drill of the bundled tiny LM (no downloads).
demo: setup
	$(BIN)/ckptkit drill --config drills/tiny_lm.toml --json out/drill.json --junit out/drill.xml --plot out/drill.png

test: setup
	$(BIN)/ruff check ckptkit tests benchmarks
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

lint: setup
	$(BIN)/ruff check ckptkit tests benchmarks
	$(BIN)/mypy ckptkit

bench: setup
	$(BIN)/python benchmarks/io_bench.py

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache .mypy_cache

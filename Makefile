# Two commands from a fresh clone: `make run` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0

.PHONY: install run test test-slow lint format clean docs docs-serve docs-reference

$(BIN)/popgrpo: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_CPU)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/popgrpo

run: install
	$(BIN)/popgrpo train

# The suite less its tests marked heavy or slow, which `test-slow` runs; CI (.ci/run) runs both,
# `test-slow` less SLOW_EXCLUDE (below).
# docs/reference/tests.md says what each runs and why. TEST_WORKERS pytest-xdist processes share
# `test` and the heavy tests module by module (a module's fixtures stay in one worker), and the
# slow tests test by test; the slow tests marked solo (deadlines another test's load would
# disturb) run last, one at a time.
TEST_WORKERS ?= 2
# CI passes SLOW_EXCLUDE="and not full_length and not benchmark_run": the guides' full-length
# training runs and the benchmark scripts' end-to-end runs stay out of its 90 minutes
# (docs/reference/tests.md).
SLOW_EXCLUDE ?=
test: install
	$(BIN)/python -m pytest -q --durations=30 -m "not slow and not heavy" -n $(TEST_WORKERS) --dist loadscope

test-slow: install
	$(BIN)/python -m pytest -q --durations=30 -m "heavy and not slow" -n $(TEST_WORKERS) --dist loadscope
	$(BIN)/python -m pytest -q --durations=30 -m "slow and not solo $(SLOW_EXCLUDE)" -n $(TEST_WORKERS) --dist load --timeout 1800
	$(BIN)/python -m pytest -q --durations=30 -m "slow and solo"

# ruff, then the type checker (basedpyright, configured in pyproject.toml: strict on popgrpo/core and popgrpo/algorithms).
lint: install
	$(BIN)/ruff check popgrpo tests benchmarks
	$(BIN)/ruff format --check popgrpo tests benchmarks
	$(BIN)/basedpyright

format: install
	$(BIN)/ruff format popgrpo tests benchmarks
	$(BIN)/ruff check --fix popgrpo tests benchmarks

# The documentation site (mkdocs.yml): built strict, so a broken link or reference fails.
# NO_MKDOCS_2_WARNING silences the Material theme's banner about MkDocs 2.0, which is not a warning about the site.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8000

# Rewrite the generated tables of docs/reference/ (config fields, live metrics) from the code, and
# docs/RESULTS.md's table of verdicts from docs/results/{paper,collapse}/verdicts.json.
docs-reference: install
	$(BIN)/python docs/gen_reference.py

clean:
	rm -rf $(VENV) runs site .pytest_cache

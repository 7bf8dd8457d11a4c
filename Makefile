# Two commands from a fresh clone: `make run` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0

.PHONY: install run test lint format clean

$(BIN)/popgrpo: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_CPU)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/popgrpo

run: install
	$(BIN)/popgrpo train

test: install
	$(BIN)/python -m pytest -q --durations=15

lint: install
	$(BIN)/ruff check popgrpo tests benchmarks
	$(BIN)/ruff format --check popgrpo tests benchmarks

format: install
	$(BIN)/ruff format popgrpo tests benchmarks
	$(BIN)/ruff check --fix popgrpo tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache

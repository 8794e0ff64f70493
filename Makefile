# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each creates or refreshes .venv with pip (skipped when pyproject.toml has not changed), then runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-stamp
BIN := $(VENV)/bin

# Ray binds to loopback only, no auth on the local test cluster, no usage reporting (NOTES.md).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# The default job: a tiny Qwen3-architecture model built locally, warm-started on expert demonstrations,
# then RL on frozenlake (gen_prefill pool) and math (gen_decode pool, scored by the serverless reward
# service) with α = 1. A few minutes on a 2-core CPU; the run directory is printed at the end.
demo: install
	$(BIN)/rollart train run_dir=runs/demo-$$(date +%Y%m%d-%H%M%S)

test: install
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -ra tests

clean:
	rm -rf $(VENV) .pytest_cache runs

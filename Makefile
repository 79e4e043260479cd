# Reproducible set-up and checks for the topk package. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Statistical and property tests are seeded; `make test PYTEST_ARGS="-m 'not slow'"` skips the long ones.
PYTEST_ARGS ?=
# A checkout of github oval-group/smooth-topk outside this project, for `make bench` (optional).
REFERENCE ?=

.DEFAULT_GOAL := help
.PHONY: help venv test bench clean

help: ## List the targets
	@grep -E '^[a-z][a-zA-Z_-]*:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

venv: $(STAMP) ## Create .venv with the pinned stack (requirements.txt) and topk in editable mode

test: $(STAMP) ## Run the test suite (the paper's propositions as tests) on 2 processes
	TOPK_REQUIRE_OPTIONAL=1 HYPOTHESIS_PROFILE=ci $(PY) -m pytest -n 2 -p no:cacheprovider topk/tests data_prep/tests experiments/tests $(PYTEST_ARGS)

bench: $(STAMP) ## Loss benchmarks vs pytopk, the smoothed hinge's reference (REFERENCE=path) and CE (CSV in benchmarks/results/)
	$(PY) benchmarks/bench_noised_losses.py
	$(PY) benchmarks/bench_smooth_hinge.py $(if $(REFERENCE),--reference $(REFERENCE))

clean: ## Remove the virtual environment and caches
	rm -rf $(VENV) build .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

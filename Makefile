# Reproducible set-up and checks for the topk package. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
# PY=python3 (or any interpreter) on the command line uses that interpreter's packages instead of creating .venv: for
# machines that already have their stack (a GPU cluster's module or container). It is checked for every module needed.
ifeq ($(origin PY),command line)
STAMP := check-python
else
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
endif
MODULES := torch torchvision numpy numba scipy pandas matplotlib seaborn jupyterlab papermill nbconvert nbformat ipykernel \
	pytest xdist hypothesis pytopk tqdm PIL latex2mathml
# Without submitit (in requirements.txt), EXECUTOR=slurm submits the plain sbatch scripts with sbatch: PY= only notes it.
OPTIONAL_MODULES := submitit
# Statistical and property tests are seeded; `make test PYTEST_ARGS="-m 'not slow'"` skips the long ones.
PYTEST_ARGS ?=
# A checkout of github oval-group/smooth-topk outside this project, for `make bench` (optional).
REFERENCE ?=
# The notebooks: PROFILE=smoke|quick|gpu|paper, DATA=root of the real datasets (paper), DEVICE=cpu|cuda, THREADS=torch CPU
# threads per notebook (0: torch's default; use THREADS=1 with make -j2).
PROFILE ?= quick
DATA ?=
DEVICE ?= cpu
THREADS ?= 0
# WORKERS=N processes read image-folder datasets (default: the machine's cores); COMPILE=default|reduce-overhead|...
# compiles the training step with torch.compile (default: eager on a CPU; on CUDA reduce-overhead, CUDA graphs: one
# DenseNet-40-40 run trained several times the images/s of `default` on an H200: docs/reproducing.md#runs-side-by-side-on-one-gpu).
WORKERS ?=
COMPILE ?= $(if $(filter cuda%,$(DEVICE)),reduce-overhead)
# EXECUTOR=inline|local|slurm trains every run of the profile before the notebooks, which then read them from the store
# (empty: each notebook trains its own runs, one after another). JOBS=N worker processes (local), PER_GPU=M runs on
# each visible GPU (local), DEVICE=cuda SLURM="--partition gpu --gpus-per-task 1 --time-min 600 ..." (slurm: `python -m
# experiments train --help` lists the options). The default is local: with DEVICE=cpu one worker per core this
# process may use, at most 8, the threads split between them (measured on 2 cores: sooner, the same verdicts; the
# same records bit for bit where the processor sums alike at both thread counts); with DEVICE=cuda one run on each visible GPU (with CUDA graphs more runs on a GPU gain only under NVIDIA's
# MPS: start its daemon, then PER_GPU=4; docs/reproducing.md#runs-side-by-side-on-one-gpu); with another DEVICE
# (cuda:1, say) none.
EXECUTOR ?= $(if $(filter cpu cuda,$(DEVICE)),local)
# STACK=S trains runs that share their data, model and optimiser settings S at a time stacked into one model
# (grouped layers: one step of S runs launches one run's kernels; experiments/engine/stacked.py); default 1, each run
# alone: stacks measured slower than lone runs on an H200 (docs/reproducing.md#runs-stacked-into-one-model).
STACK ?= 1
JOBS ?= $(shell $(PYTHON) -c 'import os; print(min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))')
# PER_GPU: on any CUDA device (cuda, cuda:N) one run a GPU unless given; JOBS is then not used
PER_GPU ?= $(if $(filter cuda%,$(DEVICE)),1)
SLURM ?=
TRAIN := PYTHONPATH=$(CURDIR) $(PY) -m experiments train $(PROFILE) --executor $(or $(EXECUTOR),inline) --device $(DEVICE) \
	$(if $(filter local,$(EXECUTOR)),$(if $(PER_GPU),--per-gpu $(PER_GPU),--jobs $(JOBS))) $(if $(DATA),--data-root $(abspath $(DATA))) \
	$(if $(WORKERS),--workers $(WORKERS)) $(if $(COMPILE),--compile $(COMPILE)) $(if $(filter-out 0,$(THREADS)),--threads $(THREADS)) \
	$(if $(filter-out 1,$(STACK)),--stack $(STACK)) $(if $(filter-out 0,$(UNCALIBRATED)),--uncalibrated) $(if $(filter slurm,$(EXECUTOR)),$(SLURM))
NOTEBOOKS := $(basename $(notdir $(wildcard notebooks/*.ipynb)))
EXECUTED := $(patsubst %,build/$(PROFILE)/%.ipynb,$(NOTEBOOKS))
SOURCES := $(filter-out %/tests/%,$(wildcard topk/*.py topk/*/*.py data_prep/*.py experiments/*.py experiments/*/*.py)) $(wildcard experiments/calibrated/*.json)
PAPERMILL := PYTHONPATH=$(CURDIR) $(PY) -m experiments.publishing.papermill_ipc --log-level WARNING --no-progress-bar -k python3 --cwd $(CURDIR) \
	-p profile $(PROFILE) -p device $(DEVICE) -p threads $(THREADS) $(if $(DATA),-p data_root $(abspath $(DATA))) \
	$(if $(WORKERS),-p workers $(WORKERS)) $(if $(COMPILE),-p compile_mode $(COMPILE))

.DEFAULT_GOAL := help
.PHONY: help venv test plan train forget-executor publish-quick-report bench bench-gpu profile-time readme kernel-resources calibrate paper-figures notebooks report check-report lab clean \
	clean-results

help: ## List the targets
	@grep -E '^[a-z][a-zA-Z_-]*:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-20s %s\n", $$1, $$2}'

ifeq ($(origin PY),command line)
$(STAMP):
	@$(PY) -c "import importlib.util as u, sys; lacks = lambda names: [m for m in names.split() if u.find_spec(m) is None]; \
	(missing := lacks(sys.argv[1])) and sys.exit(f'$(PY) lacks {missing}: install them (pip install -r requirements.txt) or leave out PY='); \
	(optional := lacks(sys.argv[2])) and print(f'note: $(PY) lacks {optional}: EXECUTOR=slurm submits the plain scripts with sbatch')" \
	"$(MODULES)" "$(OPTIONAL_MODULES)"
.PHONY: check-python
else
$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -c "import topk._cpu_kernel as kernel; kernel.precompile()"  # Numba's machine code, cached beside the source
	touch $(STAMP)
endif

venv: $(STAMP) ## Create .venv with the pinned stack (requirements.txt) and topk in editable mode

test: $(STAMP) ## Run the test suite (the paper's propositions as tests) on 2 processes, the library's also as without Triton
	@# Two workers on two cores, one torch thread each (OMP_NUM_THREADS, inherited by the processes tests start): more
	@# threads than cores slow every test down. Work stealing keeps both workers busy to the end. The library's tests
	@# as on PyTorch's CPU-only wheels (no Triton) are one test of the suite: topk/tests/test_without_triton.py.
	OMP_NUM_THREADS=1 TOPK_REQUIRE_OPTIONAL=1 HYPOTHESIS_PROFILE=ci $(PY) -m pytest -n 2 --dist worksteal -p no:cacheprovider \
		topk/tests data_prep/tests experiments/tests benchmarks/tests $(PYTEST_ARGS)

bench: $(STAMP) ## Loss benchmarks vs pytopk, the smoothed hinge's reference (REFERENCE=path) and CE (CSV in benchmarks/results/)
	$(PY) -m benchmarks.bench_noised_losses
	$(PY) -m benchmarks.bench_smooth_hinge $(if $(REFERENCE),--reference $(REFERENCE))
	$(MAKE) --no-print-directory readme

readme: | $(STAMP) ## Regenerate the README's and docs' numbers from the committed results (figures/quick, benchmarks/results)
	PYTHONPATH=$(CURDIR) $(PY) -m experiments.publishing.readme

profile-time: $(STAMP) ## Estimate a stand-in profile's hours on this machine [PROFILE=quick|gpu DEVICE=cpu|cuda THREADS=n]
	$(PY) -m benchmarks.bench_profile_time $(PROFILE) --device $(DEVICE) --threads $(THREADS) $(if $(COMPILE),--compile $(COMPILE))

bench-gpu: $(STAMP) ## On a CUDA machine: the fused kernel's grid and Fig. 3 in GPU seconds (CSV in benchmarks/results/)
	$(PY) -m benchmarks.bench_fused_kernel --device cuda
	$(PY) -m benchmarks.bench_epoch_time --device cuda

kernel-resources: $(STAMP) ## Compile the Triton kernels for sm_90a (no GPU needed) and print their registers and spills
	env -u TRITON_INTERPRET $(PY) -m benchmarks.kernel_resources --arch 90 --check

plan: | $(STAMP) ## List every run of PROFILE, the notebooks that read it and what the store holds of it [STACK=s: the groups; GPUS=n: the hours on n GPUs]
	PYTHONPATH=$(CURDIR) $(PY) -m experiments plan $(PROFILE) $(if $(filter-out 1,$(STACK)),--stack $(STACK)) $(if $(GPUS),--gpus $(GPUS))

train: $(STAMP) ## Train every missing run of PROFILE through EXECUTOR (default: local with DEVICE=cpu or cuda, else inline) [JOBS=n PER_GPU=m STACK=s SLURM="..." UNCALIBRATED=1]
	$(TRAIN)

forget-executor: ## Remove the executor's manifest of PROFILE (its notebooks train their own runs)
	rm -f figures/$(PROFILE)/manifests/executor.json

calibrate: $(STAMP) ## Fit the stand-ins' difficulty to the paper's CE numbers and choose each loss's learning rate, until CE's agree (experiments/calibrated/; no-op when current and made by today's training code; each search move's runs, and the stand-ins' searches, side by side with EXECUTOR=local or slurm)
	PYTHONPATH=$(CURDIR) $(PY) -m experiments.scale.calibrate $(PROFILE) --device $(DEVICE) $(if $(COMPILE),--compile $(COMPILE)) \
		$(if $(filter local,$(EXECUTOR)),$(if $(PER_GPU),--per-gpu $(PER_GPU),--jobs $(JOBS))) \
		$(if $(filter slurm,$(EXECUTOR)),--executor slurm $(SLURM))

paper-figures: $(STAMP) ## Calibrate the stand-ins and their learning rates, [train every run through EXECUTOR,] run every notebook [PROFILE=quick|smoke|gpu|paper DATA=path DEVICE=cuda WORKERS=n COMPILE=mode EXECUTOR=local JOBS=n STACK=s PY=python3], render build/report/index.html
	@status=0; $(MAKE) --no-print-directory calibrate || { status=$$?; echo "paper-figures: the calibration did not" \
		"finish, so nothing trains on uncalibrated stand-ins (any step it finished is kept: make calibrate goes on" \
		"from it)"; exit $$status; }; \
	if [ "$(EXECUTOR)" = slurm ] && [ -n "$(findstring --sbatch-only,$(SLURM))" ]; then \
		$(MAKE) --no-print-directory train || exit $$?; echo "paper-figures: --sbatch-only wrote the scripts and" \
		"submitted nothing: submit them with sbatch (above); once their tasks have ended, the same command without" \
		"--sbatch-only runs the notebooks on their runs"; exit 0; fi; \
	$(MAKE) --no-print-directory $(if $(EXECUTOR),train,forget-executor) || status=$$?; \
	$(MAKE) --no-print-directory -k notebooks || status=$$?; \
	$(MAKE) --no-print-directory report; \
	if [ "$(PROFILE)" = quick ]; then $(MAKE) --no-print-directory publish-quick-report readme; fi; \
	if [ $$status -ne 0 ]; then echo "paper-figures: a step failed (see above and the report)"; fi; exit $$status

publish-quick-report: ## Copy the quick profile's rendered report into figures/quick/report/ (committed)
	rm -rf figures/quick/report && mkdir -p figures/quick/report && cp build/report/*.html figures/quick/report/

notebooks: $(EXECUTED) ## Run PROFILE's notebooks that are out of date, reading the store (a missing run trained in them)

build/$(PROFILE)/%.ipynb: notebooks/%.ipynb $(SOURCES) | $(STAMP)
	@mkdir -p $(@D)
	@rm -f $@ build/$(PROFILE)/$*.failed.ipynb
	@echo "notebook $* ($(PROFILE) profile) ..."
	@start=$$(date +%s); \
	if $(PAPERMILL) $< build/$(PROFILE)/.$*.running.ipynb; then \
		mv build/$(PROFILE)/.$*.running.ipynb $@; echo "notebook $* done in $$(( $$(date +%s) - start )) s"; \
	else \
		mv build/$(PROFILE)/.$*.running.ipynb build/$(PROFILE)/$*.failed.ipynb; \
		echo "FAILED: notebook $* (executed copy: build/$(PROFILE)/$*.failed.ipynb)"; exit 1; \
	fi

report: | $(STAMP) ## Re-render build/report/index.html from the executed notebooks of PROFILE (once every notebook ran, remove the outputs none writes any more)
	PYTHONPATH=$(CURDIR) $(PY) -m experiments.publishing.report --profile $(PROFILE)

check-report: | $(STAMP) ## Fail unless every notebook of PROFILE ran and wrote its outputs; screenshot the report (chromium) and fail if a page scrolls sideways at 1300 px
	PYTHONPATH=$(CURDIR) $(PY) -m experiments.publishing.report --profile $(PROFILE) --check
	chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
		--disable-component-update --disable-sync --user-data-dir=$$(mktemp -d) --window-size=1200,1600 \
		--screenshot=$(CURDIR)/build/report/screenshot.png file://$(CURDIR)/build/report/index.html 2>/dev/null
	PYTHONPATH=$(CURDIR) $(PY) -m experiments.publishing.report --check-screenshot build/report/screenshot.png

lab: $(STAMP) ## Open the notebooks in JupyterLab
	PYTHONPATH=$(CURDIR) $(PY) -m jupyter lab notebooks

clean: ## Remove the virtual environment, executed notebooks, the report, caches and the outputs of profiles but quick (committed)
	rm -rf $(VENV) build .pytest_cache .hypothesis
	find figures -mindepth 1 -maxdepth 1 -type d ! -name quick -exec rm -rf {} +
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-results: ## Remove PROFILE's results store (its trained runs: the next paper-figures retrains them); other profiles' stay
	$(if $(strip $(PROFILE)),rm -rf results/$(strip $(PROFILE)),$(error clean-results: PROFILE is empty; name the profile whose store goes))

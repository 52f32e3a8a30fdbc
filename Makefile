# Two entry points for a fresh machine (see README.md):
#   make smoke   render the template with its defaults and train the offline smoke config on 2 processes
#   make test    run the template's tests, including each generated project's own tests

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The venv's tools (python, shellcheck, cookiecutter) first, also for the scripts the tests start.
export PATH := $(CURDIR)/$(BIN):$(PATH)
SMOKE_DIR ?= build/smoke
# The index pip takes torch from: the PyTorch CPU index where nvidia-smi is absent (on Linux
# the default index serves the multi-GB CUDA build), else the default index.
# TORCH_INDEX_URL= (empty) forces the default index; a URL forces that index.
TORCH_INDEX_URL ?= $(if $(shell command -v nvidia-smi),,https://download.pytorch.org/whl/cpu)
# The torch pin, kept in requirements-dev.txt only.
TORCH_REQUIREMENT := $(shell grep -E '^torch[=<>~ ]' requirements-dev.txt)
# The exact versions renders ship (tests/template/tested_versions.py): the template's tests run on them.
# CONSTRAINTS= (empty) installs the newest versions the ranges allow, as `make lock` does.
CONSTRAINTS ?= {{cookiecutter.project_slug}}/constraints.txt

.PHONY: smoke test test-fast lint lock bench clean

$(BIN)/.installed: requirements-dev.txt $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX_URL),--index-url "$(TORCH_INDEX_URL)") "$(TORCH_REQUIREMENT)"
	@# Every render's pins at once: constraints.txt without its Jinja lines (each package is in one block).
	$(if $(CONSTRAINTS),grep -v '^{%' "$(CONSTRAINTS)" > $(VENV)/constraints.txt)
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt $(if $(CONSTRAINTS),--constraint $(VENV)/constraints.txt)
	touch $@

smoke: $(BIN)/.installed
	rm -rf $(SMOKE_DIR)
	$(BIN)/cookiecutter --no-input . -o $(SMOKE_DIR)
	cd $(SMOKE_DIR)/text-classifier && PYTHONPATH=src python -m text_classifier.smoke
	cd $(SMOKE_DIR)/text-classifier && NPROC_PER_NODE=2 scripts/train_single_node.sh configs/smoke.yaml --disable_tqdm true
	cat $(SMOKE_DIR)/text-classifier/outputs/smoke/metrics.json

# The template's own tests on 2 pytest-xdist workers (each module, or test class, on one: a class of
# tests/template/test_fault_matrix.py shares one render's runs), then the renders' own suites on 2 workers:
# the two suite renders one after the other on one of them (each starts a SLURM cluster, and one at a time
# fits on this host; tests/conftest.py groups them), the rest on whichever worker is free.
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadscope tests -m "not rendered_suite"
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=25 tests -m rendered_suite

test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest -n 2 --dist loadscope tests -m "not rendered_suite"

lint: $(BIN)/.installed
	$(BIN)/ruff check hooks tests bench

# Move the versions renders ship to the newest their ranges allow: a fresh .venv without the constraints,
# then constraints.txt written from it. `make test` then tests exactly those versions.
lock:
	rm -rf $(VENV)
	$(MAKE) $(BIN)/.installed CONSTRAINTS=
	$(BIN)/python tests/template/tested_versions.py --write
	touch $(BIN)/.installed  # it holds exactly the versions just written

# Both loops against the seed guide's loop and the compute limit, one workload side by side: under
# 10 minutes on 2 CPU cores, not part of `make test`. Markdown on stdout, JSON in bench/results/.
# BENCH_ARGS passes options (e.g. BENCH_ARGS="--repeats 5"). bench/length_grouping.py,
# bench/compare_loops.py and bench/gpu_check.sh run on their own.
BENCH_ARGS ?=
bench: $(BIN)/.installed
	$(BIN)/python bench/benchmark.py $(BENCH_ARGS)

clean:
	rm -rf build $(VENV)

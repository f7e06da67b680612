# attnbench: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUITE ?= quick
WORKERS ?=
TASK ?=
VARIANT ?=
TRIALS ?= 20
# Local data: ../shared/data when it is there (offline machines), else $ATTNBENCH_DATA, else download.
SHARED_DATA := $(abspath ../shared/data)
ifeq ($(origin ATTNBENCH_DATA), undefined)
ATTNBENCH_DATA := $(if $(wildcard $(SHARED_DATA)/planetoid),$(SHARED_DATA),)
endif
export ATTNBENCH_DATA

.DEFAULT_GOAL := help
.PHONY: help install browser postgres slurm bench paper-gat perf startup gpu-smoke gpu-perf gpu-cost scaling probe tune leaderboard test test-slow mutation clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  variables: SUITE=$(SUITE) WORKERS=<n> ATTNBENCH_DATA=$(ATTNBENCH_DATA)"

install: $(VENV)/.installed ## create .venv and install attnbench with its dev extra

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

bench: install ## run SUITE (default: quick) and write leaderboards/SUITE.{md,csv}
	$(BIN)/attnbench bench --suite $(SUITE) $(if $(WORKERS),--workers $(WORKERS))

paper-gat: install ## the GAT paper's setup and training, 20 seeds (slow: hours on a 2-core CPU)
	$(BIN)/attnbench bench --suite paper-gat $(if $(WORKERS),--workers $(WORKERS))

perf: install ## forward+backward time of every variant relative to softmax, dense and on Cora
	$(BIN)/attnbench perf

startup: install ## how fast --help, --version, list, describe and argument errors answer (target: 1.5 s each)
	$(BIN)/python -m harness.studies.startup

gpu-smoke: install ## on a GPU machine (< 10 min): versions, every variant dense bf16/fp32, on Cora, in MiniLM, one captioning epoch; writes leaderboards/gpu-smoke/<gpu>.md. Without a GPU: says so, exits 0
	$(BIN)/python -m harness.studies.gpu_smoke

gpu-perf: install ## on a GPU machine (<= 8 min): correctness, the dense table at L=512/2048/8192, ALBERT-base steps, Cora epochs, scaling, the goals met; writes leaderboards/gpu-perf/<gpu>.md. Without a GPU: builds .gpukit and the MiniLM shards for gpu-smoke, and checks each device call carries <= 64 MiB
	$(BIN)/python -m harness.studies.gpu_perf

gpu-cost: install ## what a GPU would run, counted on the CPU (kernels, host syncs, bytes, peak, saved, FLOPs per variant; Cora epochs): writes leaderboards/gpu-cost.{md,csv}
	$(BIN)/python -m harness.studies.gpu_cost --out leaderboards

scaling: install ## the SUITE (default quick) with 1 and with 2 workers in one command: prints the speed-up
	$(BIN)/attnbench scaling --suite $(SUITE) --workers 1,2

probe: install ## the Fenchel probe on pretrained MiniLM: writes leaderboards/probes/fenchel-minilm.*
	$(BIN)/attnbench probe fenchel

tune: install ## Optuna-tune VARIANT on TASK (TRIALS=20), or every pair of SUITE when TASK is unset
	$(BIN)/attnbench tune $(if $(TASK),$(TASK) $(VARIANT),--suite $(SUITE)) --trials $(TRIALS)

# Every committed board unless SUITE is given on the command line. The records are the committed store
# (leaderboards/records/, RUNS=dir for another): a fresh clone regenerates every board byte for byte, and a
# board none of whose records are committed is left as it is with a one-line note, never blanked.
# Only the .md files named after a built-in suite are boards (leaderboards/ also holds mutation.md and the like).
SUITE_NAMES := $(basename $(notdir $(wildcard harness/suites/*.yaml)))
BOARDS := $(if $(filter command line environment,$(origin SUITE)),$(SUITE),$(filter $(SUITE_NAMES),$(basename $(notdir $(wildcard leaderboards/*.md)))))
# Without SUITE it also writes leaderboards/claims.{md,html}, the papers' claims (harness/claims.yaml) against the
# same records: always rendered, since a claim without records says "not run yet" or "not run here".
RUNS ?= leaderboards
CLAIMS := $(if $(filter command line environment,$(origin SUITE)),,--claims)
leaderboard: install ## regenerate every leaderboards/<suite>.{md,csv,html} and claims.{md,html} (or SUITE=name) from the committed records (RUNS=leaderboards)
	@$(BIN)/attnbench leaderboard --suite $(BOARDS) --runs-dir $(RUNS) --skip-unrecorded $(CLAIMS)

# Debian's package, not `playwright install`: offline machines reach the Debian mirror but not Playwright's CDN.
browser: ## install Debian's chromium for the headless leaderboard page test, when /usr/bin/chromium is missing
	@if [ -x /usr/bin/chromium ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else SUDO=none; fi; \
	if [ "$$SUDO" = none ] || ! $$SUDO apt-get install -y chromium; then \
	  echo "make browser: could not install chromium; run 'sudo apt-get install -y chromium' (Debian/Ubuntu). Until then the browser test is skipped."; \
	fi

# Debian's server package for the PostgreSQL storage test (tests/harness/test_postgres.py), which starts its own
# throwaway server from these programs (in /usr/lib/postgresql/<version>/bin) and runs it as a non-root user.
postgres: ## install Debian's postgresql server for the PostgreSQL storage test, when it is missing
	@if command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else SUDO=none; fi; \
	if [ "$$SUDO" = none ] || ! $$SUDO apt-get install -y --no-install-recommends postgresql; then \
	  echo "make postgres: could not install postgresql; run 'sudo apt-get install -y postgresql' (Debian/Ubuntu). Until then the PostgreSQL test is skipped."; \
	fi

# Debian's SLURM daemons and munge for the tests against a real scheduler (tests/slurm/): the tests start their own
# one-node cluster from these programs (tests/slurm/cluster.py), with a configuration in a temporary folder, and stop it.
slurm: ## install Debian's slurmctld, slurmd, SLURM's client commands and munge for the SLURM tests, when they are missing
	@if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null; then SUDO=sudo; else SUDO=none; fi; \
	if [ "$$SUDO" = none ] || ! $$SUDO apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge; then \
	  echo "make slurm: could not install SLURM; run 'sudo apt-get install -y slurmctld slurmd slurm-client munge' (Debian/Ubuntu). Until then the SLURM tests are skipped."; \
	fi

test: install browser postgres slurm ## run the test suite (CPU, minutes)
	$(BIN)/python -m pytest -q

test-slow: install ## also the slow reproduction tests
	$(BIN)/python -m pytest -q -m slow

# A benchmark of the tests, not a test: mutmut per core module against the focused tests that cover it
# (tests/mutation/run.py names them), each in its own copy under build/mutation/. Minutes per module on two
# cores; MODULES=path.py ... runs some and keeps the other rows. Writes leaderboards/mutation.md.
MODULES ?=
mutation: install ## mutation testing of the core modules (mutmut; slow): writes leaderboards/mutation.md
	nice -n 10 $(BIN)/python -m tests.mutation.run $(if $(MODULES),--only $(MODULES))

clean: ## remove caches and test outputs (keeps .venv and runs/)
	rm -rf .pytest_cache tests/artifacts build *.egg-info

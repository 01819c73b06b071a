# ascend-r1: the front door. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# STACK=published|current (patches/stacks.toml; the default there when empty), PROFILE=cpu|npu|cuda
# (detected when empty); each stack and profile has its own environment, .venv-<stack>-<profile>
STACK ?=
PROFILE ?=
# the patch manager and bootstrap need only the standard library: they run before any environment exists
SYSPY ?= python3
ifneq ($(STACK),)
export ASCEND_R1_STACK := $(STACK)
endif
ifeq ($(origin VENV),undefined)
VENV := $(shell $(SYSPY) -m tools.stacks venv $(if $(STACK),--stack $(STACK)) $(if $(PROFILE),--profile $(PROFILE)))
endif
ifeq ($(VENV),)
$(error no environment for STACK=$(STACK): `python3 -m tools.stacks list` lists the stacks)
endif
# The stack's Python. Where its environment is not made yet (a clone bootstrapped for the other stack only),
# every $(PY) command stops with one `error:` line naming the stacks that are bootstrapped and the two ways
# on (STACK=<that stack>, or make bootstrap STACK=<this one>), exit 2, instead of the shell's "No such file".
ifneq ($(wildcard $(VENV)/bin/python),)
PY := $(VENV)/bin/python
else
PY = $(SYSPY) -m tools.stacks no-env --venv $(VENV) --target $@ $(if $(STACK),--stack $(STACK)) $(if $(PROFILE),--profile $(PROFILE)) --
endif
# a recipe line of its own, for commands that take the Python as a variable (PYTHON=$(PY) scripts)
NEED_PY = $(if $(wildcard $(VENV)/bin/python),@true,@$(PY))
# `make plan NO_ENV=1` checks the recipe alone (no versions, files or machine): any stack's environment can
# compose it, for the stack asked (ASCEND_R1_STACK), so it runs where only another stack is bootstrapped
ANY_PY = $(or $(wildcard $(VENV)/bin/python),$(firstword $(wildcard .venv-*/bin/python)),$(PY))
PLAN_PY = $(if $(NO_ENV),ASCEND_R1_STACK=$${ASCEND_R1_STACK:-$$($(SYSPY) -m tools.stacks default)} $(ANY_PY),$(PY))
# Python bytecode goes to build/pycache, never beside the sources, so it is written even where
# PYTHONDONTWRITEBYTECODE is set (images often set it, this project's machines do): without a bytecode
# cache every Python process of a run (the launcher, verl's driver, ~8 Ray workers, vLLM's server and
# engine, each test's subprocesses) compiles its ~3,000 modules from source again, 7 s of CPU apiece.
# PYCACHE= (empty) leaves the environment's setting alone.
PYCACHE ?= $(CURDIR)/build/pycache
ifneq ($(PYCACHE),)
export PYTHONPYCACHEPREFIX := $(PYCACHE)
unexport PYTHONDONTWRITEBYTECODE
endif
STACK_ARG := $(if $(STACK),--stack $(STACK))
PROFILE_ARG := $(if $(PROFILE),--profile $(PROFILE))
PATCHES := $(SYSPY) -m tools.patches
UP ?=
REF ?=

.PHONY: help bootstrap lock check-locks bench-bootstrap apply-patches unapply-patches export-patches check-patches rebase-upstream \
        status stacks test test-fast lint format train clean verify-patch-tests selfcheck upstream-tests upstream-sanity

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo
	@echo "  Start with: make bootstrap && make train    then: make test"
	@echo "  Stacks (STACK=): $$($(SYSPY) -m tools.stacks list | sed -E 's/^(\S+( \(default\))?).*/\1/' | paste -sd, - | sed 's/,/, /g')"

bootstrap: ## STACK='s sources (git or PyPI) + locked env .venv-<stack>-<profile> + patches + patched packages; idempotent
	$(SYSPY) -m tools.bootstrap $(STACK_ARG) $(PROFILE_ARG) --venv $(VENV)

stacks: ## the stacks (published, current), the default marked
	@$(SYSPY) -m tools.stacks list

lock: ## re-resolve locks/<stack>/<profile>.txt from requirements/, keeping every locked version the inputs allow; NAMES= to pick (e.g. current, published/npu); UPGRADE=1: the newest versions
	$(SYSPY) -m tools.env lock $(if $(filter 1,$(UPGRADE)),--upgrade) $(NAMES)

check-locks: ## fail when a lock in locks/ is older than its requirement files (no network)
	$(SYSPY) -m tools.env check-locks

bench-bootstrap: ## make bootstrap from fresh clones, cold and warm caches; uv vs pip on the same lock
	$(SYSPY) bench/bench_bootstrap.py

apply-patches: ## apply patches/<stack>/<up>/series on top of each pin (STACK=, UP= for one upstream); no-op when stamped
	$(PATCHES) apply $(STACK_ARG) $(UP)

unapply-patches: ## back to the STACK's pristine pins, refusing to destroy local edits
	$(PATCHES) unapply $(STACK_ARG) $(UP)

export-patches: ## turn the commits on top of each pin back into patches/<stack>/<up>/*.patch and series
	$(PATCHES) export $(STACK_ARG) $(UP)

check-patches: ## what CI runs, every stack (or STACK=): strict apply on fresh pristine trees, blob ids, byte-identical re-export, lint
	$(PATCHES) check $(STACK_ARG) $(UP)

verify-patch-tests: ## each patch's Tested-By tests must FAIL on trees built without it, recorded in patches/<stack>/verified.toml; every bootstrapped stack (STACK=, UP=, PATCH=<file>, CONTROL=0 right after make test, JOBS=n at once, CHANGED=1: only patches whose record is stale)
	$(SYSPY) -m tools.suite verify-patch-tests $(STACK_ARG) $(PROFILE_ARG) $(UP) $(if $(PATCH),--patch $(PATCH)) $(if $(filter 0,$(CONTROL)),--no-control) $(if $(JOBS),--jobs $(JOBS)) $(if $(filter 1,$(CHANGED)),--only-changed)

upstream-sanity: ## what CI runs: each upstream's own sanity scripts (license/SPDX, device API), pristine pin vs patched tree (STACK=, UP=)
	$(SYSPY) -m tools.upstream_tests $(STACK_ARG) $(PROFILE_ARG) $(if $(CHECK),--check $(CHECK)) $(UP)

upstream-tests: ## each upstream's own sanity scripts + CPU unit tests, pristine pin vs patched tree; fails on a regression; records verdicts in patches/<stack>/upstream-tests.verified.toml (STACK=, UP=, CHECK=, FULL=1, CHANGED=1: only checks whose record is stale)
	$(SYSPY) -m tools.upstream_tests $(STACK_ARG) $(PROFILE_ARG) $(if $(FULL),--full,$(if $(filter 1,$(CHANGED)),--changed,--all)) $(if $(CHECK),--check $(CHECK)) $(UP)

selfcheck: ## the NPU series checked on this machine: NPU forms on an NPU node (MODEL=<dir>), CPU forms anywhere
	$(PY) -m tools.selfcheck $(if $(MODEL),--model $(MODEL)) $(ARGS)

rebase-upstream: ## move STACK's UP= to REF= (git ref, or PyPI version), 3-way; or FROM=<stack>: carry that stack's series onto STACK's pin
	@test -n "$(UP)" -a -n "$(REF)$(FROM)" || { echo "usage: make rebase-upstream [STACK=<stack>] UP=<upstream> REF=<tag|commit|version>   or   ... UP=<upstream> FROM=<other stack>"; exit 2; }
	$(PATCHES) rebase $(STACK_ARG) $(UP) $(REF) $(if $(FROM),--from $(FROM))

status: ## the stack, and each upstream: pin, source, clean/dirty, patches applied
	$(PATCHES) status $(STACK_ARG)

test: ## the test suite (README's test command): every bootstrapped stack, each in its own env (STACK= for one)
	$(SYSPY) -m tools.suite test $(STACK_ARG) $(PROFILE_ARG) $(ARGS)

test-fast: ## the test suite without the slow tests
	$(SYSPY) -m tools.suite test $(STACK_ARG) $(PROFILE_ARG) -m "not slow" $(ARGS)

lint: ## ruff lint + format check, patch-series lint, lock freshness
	$(SYSPY) -m tools.env check-locks
	$(PY) -m ruff check tools tests bench
	$(PY) -m ruff format --check tools tests bench
	$(PATCHES) lint

format: ## ruff format + autofix
	$(PY) -m ruff format tools tests bench
	$(PY) -m ruff check --fix tools tests bench

train: ## GRPO through the patched verl: RECIPE= (default tiny-cpu here), BACKEND=megatron|fsdp, ARGS= overrides, DRY_RUN=1
	$(PY) -m tools.launch train $(PROFILE_ARG) $(if $(RECIPE),--recipe $(RECIPE)) $(if $(BACKEND),--backend $(BACKEND)) $(if $(DRY_RUN),--dry-run) $(ARGS)

# ---- weights (tools/weights) ----
# python -m tools.weights --help lists the commands; docs/weights.md explains them.
WEIGHTS = $(PY) -m tools.weights
SRC ?=
DST ?=
CONFIG ?=
THREADS ?= 2
.PHONY: fix-config convert-fp8 convert-mcore export-hf bench-weights test-weights

fix-config: ## DeepSeek-V3 config.json: drop quantization_config, no MTP (SRC=dir or file, DST= optional)
	@test -n "$(SRC)" || { echo "usage: make fix-config SRC=<model dir|config.json> [DST=<file>]"; exit 2; }
	$(WEIGHTS) fix-config $(SRC) $(DST)

convert-fp8: ## FP8 -> BF16 on CPU, streamed and resumable: SRC=<fp8 dir> DST=<bf16 dir>
	@test -n "$(SRC)" -a -n "$(DST)" || { echo "usage: make convert-fp8 SRC=<fp8 dir> DST=<bf16 dir> [THREADS=2]"; exit 2; }
	$(WEIGHTS) fp8-to-bf16 $(SRC) $(DST) --threads $(THREADS)

convert-mcore: ## HF (BF16 or FP8) -> Megatron torch_dist for verl: SRC=<hf dir> DST=<ckpt dir>
	@test -n "$(SRC)" -a -n "$(DST)" || { echo "usage: make convert-mcore SRC=<hf dir> DST=<ckpt dir> [THREADS=2]"; exit 2; }
	$(WEIGHTS) hf-to-mcore $(SRC) $(DST) --threads $(THREADS)

export-hf: ## Megatron torch_dist -> HF safetensors: SRC=<ckpt dir> DST=<hf dir> CONFIG=<hf dir with config.json>
	@test -n "$(SRC)" -a -n "$(DST)" -a -n "$(CONFIG)" || { echo "usage: make export-hf SRC=<ckpt dir> DST=<hf dir> CONFIG=<hf dir>"; exit 2; }
	$(WEIGHTS) mcore-to-hf $(SRC) $(DST) --config $(CONFIG) --threads $(THREADS)

bench-weights: ## weight tools vs a plain copy on synthetic checkpoints (0.6 and 2.6 GB; ~25 GB of /tmp)
	$(PY) bench/weights_bench.py

test-weights: ## the weight tools' tests (megatron-core oracle included)
	$(PY) -m pytest tests/tools/weights

# ---- data and rewards (tools/data, tools/reward) ----
.PHONY: data check-data show-prompt bench-reward bench-data

data: ## convert SRC= (json/jsonl/parquet) into DST=/{train,test}.parquet + data card; FORMAT=deepscaler|math|gsm8k|orz|generic, ARGS=
	@test -n "$(SRC)" -a -n "$(DST)" || { echo "usage: make data SRC=<file> DST=<folder> [FORMAT=deepscaler] [ARGS='--test-size 0.01 --tokenizer <model> --max-prompt-length 1024']"; exit 2; }
	$(PY) -m tools.data convert $(SRC) $(DST) --format $(or $(FORMAT),deepscaler) $(ARGS)

.PHONY: benchmarks
benchmarks: ## the shipped benchmarks (benchmarks/: aime24, aime25, math500; checksums checked) -> DST=data/benchmarks/<name>.parquet with the recipes' prompt; NAMES=aime24,...
	$(PY) -m tools.data benchmarks $(or $(DST),data/benchmarks) $(if $(NAMES),--names $(NAMES)) $(ARGS)

check-data: ## validate parquet FILES= against verl's RL schema
	@test -n "$(FILES)" || { echo "usage: make check-data FILES='<a.parquet> [b.parquet ...]'"; exit 2; }
	$(PY) -m tools.data check $(FILES)

show-prompt: ## one prompt through the model's chat template: TOKENIZER= and PARQUET= [ROW=0], or PROBLEM='...' [STYLE=system|user]
	@test -n "$(TOKENIZER)" -a -n "$(PARQUET)$(PROBLEM)" || { echo "usage: make show-prompt TOKENIZER=<model dir> PARQUET=<file> [ROW=0]   or   PROBLEM='What is 1+1?'"; exit 2; }
	$(PY) -m tools.data show-prompt --tokenizer $(TOKENIZER) $(if $(PARQUET),--parquet $(PARQUET) --row $(or $(ROW),0),--problem "$(PROBLEM)" --style $(or $(STYLE),system))

bench-reward: ## reward scoring: cache + fast path + workers against a plain loop, 8192 responses
	$(PY) bench/bench_reward.py $(ARGS)

bench-data: ## converter: 40,000 DeepScaleR rows against a load-everything baseline (ARGS=--tokenizer)
	$(PY) bench/bench_data.py $(ARGS)

clean: ## remove build outputs (never touches third_party edits or your data)
	rm -rf build .pytest_cache .ruff_cache
	find tools tests bench -name __pycache__ -type d -prune -exec rm -rf {} +

# ---- launch (tools/launch): recipes, dry run, preflight, reports ----
# RECIPE= a recipes/*.yaml name; ARGS= Hydra overrides, e.g. ARGS='verl.data.train_batch_size=256 hardware=a2-8'
LAUNCH = $(PY) -m tools.launch
RECIPE ?=
.PHONY: recipes dry-run

recipes: ## list the recipes (model x hardware x algorithm) and the config groups
	@$(LAUNCH) recipes

dry-run: ## resolved config + the exact verl command for RECIPE= (ARGS= overrides); starts nothing
	@$(LAUNCH) dry-run $(or $(RECIPE),tiny-cpu) $(ARGS)

.PHONY: plan bench-plan bench-plan-search report bench-report prepare ray-head ray-worker ray-stop ray-job slurm kuberay

plan: ## preflight for RECIPE=: layout, batches, versions, env, data, weights, device memory, step time (NO_ENV=1: recipe only; JSON=1: one JSON object; RUN=<run folder>: fit the time model to it; SEARCH=1: rank the layouts)
	@$(PLAN_PY) -m tools.launch plan $(or $(RECIPE),tiny-cpu) $(if $(NO_ENV),--no-env) $(ARGS) $(if $(JSON),--json) $(if $(RUN),--run $(RUN)) $(if $(SEARCH),--search)

bench-plan: ## time `make plan` for the 671B recipe against its 2 s target
	$(PY) bench/plan_bench.py

bench-report: ## time `make report` on a synthetic 200-step run (real verl metric names) against its 3 s target
	$(PY) bench/bench_report.py $(ARGS)

bench-plan-search: ## time `make plan SEARCH=1` for the 671B recipe against its 10 s target
	$(PY) bench/plan_search_bench.py

prepare: ## RECIPE='s weights and data to a training-ready state: FP8->BF16, config fix-up, HF->Megatron, dataset (skips done steps, resumes)
	@$(LAUNCH) prepare $(or $(RECIPE),tiny-cpu) --threads $(THREADS) $(ARGS)

report: ## one HTML page (what ran, learning, health, time), step table, plots from RUN=<run folder or verl metrics .jsonl>; RUN=a RUN=b overlays runs
	@test -n "$(RUN)" || { echo "usage: make report RUN=<outputs/<stack>/<run> | verl metrics .jsonl> [RUN=<another run> ...] [OUT=<folder>]"; exit 2; }
	@$(LAUNCH) report $(RUN) --make-pid $$PPID $(if $(OUT),--out $(OUT))

ray-head: ## start the Ray head for RECIPE= on this node and wait for all its nodes (HCCL_SOCKET_IFNAME names the NIC)
	$(NEED_PY)
	PYTHON=$(PY) tools/cluster/scripts/ray-head.sh $(or $(RECIPE),tiny-cpu) $(foreach o,$(ARGS),--set $(o))

ray-worker: ## join this node to HEAD=<ip:port> for RECIPE=, with bounded retries
	@test -n "$(HEAD)" || { echo "usage: make ray-worker RECIPE=<recipe> HEAD=<head ip:port>"; exit 2; }
	$(NEED_PY)
	PYTHON=$(PY) tools/cluster/scripts/ray-worker.sh $(or $(RECIPE),tiny-cpu) $(HEAD) $(foreach o,$(ARGS),--set $(o))

ray-stop: ## stop this node's ascend-r1 Ray processes (only this cluster's temp dir) and check none is left
	$(NEED_PY)
	PYTHON=$(PY) tools/cluster/scripts/ray-stop.sh

ray-job: ## run RECIPE= on the cluster at HEAD=<ip:port> under make train's supervisor (watchdog, restarts, a lost node waited for; ARGS= as make train's; SUBMIT=1: as a Ray job on the head)
	@test -n "$(HEAD)" || { echo "usage: make ray-job RECIPE=<recipe> HEAD=<head ip:port> [ARGS='launch.restarts=3 ...'] [SUBMIT=1]"; exit 2; }
	$(PY) -m tools.launch cluster job $(PROFILE_ARG) --recipe $(or $(RECIPE),tiny-cpu) --address $(HEAD) $(if $(SUBMIT),--submit) $(ARGS)

slurm: ## print a Slurm batch script for RECIPE= (sbatch it)
	@$(LAUNCH) slurm $(or $(RECIPE),tiny-cpu) $(ARGS)

kuberay: ## print a KubeRay RayJob manifest for RECIPE= (kubectl apply -f it)
	@$(LAUNCH) kuberay $(or $(RECIPE),tiny-cpu) $(ARGS)

.PHONY: bench-train tiny-assets bench-learn bench-learn-async bench-zero bench-routing bench-faults bench-ray-job
bench-ray-job: ## make ray-job on two raylets of this machine, the one with the run's workers killed mid-run: back (the run restarts and finishes), never back (exit 3); prints the times
	ASCEND_R1_ALL_TESTS=1 $(PY) -m pytest tests/tools/cluster/test_ray_job_e2e.py -q -s

bench-train: ## make train's wall time, peak process-tree memory and step split: tiny-cpu, -fsdp, -parallel side by side (ARGS=)
	$(PY) bench/bench_train.py $(ARGS)

bench-learn: ## the run that learns (RECIPE tiny-learn), two seeds: accuracy rise, times, peak memory (ARGS=)
	$(PY) bench/bench_learn.py $(ARGS)

bench-learn-async: ## tiny-learn, two seeds, sync beside separate_async (staleness 1): the rise, staleness, step time (ARGS=)
	$(PY) bench/bench_learn.py --modes sync separate_async $(ARGS)

bench-faults: ## a resumed run is the run that never stopped: tiny-cpu stopped/faulted at each moment vs uninterrupted (ARGS=--cases ...)
	$(PY) bench/bench_faults.py $(ARGS)

bench-zero: ## R1-Zero in miniature (RECIPE tiny-zero): seeds 0 and 1 and the three controls, length x accuracy, times (ARGS=)
	$(PY) bench/bench_zero.py $(ARGS)

bench-routing: ## tiny-zero without and with routing replay (correction=none, r3), seeds 0 and 1: mismatch, routing disagreement, learning, step time side by side (ARGS=--runs NAME=PATH ... for run folders made before)
	$(PY) bench/bench_routing.py $(ARGS)

tiny-assets: ## the embedded default's tiny model, tokenizer, data and Megatron checkpoint (build/tiny)
	$(PY) -m tools.launch assets tiny-cpu

# ---- evaluation (tools/eval): DeepSeek-R1's protocol on a checkpoint (docs/evaluation.md) ----
.PHONY: eval
STEP ?=
BASE ?=
MODEL ?=
BENCH ?=
K ?=
OUT ?=
eval: ## a checkpoint by DeepSeek-R1's measure: RUN=<run> [STEP=<n>|BASE=1] or MODEL=<hf dir>; BENCH=test|aime24,aime25,math500 K=16 (T 0.6, top-p 0.95); SHARD=i/n|auto (node i of n), SUMMARY=1; ARGS=
	@test -n "$(RUN)$(MODEL)" || { echo "usage: make eval RUN=<run folder> [STEP=<n>|BASE=1] [BENCH=test|aime24,aime25,math500] [K=16] [OUT=<folder>] [ARGS='--temperature 0.6 --top-p 0.95 --max-new-tokens 32768']   or   make eval MODEL=<hf folder> BENCH=aime24"; exit 2; }
	$(PY) -m tools.eval $(if $(RUN),--run $(RUN)) $(if $(STEP),--step $(STEP)) $(if $(filter 1,$(BASE)),--base) $(if $(MODEL),--model $(MODEL)) $(if $(BENCH),--bench $(BENCH)) $(if $(K),--k $(K)) $(if $(OUT),--out $(OUT)) $(if $(SHARD),--shard=$(SHARD)) $(if $(filter 1,$(SUMMARY)),--summarize) $(ARGS)
.PHONY: eval-compare
eval-compare: ## sharpening or discovery: BASE_EVAL=<eval folder of the base> TRAINED_EVAL=<of a checkpoint> (make eval K=64 both): pass@k table + PNG, the verdict
	@test -n "$(BASE_EVAL)" -a -n "$(TRAINED_EVAL)" || { echo "usage: make eval-compare BASE_EVAL=<run>/eval/step_0/<bench> TRAINED_EVAL=<run>/eval/step_<n>/<bench> [ARGS='--out x.png --tol 0.02']"; exit 2; }
	$(PY) -m tools.eval.compare $(BASE_EVAL) $(TRAINED_EVAL) $(ARGS)

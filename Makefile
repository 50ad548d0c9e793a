# Two commands for a newcomer: `make demo` (the main job) and `make test` (everything CI runs).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The extras `make venv` installs; scripts/lock.sh resolves the same set.
EXTRAS := atropos,service,docker,uvloop,modal,ssh,e2b,daytona,web,browser,terminalbench,families,testing,dev
# Exact versions of everything installed (scripts/lock.sh writes it; `make lock` refreshes it).
LOCK   ?= requirements/lock.txt

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export WANDB_MODE ?= offline
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: venv demo test lint typecheck pytest clean bench

venv: $(STAMP)

# uv installs the lock and scripts/lock.sh resolves it: the same versions as pip, in half the
# time (docs/testing.md).
UV_VERSION := 0.13.9

# Re-installs only when pyproject.toml or the lock changes; a second `make venv` is a no-op.
# --compile-bytecode: PYTHONDONTWRITEBYTECODE is exported, so nothing would compile them later.
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -c $(LOCK) -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# Re-resolve requirements/lock.txt after a change to pyproject.toml (keeps the pins it can).
.PHONY: lock test-latest
lock:
	scripts/lock.sh

# What a fresh install would get today: every dependency at its newest allowed version, in its
# own venv, then the whole test command. How a maintainer learns that an upstream release broke
# something before users do.
test-latest:
	scripts/lock.sh --latest -o .venv-latest.lock
	$(MAKE) test VENV=.venv-latest LOCK=.venv-latest.lock

# TerminalTestEnv evaluate + process against the scripted oracle model on loopback (offline,
# local sandboxes); writes demo_output/. A real server:
#   make demo DEMO_ARGS="--openai.base_url http://host:8000/v1 --openai.server_type vllm"
demo: venv
	$(BIN)/hermes-async demo $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check hermes_async tests bench
	$(BIN)/ruff format --check hermes_async tests bench

# Niced: beside pytest (`make test`) it takes only the CPU time the workers leave idle.
MYPY := nice -n 19 $(BIN)/mypy

typecheck: venv
	$(MYPY)

# Test files spread over worker processes (pytest-xdist), each file whole on one worker (its
# module fixtures load once), in collection order: the longest first (tests/conftest.py's
# LONGEST_FIRST). PYTEST_WORKERS=0 runs everything in this process (-s, --pdb).
# Three on 2 cores: with two, the plain suite left the CPUs 31% idle (docs/testing.md).
PYTEST_WORKERS ?= 3
pytest: venv
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# mypy runs beside pytest (one process; the suite leaves the CPUs 10-20% idle), in the background
# and not as a `make -j` job: under -j make takes stdin from all but one job, and pytest's --pdb
# needs it. Its output is printed after pytest's; either failing fails the target.
test: lint
	@$(MYPY) > $(VENV)/typecheck.log 2>&1 & mypy=$$!; trap 'kill $$mypy 2>/dev/null' INT TERM; \
	$(MAKE) --no-print-directory pytest; pytest=$$?; wait $$mypy; mypy=$$?; \
	cat $(VENV)/typecheck.log; [ $$pytest -eq 0 ] && [ $$mypy -eq 0 ]

# Opt-in, NOT part of `make test`: a real CPU vLLM (own venv .venv-vllm, ~3.4 GB, ~80 s the
# first time) serving a tiny random model with the offline Qwen tokenizer; runs tests/integration.
.PHONY: test-vllm
test-vllm: venv
	VENV=$(VENV) bash scripts/vllm/run_tests.sh

# Opt-in, NOT part of `make test` (there its tests skip without the venv): YCBenchEvalEnv against
# the yc-bench 0.1.0 simulator from PyPI, in its own Python 3.12 venv (.venv-yc-bench,
# scripts/yc_bench/setup_venv.sh, 3-6 minutes of downloads the first time).
.PHONY: test-yc-bench
test-yc-bench: venv
	bash scripts/yc_bench/setup_venv.sh
	YC_BENCH_VENV=$${YC_BENCH_VENV:-$$PWD/.venv-yc-bench} HERMES_ASYNC_REQUIRE_YC_BENCH=1 \
		$(BIN)/python -m pytest -p no:xdist -m yc_bench tests/envs $(PYTEST_ARGS)

# Opt-in, NOT part of `make test`: each trainer's own package (nemo-gym, verl, skyrl, trl) in
# its own venv (.venv-<name>, built by scripts/trainers/setup_venv.sh), driving the adapters of
# hermes_async.integrations through the trainers' classes, then the Gym and SkyRL adapters
# against the real CPU vLLM. TRAINERS="trl vllm" runs some; docs/trainers/README.md. About 15
# minutes on 2 busy cores once the venvs exist.
.PHONY: test-trainers
test-trainers: venv
	VENV=$(VENV) bash scripts/trainers/run_tests.sh $(TRAINERS)

bench: venv
	@for f in bench/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info

# The docker-marked tests against a private engine: install/start it, build the test image,
# run them (failing, not skipping, if the engine is missing), stop it and clean up.
.PHONY: test-docker
test-docker: venv
	@engine_env="$$(scripts/docker/engine.sh up)" && eval "$$engine_env" && \
	trap 'scripts/docker/engine.sh down' EXIT && \
	HERMES_ASYNC_REQUIRE_DOCKER=1 $(BIN)/python -m pytest -m docker $(PYTEST_ARGS)

# Opt-in, NOT part of `make test`: rollout workers as Ray actors on a real cluster on this
# machine -- a head and two worker raylets on 127.0.0.1 (scripts/ray/cluster.sh), Ray in its own
# venv (.venv-ray, scripts/ray/setup_venv.sh, ~75 s the first time). About 4 minutes on 2 cores:
# 1,000 rollouts over 4 actors, an actor killed mid-run, a batch cancelled from the driver.
.PHONY: test-ray
test-ray:
	@bash scripts/ray/setup_venv.sh && cluster_env="$$(scripts/ray/cluster.sh up)" && \
	eval "$$cluster_env" && trap 'scripts/ray/cluster.sh down' EXIT && \
	HERMES_ASYNC_REQUIRE_RAY=1 .venv-ray/bin/python -m pytest -m ray tests/ray $(PYTEST_ARGS)

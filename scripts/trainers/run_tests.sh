#!/usr/bin/env bash
# `make test-trainers`: everything opt-in about the trainer adapters, in one command.
#
# For each trainer: build its venv (scripts/trainers/setup_venv.sh) and run, in it, the adapter
# tests through that trainer's own package (tests/trainers/test_<name>_package.py) and the
# adapter's contract tests (tests/integrations/test_<name>.py). A trainer package that does not
# import is a failure here (HERMES_ASYNC_REQUIRE_TRAINERS=1), not a skip. Then `vllm`: the Gym
# agent and the SkyRL generator against a real CPU vLLM (scripts/vllm/run_tests.sh, only
# tests/integration/test_vllm_trainers.py), and the tool call cut by max_tokens that every
# adapter inherits (decision 001). Each step runs even if one before it failed; the exit status
# is 1 if any did, and each step's time is printed.
#
# Usage: scripts/trainers/run_tests.sh [NAME...]   (default: nemo-gym verl skyrl trl vllm)
# Env:   TRAINER_VENV_ROOT (as for setup_venv.sh), PYTEST_ARGS (extra pytest arguments),
#        VENV, VLLM_VENV, VLLM_WORK (as for scripts/vllm/run_tests.sh).
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT="${TRAINER_VENV_ROOT:-$PWD}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline HERMES_ASYNC_REQUIRE_TRAINERS=1
# The venvs install this checkout editable; the path makes subprocesses use it too.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
names=("$@")
(( ${#names[@]} )) || names=(nemo-gym verl skyrl trl vllm)

one() {
    local name="$1"
    if [[ "$name" == vllm ]]; then
        VLLM_STOCK_PHASE=0 VLLM_TESTS="tests/integration/test_vllm_trainers.py \
tests/integration/test_vllm_multiturn.py::test_a_max_tokens_cut_inside_a_call_is_content_and_an_error" \
            bash scripts/vllm/run_tests.sh
        return
    fi
    bash scripts/trainers/setup_venv.sh "$name"
    local module="tests/trainers/test_${name//-/_}_package.py"
    local contract="tests/integrations/test_${name//-/_}.py"
    [[ -f "$contract" ]] || contract=""
    echo "[test-trainers] $name: $module $contract"
    "$ROOT/.venv-$name/bin/python" -m pytest "$module" $contract -p no:cacheprovider ${PYTEST_ARGS:-}
}

status=0
report=()
all_started=$(date +%s)
for name in "${names[@]}"; do
    started=$(date +%s)
    if ( one "$name" ); then result=passed; else result=FAILED; status=1; fi
    report+=("$name: $result in $(( $(date +%s) - started )) s")
done
echo "[test-trainers] ${report[*]/#/; }" | sed 's/\] ; /] /'
echo "[test-trainers] total $(( $(date +%s) - all_started )) s"
exit "$status"

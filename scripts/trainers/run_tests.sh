#!/usr/bin/env bash
# `make test-trainers`: build each trainer's venv (scripts/trainers/setup_venv.sh) and run, in
# it, the adapter tests through that trainer's own package (tests/trainers/test_<name>_package.py)
# and the adapter's contract tests (tests/integrations). A trainer package that does not import
# is a failure here (HERMES_ASYNC_REQUIRE_TRAINERS=1), not a skip.
#
# Usage: scripts/trainers/run_tests.sh [NAME...]   (default: nemo-gym verl skyrl trl)
# Env:   TRAINER_VENV_ROOT (as for setup_venv.sh), PYTEST_ARGS (extra pytest arguments).
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT="${TRAINER_VENV_ROOT:-$PWD}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline HERMES_ASYNC_REQUIRE_TRAINERS=1
status=0
for name in "${@:-nemo-gym verl skyrl trl}"; do
    for one in $name; do
        bash scripts/trainers/setup_venv.sh "$one"
        module="tests/trainers/test_${one//-/_}_package.py"
        echo "[test-trainers] $one: $module"
        contract="tests/integrations/test_${one//-/_}.py"
        [[ -f "$contract" ]] || contract=""
        "$ROOT/.venv-$one/bin/python" -m pytest "$module" $contract \
            -p no:cacheprovider ${PYTEST_ARGS:-} || status=1
    done
done
exit "$status"

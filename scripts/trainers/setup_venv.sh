#!/usr/bin/env bash
# Build the opt-in venv of one trainer (nemo-gym, verl, skyrl, trl) for `make test-trainers`.
#
# Each trainer gets its own venv: their pins conflict (verl wants transformers<5.11, skyrl
# <=5.16.1; nemo-gym wants Python >= 3.13.14, verl < 3.13) and so do their Pythons. The
# trainer's pin is its extra in pyproject.toml; hermes_async goes in editable with that extra
# and its test tools.
# torch for verl and trl is the CPU build 2.13.0 for Python 3.11 (pip takes it from the
# machine's wheel directory), so those venvs are Python 3.11. skyrl cannot be: it does not
# import on 3.11 (below), so its venv is 3.12 and torch 2.13.0 is PyPI's CUDA build (about
# 3 GB to download, 5.3 GB installed; it runs on the CPU).
#
# Usage: scripts/trainers/setup_venv.sh NAME...   (NAME: nemo-gym | verl | skyrl | trl | all)
# Env:   TRAINER_VENV_ROOT (default: the checkout; the venv is $ROOT/.venv-NAME),
#        PYTHON311 / PYTHON312 / PYTHON313 (interpreters; default python3.X, else pyenv's).
# A no-op once the venv's stamp for its pin exists. With several names (or all), each is built
# even if another fails; the exit status is 1 if any failed, and each is reported.
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT="${TRAINER_VENV_ROOT:-$PWD}"
# find_python 3.13: an interpreter of that version (on PATH, else pyenv's), or fail naming it.
find_python() {
    local want="$1" candidate
    for candidate in "python$want" "$(pyenv root 2>/dev/null)"/versions/"$want".*/bin/"python$want"; do
        if "$candidate" -c "" 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "no Python $want found (PATH or pyenv); set PYTHON${want//./}" >&2
    return 1
}
python_of() {  # python_of 3.12: $PYTHON312, else find_python 3.12
    local var="PYTHON${1//./}"
    if [[ -n "${!var:-}" ]]; then echo "${!var}"; else find_python "$1"; fi
}
# The hermes_async test tools every trainer venv needs (pytest plugin, trio, loopback server).
TEST_TOOLS=("pytest>=8.3,<10" "pytest-timeout>=2.3,<3" "trio>=0.27,<0.36" "hypercorn>=0.17,<0.19" "blockbuster>=1.5,<2")

quiet_pip() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

# pin_of EXTRA: the extra's line in pyproject.toml (its pins, said once; the venv's stamp).
pin_of() { grep -E "^$1 = \[" pyproject.toml | tr -cd '[:alnum:]=.,<>_-'; }

build() {
    local name="$1" python="$2"
    shift 2
    local venv="$ROOT/.venv-$name" stamp pin
    pin="$(pin_of "$name")"
    [[ -n "$pin" ]] || { echo "[$name] no extra '$name' in pyproject.toml" >&2; return 1; }
    stamp="$venv/.installed-$pin"
    if [[ -f "$stamp" ]]; then
        echo "[$name] venv ready: $venv"
        return 0
    fi
    local started
    started=$(date +%s)
    test -x "$venv/bin/python" || "$python" -m venv "$venv"
    quiet_pip "$venv/bin/python" -m pip install --quiet --upgrade "pip>=24"
    # "$@": what goes in first (torch) and the flags this trainer's install needs.
    quiet_pip "$venv/bin/python" -m pip install --quiet "$@" -e ".[$name]" "${TEST_TOOLS[@]}"
    "$venv/bin/python" -c "import hermes_async, sys; print('[$name] python', sys.version.split()[0])"
    rm -f "$venv"/.installed-*
    touch "$stamp"
    echo "[$name] venv built in $(( $(date +%s) - started )) s: $venv"
}

one() {
    case "$1" in
        # nemo-gym >= 0.5 declares Requires-Python >= 3.13.14; the newest 3.13 here is 3.13.0,
        # and the package compiles and imports on it: --ignore-requires-python, said so in
        # docs/trainers/nemo_gym.md. No torch.
        nemo-gym) build nemo-gym "$(python_of 3.13)" --ignore-requires-python ;;
        verl) build verl "$(python_of 3.11)" "torch==2.13.0" ;;
        # skyrl 0.4.0 declares Python >= 3.12, and 0.3.0 (which declares >= 3.11) does not import
        # on 3.11 either: skyrl.tinker.types hands pydantic a typing.TypedDict ("Please use
        # typing_extensions.TypedDict instead of typing.TypedDict on Python < 3.12"). The
        # generators' import chain (skyrl.train.generators, the trainer's
        # validate_generator_output) needs these, which skyrl leaves to its skyrl-train extra;
        # that extra also wants flash-attn and nixl, which do not build on a CPU machine.
        skyrl) build skyrl "$(python_of 3.12)" "torch==2.13.0" skyrl-gym loguru \
            tqdm omegaconf "hydra-core==1.3.4" aiohttp pybase64 "ray==2.57.0" torchdata jaxtyping ;;
        trl) build trl "$(python_of 3.11)" "torch==2.13.0" ;;
        *) echo "unknown trainer '$1'; one of: nemo-gym, verl, skyrl, trl, all" >&2; return 2 ;;
    esac
}

(( $# )) || { echo "usage: scripts/trainers/setup_venv.sh NAME... (nemo-gym | verl | skyrl | trl | all)" >&2; exit 2; }
names=()
for arg in "$@"; do
    if [[ "$arg" == all ]]; then names+=(nemo-gym verl skyrl trl); else names+=("$arg"); fi
done
if (( ${#names[@]} == 1 )); then
    one "${names[0]}"
    exit
fi
failed=()
for name in "${names[@]}"; do
    # Each in a subshell: one trainer's failure (set -e) does not stop the others.
    if ( one "$name" ); then echo "[$name] ok"; else echo "[$name] FAILED" >&2; failed+=("$name"); fi
done
if (( ${#failed[@]} )); then
    echo "[setup] failed: ${failed[*]} (of ${names[*]})" >&2
    exit 1
fi
echo "[setup] ready: ${names[*]}"

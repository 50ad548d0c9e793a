#!/usr/bin/env bash
# An opt-in venv with Harbor (PyPI `harbor`), to run it side by side with hermes_async:
#
#   scripts/terminalbench/harbor_venv.sh            build (or reuse) the venv; print its env
#   eval "$(scripts/terminalbench/harbor_venv.sh)"  HARBOR=... DOCKER_CONFIG=... in this shell
#
# Harbor needs Python >= 3.12 (this project's venv is 3.11), so it gets its own venv
# ($HERMES_HARBOR_VENV, default /work/venvs/harbor): the first python3.13 / python3.12 on PATH
# or under pyenv. Harbor drives Docker through the `docker compose` v2 plugin, which Debian
# bookworm does not ship: the plugin comes from Debian trixie's `docker-compose` package,
# downloaded with apt-get into a private list and cache directory (nothing is installed on
# the host) and extracted into $VENV/docker-config/cli-plugins; point DOCKER_CONFIG there.
# Offline facts: Harbor's LiteLLM tries to fetch a model price list at start (it fails, warns
# and falls back to its bundled copy); the oracle agent needs no model.
set -euo pipefail

VENV="${HERMES_HARBOR_VENV:-/work/venvs/harbor}"
HARBOR_VERSION="${HERMES_HARBOR_VERSION:-0.25.0}"
MIRROR="${HERMES_BASE_MIRROR:-http://deb.debian.org/debian}"

log() { echo "[harbor-venv] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

find_python() {
    local candidate
    for candidate in python3.13 python3.12; do
        if command -v "$candidate" >/dev/null 2>&1; then command -v "$candidate"; return 0; fi
    done
    for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[23]*/bin/python3; do
        if [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
    done
    return 1
}

if [ ! -x "$VENV/bin/harbor" ]; then
    python="$(find_python)" || die "Harbor needs Python >= 3.12; none found (python3.12/3.13 or pyenv)"
    log "creating $VENV with $python, installing harbor==$HARBOR_VERSION"
    "$python" -m venv "$VENV"
    "$VENV/bin/pip" install -q "harbor==$HARBOR_VERSION" >&2 || die "pip install harbor failed"
fi

PLUGIN="$VENV/docker-config/cli-plugins/docker-compose"
if [ ! -x "$PLUGIN" ]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR trixie main" \
        >"$work/sources.list"
    apt_opts=(-q -o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache")
    log "downloading Debian trixie's docker-compose (the compose v2 plugin)"
    timeout 300 apt-get "${apt_opts[@]}" update >&2 || die "apt-get update (trixie lists) failed"
    (cd "$work" && timeout 300 apt-get "${apt_opts[@]}" download docker-compose >&2) \
        || die "apt-get download docker-compose failed"
    dpkg-deb -x "$work"/docker-compose_*.deb "$work/x"
    mkdir -p "$(dirname "$PLUGIN")"
    cp "$work/x/usr/libexec/docker/cli-plugins/docker-compose" "$PLUGIN"
fi
DOCKER_CONFIG="$VENV/docker-config" docker compose version >&2 || die "docker compose does not run"
echo "export HARBOR=$VENV/bin/harbor DOCKER_CONFIG=$VENV/docker-config"

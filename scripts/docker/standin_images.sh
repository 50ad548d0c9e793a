#!/usr/bin/env bash
# Build offline stand-ins for the registry images Harbor / Terminal-Bench tasks build FROM.
#
#   scripts/docker/standin_images.sh build [NAME...]   build the named stand-ins (default: all)
#   scripts/docker/standin_images.sh list              say what each stand-in is and its tags
#
# No container registry is reachable here, so `FROM python:3.12-slim` cannot be pulled. Each
# stand-in is a Debian rootfs made from Debian's packages alone (the rootfs of
# scripts/docker/base_image.sh, or a debootstrap of trixie), plus the packages that give the
# image its purpose, imported and tagged with the names tasks use. Every stand-in carries the
# label hermes-async.standin="<what it really is>", and a Terminal-Bench trial that runs on
# one says so in its notes. Where Debian has no exact match the nearest version stands in
# (python 3.10 and 3.12 are 3.11 and 3.13; Ubuntu is Debian bookworm) and the label says so.
#
# Real Harbor verifiers fetch their tools at grading time (curl | sh for uv, then
# `uvx --with pytest==8.4.1 --with pytest-json-ctrf==0.3.5 pytest ...`). Each stand-in carries
# that toolchain baked in: pytest 8.4.1 and pytest-json-ctrf 0.3.5 (pip, from PyPI, at build
# time) under /usr/local/lib/hermes-verifier, an offline `uvx` / `uv run`
# (scripts/docker/standin/uvx: runs the tool from it, ignores --with pins and says so) and
# $HOME/.local/bin/env for root. Such a test.sh is still flagged as needing the network; run it
# with --env.allow_network_tasks run, and its row says so.
#
# Cached like the base image: one tarball per stand-in recipe in
# $HERMES_ASYNC_CACHE/standin/ (default ~/.cache/hermes-async/standin/); `build` re-imports a
# cached tarball and skips an image whose recipe label is current. Needs root (chroot,
# debootstrap) and reaches Debian's mirror (HERMES_BASE_MIRROR). CPU-heavy: build once.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MIRROR="${HERMES_BASE_MIRROR:-http://deb.debian.org/debian}"
CACHE_ROOT="${HERMES_ASYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hermes-async}"
CACHE="$CACHE_ROOT/standin"
STEP_SECONDS="${HERMES_STANDIN_TIMEOUT_SECONDS:-1800}"
IMAGE_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RECIPE_VERSION=2
VERIFIER_PINS="pytest==8.4.1 pytest-json-ctrf==0.3.5 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.19.2"
PIP="${HERMES_STANDIN_PIP:-python3 -m pip}"
# What every stand-in has (the base image's set: bash, timeout, tar, procps, python3, pytest, git).
BASE_PACKAGES="bash,coreutils,findutils,grep,sed,tar,gzip,procps,python3,python3-pytest,git"

# name | suite | extra packages | what it really is | tags
STANDINS=(
  "python311|bookworm|python3-pip python3-venv python-is-python3|Debian bookworm, python 3.11|python:3.11-slim python:3.11 python:3.11-slim-bookworm python:3.11-bookworm"
  "python310|bookworm|python3-pip python3-venv python-is-python3|Debian bookworm, python 3.11 standing in for 3.10|python:3.10-slim python:3.10 python:3.10-slim-bookworm"
  "python313|trixie|python3-pip python3-venv python-is-python3|Debian trixie, python 3.13|python:3.13-slim python:3.13 python:3.13-slim-bookworm python:3.13-slim-trixie ghcr.io/laude-institute/t-bench/python-3-13:20250620"
  "python312|trixie|python3-pip python3-venv python-is-python3|Debian trixie, python 3.13 standing in for 3.12|python:3.12-slim python:3.12 python:3.12-slim-bookworm"
  "debian|bookworm||Debian bookworm (minbase + python3, git)|debian:bookworm debian:bookworm-slim debian:12 debian:12-slim"
  "ubuntu|bookworm||Debian bookworm standing in for Ubuntu|ubuntu:22.04 ubuntu:24.04 ubuntu:26.04 ubuntu:latest ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624"
  "gcc|bookworm|build-essential|Debian bookworm, gcc 12 (build-essential)|gcc:12 gcc:13 gcc:14 gcc:latest"
  "golang|bookworm|golang-go build-essential|Debian bookworm, Go 1.19 (golang-go)|golang:1.19 golang:1.21 golang:1.22 golang:1.23 golang:latest"
  "jdk|bookworm|openjdk-17-jdk-headless|Debian bookworm, OpenJDK 17|eclipse-temurin:17 openjdk:17 eclipse-temurin:17-jdk"
)

log() { echo "[standin] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

field() { echo "$1" | cut -d'|' -f"$2"; }

recipe_of() { printf '%s\n' "$RECIPE_VERSION" "$1" "$VERIFIER_PINS" | sha256sum | cut -c1-16; }

# A rootfs tarball is keyed by its suite and packages only (a new toolchain reuses it).
ROOTFS_VERSION=1
rootfs_key() { printf '%s\n' "$ROOTFS_VERSION" "$1" | sha256sum | cut -c1-16; }

verifier_toolchain() {
    # pytest and its plugin for any Python 3 (pure wheels), once, into $CACHE/verifier-<pins>.
    local dir
    dir="$CACHE/verifier-$(printf '%s' "$VERIFIER_PINS" | sha256sum | cut -c1-12)"
    if [ ! -d "$dir" ]; then
        # shellcheck disable=SC2086
        $PIP install -q --target "$dir.tmp" --no-deps --only-binary=:all: --no-compile \
            $VERIFIER_PINS >&2 || die "pip install of the verifier toolchain failed"
        rm -rf "$dir.tmp/bin"
        mv "$dir.tmp" "$dir"
    fi
    echo "$dir"
}

first_tag() { field "$1" 5 | cut -d' ' -f1; }

image_recipe() {
    docker image inspect --format '{{index .Config.Labels "hermes-async.standin.recipe"}}' "$1" \
        2>/dev/null || true
}

unmount_under() {
    local m
    for m in $(awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
}

rootfs_of() {
    # A minbase rootfs of SUITE with PACKAGES into $3, by debootstrap (it checks Debian's
    # signatures with the host's keyring); bookworm without extras is base_image.sh's rootfs.
    local suite=$1 packages=$2 root=$3
    if [ "$suite" = bookworm ] && [ -z "$packages" ]; then
        "$REPO/scripts/docker/base_image.sh" build >&2
        local tarball
        tarball="$(ls -t "$CACHE_ROOT"/base-image/bookworm-*.tar 2>/dev/null | head -n1)"
        [ -n "$tarball" ] || die "no cached bookworm rootfs from base_image.sh"
        tar --numeric-owner -xf "$tarball" -C "$root"
        return 0
    fi
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] \
        || die "debootstrap is not installed (apt-get install debootstrap)"
    local include="$BASE_PACKAGES${packages:+,${packages// /,}}"
    PATH="$PATH:/usr/sbin:/sbin" timeout "$STEP_SECONDS" debootstrap --variant=minbase \
        --include="$include" "$suite" "$root" "$MIRROR" >"$root.log" 2>&1 \
        || { tail -n 30 "$root.log" >&2; die "debootstrap $suite ($include) failed"; }
    unmount_under "$root"
}

build_one() {
    local spec=$1 name suite packages what tags recipe tarball work root tag
    name=$(field "$spec" 1); suite=$(field "$spec" 2); packages=$(field "$spec" 3)
    what=$(field "$spec" 4); tags=$(field "$spec" 5)
    recipe=$(recipe_of "$spec")
    tag=$(first_tag "$spec")
    if [ "$(image_recipe "$tag")" = "$recipe" ]; then
        log "$name: current ($tags)"
        return 0
    fi
    # Stand-ins with the same suite and packages share one rootfs tarball.
    tarball="$CACHE/$suite-$(rootfs_key "$suite|$packages").tar"
    if [ ! -s "$tarball" ]; then
        work="$(mktemp -d "$CACHE/work-$name.XXXXXX")"
        root="$work/rootfs"
        mkdir -p "$root"
        # shellcheck disable=SC2064
        trap "unmount_under '$work'; rm -rf '$work'" RETURN
        log "$name: rootfs ($suite${packages:+ + $packages}; a few minutes)"
        rootfs_of "$suite" "$packages" "$root"
        printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
        chmod 755 "$root/usr/sbin/policy-rc.d"
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
            "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/dev/*
        tar --numeric-owner -C "$root" -cf "$work/rootfs.tar" .
        mv -f "$work/rootfs.tar" "$tarball"
    else
        log "$name: re-importing $tarball"
    fi
    local rootfs_image="hermes-async-standin-rootfs:$name"
    docker import \
        --change 'CMD ["/bin/bash"]' \
        --change "ENV PATH=$IMAGE_PATH" \
        --change 'ENV LANG=C.UTF-8' \
        --change 'WORKDIR /' \
        "$tarball" "$rootfs_image" >/dev/null || die "$name: docker import failed"
    # The verifier toolchain as one more layer (COPY only: the build needs no network).
    local ctx
    ctx="$(mktemp -d "$CACHE/layer-$name.XXXXXX")"
    cp -a "$(verifier_toolchain)" "$ctx/hermes-verifier"
    mkdir -p "$ctx/bin" "$ctx/local-bin"
    cp "$REPO/scripts/docker/standin/uvx" "$ctx/bin/uvx"
    cp "$REPO/scripts/docker/standin/uvx" "$ctx/bin/uv"
    printf 'export PATH="$HOME/.local/bin:$PATH"\n' >"$ctx/local-bin/env"
    # COPY only: no RUN, so the layer builds without any network on any builder.
    cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $rootfs_image
COPY hermes-verifier /usr/local/lib/hermes-verifier
COPY bin/ /usr/local/bin/
COPY local-bin/ /root/.local/bin/
LABEL hermes-async.standin="$what + verifier toolchain ($VERIFIER_PINS, offline uvx)"
LABEL hermes-async.standin.recipe=$recipe
DOCKERFILE
    docker build -q -t "$tag" "$ctx" >/dev/null || { rm -rf "$ctx"; die "$name: toolchain layer failed"; }
    rm -rf "$ctx"
    local t
    for t in $tags; do docker tag "$tag" "$t"; done
    log "$name: ready: $tags ($what)"
}

cmd_build() {
    timeout 10 docker version >/dev/null 2>&1 || die "no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-unset})"
    [ "$(id -u)" = 0 ] || die "needs root (chroot, debootstrap)"
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock -w "$STEP_SECONDS" 9 || die "another build holds $CACHE/.lock"
    local spec wanted=("$@") built=0
    for spec in "${STANDINS[@]}"; do
        if [ ${#wanted[@]} -gt 0 ] && ! printf '%s\n' "${wanted[@]}" | grep -qx "$(field "$spec" 1)"; then
            continue
        fi
        build_one "$spec"
        built=$((built + 1))
    done
    [ "$built" -gt 0 ] || die "no stand-in named ${wanted[*]}; see $0 list"
}

cmd_list() {
    local spec
    for spec in "${STANDINS[@]}"; do
        printf '%-10s %s\n           tags: %s\n' "$(field "$spec" 1)" "$(field "$spec" 4)" "$(field "$spec" 5)"
    done
}

case "${1:-build}" in
    build) shift || true; cmd_build "$@" ;;
    list) cmd_list ;;
    *) echo "usage: $0 {build [NAME...]|list}" >&2; exit 2 ;;
esac

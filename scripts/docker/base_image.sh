#!/usr/bin/env bash
# Build the offline task base image `hermes-async-base:bookworm` from Debian's packages alone.
#
#   scripts/docker/base_image.sh build    build (or re-import) the image unless it is current
#   scripts/docker/base_image.sh status   say whether the image is on the engine and current
#   scripts/docker/base_image.sh rebuild  forget the image and the cached rootfs, then build
#
# Harbor-format tasks bundled with hermes_async start `FROM hermes-async-base:bookworm`, so
# they build and verify with no container registry: the image is a Debian bookworm rootfs
# made by debootstrap (--variant=minbase) from deb.debian.org, then `docker import`ed.
#
# What is in it, and why:
# * minbase already has bash, coreutils (with `timeout`), findutils, grep, sed, tar, gzip,
#   diffutils and passwd (`useradd` for tasks with a non-root agent user);
# * procps (ps, pkill for tasks and verifiers), python3 + python3-pytest (the verifiers of the
#   bundled tasks are pytest suites; real TB2 verifiers fetch pytest from the internet), git;
# * no recommends, no apt lists, no docs/man pages (smaller, and nothing a task needs).
#
# Caching, so that a rebuilt engine gets the image back in seconds:
# * the rootfs tarball is kept in $HERMES_ASYNC_CACHE/base-image/ (default
#   ~/.cache/hermes-async/base-image/), named after a hash of the recipe below;
# * the image carries the same hash in ENV HERMES_ASYNC_BASE_RECIPE; `build` does nothing
#   when the tagged image has the current hash, re-imports the tarball when only the image is
#   missing, and runs debootstrap only when neither exists (or the recipe changed);
# * concurrent callers (two test sessions, CI and a developer) serialise on a lock file.
#
# Talks to the engine named by DOCKER_HOST (the docker CLI's own rule). Needs root for
# debootstrap (it chroots and creates device nodes). Knobs: HERMES_ASYNC_CACHE,
# HERMES_BASE_IMAGE (the tag), HERMES_BASE_MIRROR (default http://deb.debian.org/debian),
# HERMES_BASE_TIMEOUT_SECONDS (debootstrap deadline, default 1200).
set -euo pipefail

IMAGE="${HERMES_BASE_IMAGE:-hermes-async-base:bookworm}"
SUITE="bookworm"
MIRROR="${HERMES_BASE_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="bash,coreutils,findutils,grep,sed,tar,gzip,procps,python3,python3-pytest,git"
DEBOOTSTRAP_SECONDS="${HERMES_BASE_TIMEOUT_SECONDS:-1200}"
IMPORT_SECONDS=300
CACHE_ROOT="${HERMES_ASYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hermes-async}"
CACHE="$CACHE_ROOT/base-image"
# Bump RECIPE_VERSION when the rootfs steps below change in a way the package list does not show.
RECIPE_VERSION=1
RECIPE="$(printf '%s\n' "$RECIPE_VERSION" "$SUITE" "$PACKAGES" | sha256sum | cut -c1-16)"
TARBALL="$CACHE/bookworm-$RECIPE.tar"
IMAGE_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

log() { echo "[base-image] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

image_recipe() {
    # The recipe hash the tagged image was built from, or nothing when the image is missing.
    docker image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" 2>/dev/null \
        | sed -n 's/^HERMES_ASYNC_BASE_RECIPE=//p'
}

image_is_current() { [ "$(image_recipe)" = "$RECIPE" ]; }

engine_check() {
    timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
        || die "no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-unset}); start one with scripts/docker/engine.sh up"
}

unmount_under() {
    # debootstrap mounts proc/sys inside the target; a killed run may leave them mounted.
    local m
    for m in $(awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
}

have_debootstrap() {
    command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ]
}

make_rootfs() {
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    if ! have_debootstrap; then
        # A fresh machine (CI): install Debian's debootstrap, as engine.sh installs docker.io.
        command -v apt-get >/dev/null 2>&1 \
            || die "debootstrap is not installed and there is no apt-get to install it"
        log "installing debootstrap (apt-get)"
        export DEBIAN_FRONTEND=noninteractive
        timeout 300 apt-get update -qq >&2 || die "apt-get update failed"
        timeout 600 apt-get install -y -qq --no-install-recommends debootstrap >&2 \
            || die "apt-get install debootstrap failed"
        have_debootstrap || die "debootstrap is still not installed after apt-get"
    fi
    local work root t
    work="$(mktemp -d "$CACHE/work.XXXXXX")"
    root="$work/rootfs"
    # shellcheck disable=SC2064
    trap "unmount_under '$work'; rm -rf '$work'" EXIT
    t="$(now)"
    log "debootstrap $SUITE minbase + $PACKAGES from $MIRROR (a few minutes)"
    PATH="$PATH:/usr/sbin:/sbin" timeout "$DEBOOTSTRAP_SECONDS" debootstrap \
        --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" \
        >"$work/debootstrap.log" 2>&1 || {
        tail -n 30 "$work/debootstrap.log" >&2 || true
        die "debootstrap failed (log above)"
    }
    log "debootstrap: $(elapsed "$t")s"
    unmount_under "$work"
    # Nothing a task needs, and the image is smaller without it. /dev is the engine's job.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
        "$root"/var/log/*.log "$root"/var/cache/debconf/*-old "$root"/dev/*
    # No daemon may start inside the image at package-install time in derived images.
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    tar --numeric-owner --xattrs -C "$root" -cf "$work/rootfs.tar" .
    mv -f "$work/rootfs.tar" "$TARBALL"
    # Older recipes' tarballs are dead weight.
    find "$CACHE" -maxdepth 1 -name 'bookworm-*.tar' ! -name "bookworm-$RECIPE.tar" -delete
    trap - EXIT
    unmount_under "$work"
    rm -rf "$work"
}

import_image() {
    local t
    t="$(now)"
    timeout "$IMPORT_SECONDS" docker import \
        --change 'CMD ["/bin/bash"]' \
        --change "ENV PATH=$IMAGE_PATH" \
        --change 'ENV LANG=C.UTF-8' \
        --change "ENV HERMES_ASYNC_BASE_RECIPE=$RECIPE" \
        --change 'WORKDIR /' \
        "$TARBALL" "$IMAGE" >/dev/null || die "docker import of $TARBALL failed"
    log "import: $(elapsed "$t")s"
}

cmd_build() {
    engine_check
    if image_is_current; then
        log "$IMAGE is current (recipe $RECIPE)"
        return 0
    fi
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock -w "$DEBOOTSTRAP_SECONDS" 9 || die "another build holds $CACHE/.lock"
    # The lock holder before us may have built it.
    if image_is_current; then
        log "$IMAGE is current (recipe $RECIPE)"
        return 0
    fi
    local t0
    t0="$(now)"
    if [ -s "$TARBALL" ]; then
        log "re-importing the cached rootfs $TARBALL"
    else
        make_rootfs
    fi
    import_image
    local size
    size="$(docker image inspect --format '{{.Size}}' "$IMAGE")"
    log "$IMAGE ready in $(elapsed "$t0")s ($((size / 1000000)) MB, recipe $RECIPE)"
}

cmd_status() {
    engine_check
    local have
    have="$(image_recipe)"
    if [ "$have" = "$RECIPE" ]; then
        log "$IMAGE is current (recipe $RECIPE)"
    elif [ -n "$have" ]; then
        log "$IMAGE is stale (recipe $have, want $RECIPE): run $0 build"
        return 1
    else
        log "$IMAGE is missing: run $0 build"
        return 1
    fi
}

cmd_rebuild() {
    engine_check
    docker image rm -f "$IMAGE" >/dev/null 2>&1 || true
    rm -f "$TARBALL"
    cmd_build
}

case "${1:-build}" in
    build) cmd_build ;;
    status) cmd_status ;;
    rebuild) cmd_rebuild ;;
    *) echo "usage: $0 {build|status|rebuild}" >&2; exit 2 ;;
esac

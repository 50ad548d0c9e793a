#!/usr/bin/env bash
# Provision, check and stop a private Docker engine for the docker-marked tests.
#
#   scripts/docker/engine.sh up      install dockerd if missing, start it on a private unix
#                                    socket, build the test image offline; print
#                                    `export DOCKER_HOST=...` on stdout (logs go to stderr)
#   scripts/docker/engine.sh down    remove our containers, stop the engine, clean up
#   scripts/docker/engine.sh status  say whether the engine answers
#   scripts/docker/engine.sh env     print the export line only
#   scripts/docker/engine.sh base    build the offline task base image hermes-async-base:bookworm
#                                    on the engine (scripts/docker/base_image.sh; cached)
#
# Usage in a shell:   eval "$(scripts/docker/engine.sh up)"; ...; scripts/docker/engine.sh down
#
# Why these choices (decided on a Debian bookworm machine that reaches Debian's mirror but no
# container registry):
# * Debian's docker.io (dockerd 20.10) rather than podman: it installs in seconds, needs no
#   containers.conf, and its Docker API is the one aiodocker is written against.
# * A private socket, data root and exec root under $HERMES_DOCKER_DIR (default
#   <repo>/.docker-engine, or /tmp/hermes-async-docker-<hash> when the checkout's path is too
#   long for a unix socket) so the engine never touches a system-wide Docker.
# * `--bridge=none --iptables=false --ip6tables=false`: the tests run containers with
#   network mode "none", so the engine creates no docker0 bridge and no iptables chains, and
#   stopping it leaves nothing behind on the host's network. Set HERMES_DOCKER_BRIDGE=1 to
#   get the default bridge (then `down` removes docker0 and the DOCKER chains it made).
# * Images are built from a local rootfs (no registry is reachable): busybox-static plus its
#   applets -> `hermes-async-busybox:local` (< 1 s). With HERMES_DOCKER_PYTHON_IMAGE=1 also a
#   Debian minbase + python3 image via debootstrap -> `hermes-async-python:local` (about a
#   minute; not needed by the tests). With HERMES_DOCKER_BASE_IMAGE=1 (or `engine.sh base`)
#   also `hermes-async-base:bookworm` for the Harbor tasks (scripts/docker/base_image.sh: about
#   50 s the first time, a few seconds from its cached rootfs tarball after a `down`).
#
# `down` removes $HERMES_DOCKER_DIR entirely (images included; rebuilding takes < 1 s) unless
# HERMES_DOCKER_KEEP_DATA=1.
#
# Requires root (installs packages, starts dockerd). Idempotent: `up` twice reuses the engine.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${HERMES_DOCKER_DIR:-$REPO/.docker-engine}"
# Unix socket paths are limited to 107 bytes, and containerd's socket lives deeper under the
# exec root: a checkout in a long path gets a short directory under /tmp instead.
if [ -z "${HERMES_DOCKER_DIR:-}" ] && [ "${#DIR}" -gt 60 ]; then
    DIR="/tmp/hermes-async-docker-$(printf '%s' "$REPO" | md5sum | cut -c1-8)"
fi
SOCK="$DIR/docker.sock"
PIDFILE="$DIR/dockerd.pid"
LOG="$DIR/dockerd.log"
READY_SECONDS="${HERMES_DOCKER_READY_SECONDS:-60}"
BUSYBOX_IMAGE="hermes-async-busybox:local"
PYTHON_IMAGE="hermes-async-python:local"
LABEL="hermes-async"

log() { echo "[docker-engine] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

dk() { docker -H "unix://$SOCK" "$@"; }

engine_answers() {
    [ -S "$SOCK" ] && timeout 5 docker -H "unix://$SOCK" version --format '{{.Server.Version}}' >/dev/null 2>&1
}

install_packages() {
    local need=()
    command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
    [ -x /bin/busybox ] || need+=(busybox-static)
    if [ "${HERMES_DOCKER_PYTHON_IMAGE:-0}" = 1 ] || [ "${HERMES_DOCKER_BASE_IMAGE:-0}" = 1 ]; then
        command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
    fi
    [ ${#need[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || die "need root to install ${need[*]} (or install them yourself)"
    log "installing ${need[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get update -qq >&2 || die "apt-get update failed"
    timeout 600 apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
        || die "apt-get install ${need[*]} failed"
}

start_engine() {
    if engine_answers; then
        log "engine already answers on $SOCK"
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "need root to start dockerd"
    mkdir -p "$DIR/data" "$DIR/exec"
    # A stale pid file or socket from a killed run would make dockerd refuse to start.
    if [ -f "$PIDFILE" ] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then rm -f "$PIDFILE"; fi
    rm -f "$SOCK"
    local net=(--bridge=none --iptables=false --ip6tables=false)
    [ "${HERMES_DOCKER_BRIDGE:-0}" = 1 ] && net=()
    log "starting dockerd on unix://$SOCK (log: $LOG)"
    # setsid: the engine must not share our process group (a Ctrl-C in `make` would kill it
    # before `down` could remove containers cleanly).
    setsid dockerd \
        --host "unix://$SOCK" \
        --data-root "$DIR/data" \
        --exec-root "$DIR/exec" \
        --pidfile "$PIDFILE" \
        --userland-proxy=false \
        "${net[@]}" \
        </dev/null >"$LOG" 2>&1 &
    local deadline=$(( $(date +%s) + READY_SECONDS ))
    until engine_answers; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            tail -n 30 "$LOG" >&2 || true
            die "dockerd did not answer on $SOCK within ${READY_SECONDS}s"
        fi
        if [ -f "$PIDFILE" ] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
            tail -n 30 "$LOG" >&2 || true
            die "dockerd exited during start-up"
        fi
        sleep 0.2
    done
}

build_busybox_image() {
    if dk image inspect "$BUSYBOX_IMAGE" >/dev/null 2>&1; then return 0; fi
    log "building $BUSYBOX_IMAGE from /bin/busybox"
    local root
    root="$(mktemp -d "$DIR/rootfs.XXXXXX")"
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,root,tmp,proc,sys,dev,run,var/tmp}
    chmod 1777 "$root/tmp" "$root/var/tmp"
    chmod 700 "$root/root"
    cp /bin/busybox "$root/bin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
        >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    tar -C "$root" -cf "$DIR/busybox-rootfs.tar" .
    dk import \
        --change 'CMD ["/bin/sh"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'WORKDIR /root' \
        "$DIR/busybox-rootfs.tar" "$BUSYBOX_IMAGE" >/dev/null
    rm -rf "$root" "$DIR/busybox-rootfs.tar"
}

build_python_image() {
    [ "${HERMES_DOCKER_PYTHON_IMAGE:-0}" = 1 ] || return 0
    if dk image inspect "$PYTHON_IMAGE" >/dev/null 2>&1; then return 0; fi
    log "building $PYTHON_IMAGE with debootstrap (bookworm minbase + python3)"
    local root="$DIR/python-rootfs"
    rm -rf "$root"
    timeout 900 debootstrap --variant=minbase --include=python3 bookworm "$root" \
        http://deb.debian.org/debian >&2 || die "debootstrap failed"
    tar -C "$root" -cf "$DIR/python-rootfs.tar" .
    dk import --change 'CMD ["/bin/bash"]' --change 'WORKDIR /root' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        "$DIR/python-rootfs.tar" "$PYTHON_IMAGE" >/dev/null
    rm -rf "$root" "$DIR/python-rootfs.tar"
}

build_base_image() {
    # The rootfs tarball is cached outside $DIR ($HERMES_ASYNC_CACHE), so it survives `down`.
    DOCKER_HOST="unix://$SOCK" "$REPO/scripts/docker/base_image.sh" build >&2 \
        || die "building hermes-async-base:bookworm failed"
}

cmd_up() {
    local t0 t
    t0="$(now)"
    t="$(now)"; install_packages; log "install: $(elapsed "$t")s"
    t="$(now)"; start_engine;     log "engine start: $(elapsed "$t")s"
    t="$(now)"; build_busybox_image; build_python_image; log "image build: $(elapsed "$t")s"
    if [ "${HERMES_DOCKER_BASE_IMAGE:-0}" = 1 ]; then
        t="$(now)"; build_base_image; log "base image: $(elapsed "$t")s"
    fi
    log "ready in $(elapsed "$t0")s: DOCKER_HOST=unix://$SOCK, test image $BUSYBOX_IMAGE"
    echo "export DOCKER_HOST=unix://$SOCK"
    echo "export HERMES_ASYNC_DOCKER_TEST_IMAGE=$BUSYBOX_IMAGE"
}

cmd_down() {
    if engine_answers; then
        local ids
        ids="$(dk ps -aq --filter "label=$LABEL" || true)"
        if [ -n "$ids" ]; then
            log "removing $(echo "$ids" | wc -l) leftover labelled container(s)"
            # shellcheck disable=SC2086
            timeout 60 docker -H "unix://$SOCK" rm -f $ids >/dev/null 2>&1 || true
        fi
    fi
    if [ -f "$PIDFILE" ]; then
        local pid
        pid="$(cat "$PIDFILE")"
        if kill -0 "$pid" 2>/dev/null; then
            log "stopping dockerd (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            local i
            for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            if kill -0 "$pid" 2>/dev/null; then
                log "dockerd did not stop within 20s; killing it"
                kill -KILL "$pid" 2>/dev/null || true
            fi
        fi
        rm -f "$PIDFILE"
    fi
    # Container shims dockerd started and that outlived it (only if it was killed).
    pkill_shims
    # Mounts left under our private roots (overlay layers, netns files).
    if [ -d "$DIR" ]; then
        local m
        for m in $(awk -v d="$DIR" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r); do
            umount -l "$m" 2>/dev/null || true
        done
    fi
    if [ "${HERMES_DOCKER_BRIDGE:-0}" = 1 ]; then
        ip link delete docker0 2>/dev/null || true
        if command -v iptables >/dev/null 2>&1; then
            for chain in DOCKER-USER DOCKER-ISOLATION-STAGE-2 DOCKER-ISOLATION-STAGE-1 DOCKER; do
                iptables -t filter -F "$chain" 2>/dev/null || true
            done
            iptables -t nat -F DOCKER 2>/dev/null || true
        fi
    fi
    rm -f "$SOCK"
    if [ "${HERMES_DOCKER_KEEP_DATA:-0}" != 1 ]; then rm -rf "$DIR"; fi
    log "stopped"
}

pkill_shims() {
    # Only shims whose command line names our private exec root: never anyone else's.
    local pid
    for pid in $(pgrep -f "containerd-shim.*$DIR/" 2>/dev/null || true); do
        kill -KILL "$pid" 2>/dev/null || true
    done
}

cmd_status() {
    if engine_answers; then
        log "engine answers on unix://$SOCK ($(dk version --format '{{.Server.Version}}'))"
    else
        log "no engine answers on unix://$SOCK"
        return 1
    fi
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) echo "export DOCKER_HOST=unix://$SOCK"; echo "export HERMES_ASYNC_DOCKER_TEST_IMAGE=$BUSYBOX_IMAGE" ;;
    base) engine_answers || die "no engine answers on unix://$SOCK: run $0 up first"; build_base_image ;;
    *) echo "usage: $0 {up|down|status|env|base}" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Make sure this machine can run namespaced local sandboxes (idempotent).
#
#   scripts/sandbox/install.sh          install what is missing (Debian packages), then check
#   scripts/sandbox/install.sh check    only check (exit 1 and say what is missing)
#
# The local backend's isolation="namespaces" (hermes_async/tools/sandbox/namespaces.py) needs:
# * root (each command enters its sandbox's namespaces with nsenter),
# * bwrap (Debian `bubblewrap`): builds each sandbox's world (PID, mount, IPC, UTS, cgroup and
#   network namespaces, a private /proc, the reaper as PID 1),
# * nsenter and unshare (`util-linux`), losetup and mount (`mount`): the world and its disk,
# * mkfs.ext4 (`e2fsprogs`) and a loop device for the disk cap (without them: a tmpfs cap),
# * writable cgroup v1 `memory` and `pids` hierarchies for the memory and pids limits (checked
#   and reported here; not something a package installs).
# The tests also run `curl`, `ps` (`procps`) and `python3` inside sandboxes; they are installed
# too (a sandbox sees the host's /usr read-only, so what is installed here is what it has).
#
# Where this cannot be satisfied, creating a local sandbox is an error naming what is missing
# and the explicit opt-out (isolation="process", or HERMES_SANDBOX_ISOLATION=process): nothing
# runs unisolated unless asked to. CI sets HERMES_ASYNC_REQUIRE_ISOLATION=1 after running this,
# so a missing piece fails the tests instead of skipping them. Requires root to install. Logs
# go to stderr.
set -euo pipefail

log() { echo "[sandbox] $*" >&2; }

# name of a missing command -> the Debian package that has it
declare -A PACKAGE_OF=(
    [bwrap]=bubblewrap
    [nsenter]=util-linux
    [unshare]=util-linux
    [losetup]=mount
    [mkfs.ext4]=e2fsprogs
    [curl]=curl
    [ps]=procps
    [python3]=python3
)

missing_packages() {
    local tool
    for tool in "${!PACKAGE_OF[@]}"; do
        if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1; then
            echo "${PACKAGE_OF[$tool]}"
        fi
    done | sort -u
}

check() {
    local ok=0 pkgs
    pkgs="$(missing_packages)"
    if [ -n "$pkgs" ]; then
        log "missing packages: $(echo "$pkgs" | tr '\n' ' ')"
        ok=1
    fi
    if [ "$(id -u)" -ne 0 ]; then
        log "not root: namespaced sandboxes need root (nsenter into each sandbox)"
        ok=1
    fi
    if command -v bwrap >/dev/null 2>&1; then
        # The paths a sandbox shows (namespaces.DEFAULT_RO_PATHS), symlinks kept as symlinks.
        local binds=() p
        for p in /usr /bin /sbin /lib /lib32 /lib64 /libx32 /etc; do
            if [ -L "$p" ]; then binds+=(--symlink "$(readlink "$p")" "$p")
            elif [ -d "$p" ]; then binds+=(--ro-bind "$p" "$p"); fi
        done
        if ! bwrap --unshare-pid --unshare-net --unshare-ipc --unshare-uts "${binds[@]}" \
            --proc /proc --dev /dev -- /bin/sh -c 'exit 0' 2>/dev/null; then
            log "bwrap is installed but cannot build a world here (a container without" \
                "CAP_SYS_ADMIN? run privileged)"
            ok=1
        fi
    fi
    local controller
    for controller in memory pids; do
        if [ -w "/sys/fs/cgroup/$controller" ]; then
            log "cgroup v1 $controller: writable"
        else
            # Not fatal: sandboxes run without that limit and the library warns once.
            log "WARNING: no writable cgroup v1 /sys/fs/cgroup/$controller: sandboxes get no" \
                "$controller limit"
        fi
    done
    if [ -e /dev/loop-control ]; then
        log "loop devices: available (disk cap on an ext4 image)"
    else
        log "WARNING: no /dev/loop-control: the disk cap uses a size-limited tmpfs"
    fi
    return "$ok"
}

if [ "${1:-}" = "check" ]; then
    check
    exit $?
fi

pkgs="$(missing_packages)"
if [ -n "$pkgs" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        log "missing: $(echo "$pkgs" | tr '\n' ' ')and not root: run \`sudo $0\`"
        exit 1
    fi
    command -v apt-get >/dev/null 2>&1 || {
        log "no apt-get: install $(echo "$pkgs" | tr '\n' ' ')with your package manager"
        exit 1
    }
    log "installing: $(echo "$pkgs" | tr '\n' ' ')"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $pkgs >&2
else
    log "all packages present"
fi
check
log "ready: namespaced local sandboxes work here ($(bwrap --version))"

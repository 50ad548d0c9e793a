#!/usr/bin/env bash
# Provision, check and stop a private OpenSSH server on loopback for the ssh-marked tests.
#
#   scripts/ssh/sshd.sh up      install Debian's openssh-server if missing, make a host key and
#                               a client key in a private directory, start `sshd -D` on
#                               127.0.0.1 on a free port; print `export HERMES_ASYNC_SSH_*=...`
#                               lines on stdout (logs go to stderr)
#   scripts/ssh/sshd.sh down    stop that sshd and remove the directory
#   scripts/ssh/sshd.sh status  say whether it answers
#   scripts/ssh/sshd.sh env     print the export lines only
#
# Usage in a shell:   eval "$(scripts/ssh/sshd.sh up)"; ...; scripts/ssh/sshd.sh down
#
# Why these choices:
# * Its own sshd_config, keys and pid file under $HERMES_SSHD_DIR (default
#   /tmp/hermes-async-sshd-<hash of the checkout>): the machine's own sshd (if any), its host
#   keys and root's ~/.ssh are never read or changed.
# * 127.0.0.1 only, public-key authentication only (no passwords, no PAM), a key made here and
#   authorised for this daemon only (AuthorizedKeysFile in the private directory).
# * `StrictModes no`: the private directory lives under /tmp (world-writable, sticky), which
#   sshd's ownership walk would otherwise refuse; the directory itself is 0700.
# * `MaxSessions 10`: OpenSSH's default, kept on purpose: the backend must work against a stock
#   server (it caps its channels per connection below this).
# * A known_hosts file holding this daemon's host key, so the tests run with host-key checking
#   on (the backend's default).
#
# Runs sshd as root (it must be able to switch to the login user); the login user is root.
# Idempotent: `up` twice reuses the running daemon.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${HERMES_SSHD_DIR:-/tmp/hermes-async-sshd-$(printf '%s' "$REPO" | md5sum | cut -c1-8)}"
PIDFILE="$DIR/sshd.pid"
LOG="$DIR/sshd.log"
CONFIG="$DIR/sshd_config"
PORTFILE="$DIR/port"
READY_SECONDS="${HERMES_SSHD_READY_SECONDS:-30}"
SSHD=/usr/sbin/sshd
USER_NAME="$(id -un)"

log() { echo "[sshd] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

install_packages() {
    local need=()
    [ -x "$SSHD" ] || need+=(openssh-server)
    command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
    [ ${#need[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || die "need root to install ${need[*]} (or install them yourself)"
    log "installing ${need[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get update -qq >&2 || die "apt-get update failed"
    # policy-rc.d: do not let the package start the system's own sshd.
    local policy=/usr/sbin/policy-rc.d created=0
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; created=1; fi
    timeout 600 apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
        || { [ "$created" = 1 ] && rm -f "$policy"; die "apt-get install ${need[*]} failed"; }
    [ "$created" = 1 ] && rm -f "$policy"
    return 0
}

running() {
    [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

answers() {
    [ -f "$PORTFILE" ] || return 1
    timeout 10 ssh -F /dev/null -o BatchMode=yes -o ConnectTimeout=5 \
        -o UserKnownHostsFile="$DIR/known_hosts" -o StrictHostKeyChecking=yes \
        -o IdentitiesOnly=yes -i "$DIR/client_key" -p "$(cat "$PORTFILE")" \
        "$USER_NAME@127.0.0.1" true >/dev/null 2>&1
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

make_keys() {
    mkdir -p "$DIR"
    chmod 700 "$DIR"
    [ -f "$DIR/host_key" ] || ssh-keygen -q -t ed25519 -N '' -C hermes-async-test-host -f "$DIR/host_key"
    [ -f "$DIR/client_key" ] || ssh-keygen -q -t ed25519 -N '' -C hermes-async-test-client -f "$DIR/client_key"
    cp "$DIR/client_key.pub" "$DIR/authorized_keys"
    chmod 600 "$DIR/authorized_keys"
}

write_config() {
    local port="$1"
    cat >"$CONFIG" <<EOF
ListenAddress 127.0.0.1
Port $port
HostKey $DIR/host_key
PidFile $PIDFILE
AuthorizedKeysFile $DIR/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxSessions 10
Subsystem sftp internal-sftp
PrintMotd no
LogLevel INFO
EOF
    echo "$port" >"$PORTFILE"
    printf '[127.0.0.1]:%s %s\n' "$port" "$(cut -d' ' -f1,2 "$DIR/host_key.pub")" >"$DIR/known_hosts"
}

start() {
    if running && answers; then
        log "sshd already answers on 127.0.0.1:$(cat "$PORTFILE")"
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "need root to start sshd"
    if running; then kill -TERM "$(cat "$PIDFILE")" 2>/dev/null || true; sleep 0.5; fi
    rm -f "$PIDFILE"
    make_keys
    local port
    port="$(free_port)"
    write_config "$port"
    mkdir -p /run/sshd  # the privilege-separation directory sshd insists on
    "$SSHD" -t -f "$CONFIG" || die "sshd rejected $CONFIG"
    log "starting sshd on 127.0.0.1:$port (log: $LOG)"
    # setsid: not in our process group (a Ctrl-C in the shell must not kill it before `down`).
    setsid "$SSHD" -D -f "$CONFIG" -E "$LOG" </dev/null >/dev/null 2>&1 &
    local deadline=$(( $(date +%s) + READY_SECONDS ))
    until answers; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            tail -n 30 "$LOG" >&2 || true
            die "sshd did not answer on 127.0.0.1:$port within ${READY_SECONDS}s"
        fi
        sleep 0.2
    done
}

print_env() {
    echo "export HERMES_ASYNC_SSH_HOST=127.0.0.1"
    echo "export HERMES_ASYNC_SSH_PORT=$(cat "$PORTFILE")"
    echo "export HERMES_ASYNC_SSH_USER=$USER_NAME"
    echo "export HERMES_ASYNC_SSH_KEY=$DIR/client_key"
    echo "export HERMES_ASYNC_SSH_KNOWN_HOSTS=$DIR/known_hosts"
}

cmd_up() {
    install_packages
    start
    log "ready: 127.0.0.1:$(cat "$PORTFILE") as $USER_NAME"
    print_env
}

cmd_down() {
    if [ -f "$PIDFILE" ]; then
        local pid
        pid="$(cat "$PIDFILE")"
        if kill -0 "$pid" 2>/dev/null; then
            log "stopping sshd (pid $pid)"
            # The listener only: its per-connection children end with their connections.
            kill -TERM "$pid" 2>/dev/null || true
            local i
            for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -rf "$DIR"
    log "stopped"
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) if running && answers; then log "answers on 127.0.0.1:$(cat "$PORTFILE")"; else log "not running"; exit 1; fi ;;
    env) [ -f "$PORTFILE" ] || die "not running: $0 up first"; print_env ;;
    *) echo "usage: $0 {up|down|status|env}" >&2; exit 2 ;;
esac

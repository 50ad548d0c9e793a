#!/usr/bin/env bash
# Start, check and stop a private Ray cluster on 127.0.0.1 for the ray-marked tests.
#
#   scripts/ray/cluster.sh up      build .venv-ray if missing, start a head and N worker nodes
#                                  (separate raylets joined with `ray start --address`); print
#                                  `export RAY_ADDRESS=...` on stdout (logs go to stderr)
#   scripts/ray/cluster.sh down    stop every process this cluster started, remove its files
#   scripts/ray/cluster.sh status  say whether the cluster answers, with its nodes
#   scripts/ray/cluster.sh env     print the export lines only
#
# Usage in a shell:   eval "$(scripts/ray/cluster.sh up)"; ...; scripts/ray/cluster.sh down
#
# Why these choices:
# * Every process binds to 127.0.0.1 (--node-ip-address), the dashboard is off, usage stats
#   are off (RAY_USAGE_STATS_ENABLED=0): the tests may reach loopback only.
# * Several raylets on one machine are the closest it gets to several machines (Ray's own
#   tests do the same with ray.cluster_utils.Cluster). Every port is picked free and given
#   explicitly, so the nodes never collide (the dashboard agent's default port is fixed).
# * The head has no CPUs: actors land on the worker nodes. Each node's object store is small
#   (RAY_OBJECT_STORE_BYTES, default 100 MB): the machine has 24 GB and 2 cores.
# * `down` never runs `ray stop` (it kills every Ray process of the machine, other users'
#   too). Every process started here carries HERMES_ASYNC_RAY_CLUSTER=<dir> in its
#   environment; `down` signals exactly the processes that do (TERM, grace, KILL), by pid.
#
# Env: RAY_VENV (default .venv-ray), HERMES_RAY_WORKERS (worker nodes, default 2),
#      HERMES_RAY_CPUS (logical CPUs per worker node, default 4), RAY_OBJECT_STORE_BYTES.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
RAY_VENV="${RAY_VENV:-.venv-ray}"
case "$RAY_VENV" in /*) ;; *) RAY_VENV="$REPO/$RAY_VENV" ;; esac
# Short: Ray puts unix sockets under its temp dir (107-byte limit).
DIR="/tmp/hermes-ray-$(printf '%s' "$REPO" | md5sum | cut -c1-8)"
WORKERS="${HERMES_RAY_WORKERS:-2}"
CPUS="${HERMES_RAY_CPUS:-4}"
STORE="${RAY_OBJECT_STORE_BYTES:-100000000}"
READY_SECONDS="${HERMES_RAY_READY_SECONDS:-90}"

log() { echo "[ray-cluster] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

export RAY_USAGE_STATS_ENABLED=0
# Ray replaces 127.0.0.1 by the machine's routable address (services.get_node_ip_address)
# unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and its gRPC servers listen on 127.0.0.1 only
# when a node's address is exactly that. Every Ray process here (nodes, workers, drivers: the
# `env` lines) has it 0. `ray start` then refuses to join a worker node ("multi-node clusters
# are not supported") and still resolves --node-ip-address through that function, so the CLI
# runs with the check passed and the address taken as given.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
RAY_CLI='import sys, ray._private.ray_constants as c, ray._private.services as s
s.resolve_ip_for_localhost = lambda host: host
c.ENABLE_RAY_CLUSTER = True
from ray.scripts.scripts import main
sys.exit(main())'
ray_start() { HERMES_ASYNC_RAY_CLUSTER="$DIR" "$RAY_VENV/bin/python" -c "$RAY_CLI" start "$@"; }
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

free_ports() {
    "$RAY_VENV/bin/python" - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

env_lines() {
    [ -f "$DIR/address" ] || die "no cluster: run scripts/ray/cluster.sh up"
    echo "export RAY_ADDRESS=$(cat "$DIR/address")"
    # (Not the marker's own name: a shell that evals these lines must not look like ours.)
    echo "export HERMES_ASYNC_RAY_DIR=$DIR"
    echo "export HERMES_ASYNC_RAY_VENV=$RAY_VENV"
    echo "export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"
}

answers() {
    [ -f "$DIR/address" ] || return 1
    RAY_ADDRESS="$(cat "$DIR/address")" timeout 60 "$RAY_VENV/bin/python" - "$1" <<'EOF'
import sys, ray
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
alive = [n for n in ray.nodes() if n["Alive"]]
print(len(alive), "nodes alive:", ", ".join(f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}" for n in alive))
sys.exit(0 if len(alive) >= int(sys.argv[1]) else 1)
EOF
}

# The pids whose environment carries this cluster's marker (only `ray start` is given it),
# never this script or its subshells.
our_pids() {
    local env pid
    for env in /proc/[0-9]*/environ; do
        pid="${env#/proc/}"; pid="${pid%/environ}"
        [ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ] || [ "$pid" = "$PPID" ] && continue
        if { tr '\0' '\n' <"$env" | grep -qx "HERMES_ASYNC_RAY_CLUSTER=$DIR"; } 2>/dev/null; then
            echo "$pid"
        fi
    done
    return 0
}

node_start() {  # $1: head|worker
    local ports
    read -r -a ports <<<"$(free_ports 6)"
    local common=(
        --node-ip-address=127.0.0.1
        --object-store-memory="$STORE"
        --node-manager-port="${ports[0]}"
        --object-manager-port="${ports[1]}"
        --dashboard-agent-listen-port="${ports[2]}"
        --dashboard-agent-grpc-port="${ports[3]}"
        --runtime-env-agent-port="${ports[4]}"
        --metrics-export-port="${ports[5]}"
        --disable-usage-stats
    )
    if [ "$1" = head ]; then
        local port
        port="$(free_ports 1)"
        ray_start --head --port="$port" --num-cpus=0 --include-dashboard=false \
            --temp-dir="$DIR" "${common[@]}" >>"$DIR/up.log" 2>&1 \
            || { tail -20 "$DIR/up.log" >&2; die "ray start --head failed (log: $DIR/up.log)"; }
        echo "127.0.0.1:$port" >"$DIR/address"
    else
        ray_start --address="$(cat "$DIR/address")" --num-cpus="$CPUS" \
            "${common[@]}" >>"$DIR/up.log" 2>&1 \
            || { tail -20 "$DIR/up.log" >&2; die "ray start --address failed (log: $DIR/up.log)"; }
    fi
}

up() {
    if answers $((WORKERS + 1)) >/dev/null 2>&1; then
        log "cluster already up ($DIR)"
        env_lines
        return 0
    fi
    down_quiet
    RAY_VENV="$RAY_VENV" bash scripts/ray/setup_venv.sh
    mkdir -p "$DIR"
    local started
    started=$(date +%s)
    log "starting the head on 127.0.0.1 and $WORKERS worker node(s) ($CPUS CPUs, $STORE B object store each)"
    node_start head
    for _ in $(seq "$WORKERS"); do node_start worker; done
    local deadline=$(( $(date +%s) + READY_SECONDS ))
    until answers $((WORKERS + 1)) >&2; do
        [ "$(date +%s)" -lt "$deadline" ] || die "the cluster did not come up in ${READY_SECONDS}s (log: $DIR/up.log)"
        sleep 1
    done
    log "up in $(( $(date +%s) - started )) s"
    env_lines
}

down_quiet() {
    local pids
    pids="$(our_pids | tr '\n' ' ')"
    if [ -n "${pids// /}" ]; then
        # shellcheck disable=SC2086
        kill -TERM $pids 2>/dev/null || true
        for _ in $(seq 50); do
            pids="$(for p in $pids; do [ -d "/proc/$p" ] && echo "$p"; done | tr '\n' ' ')"
            [ -z "${pids// /}" ] && break
            sleep 0.1
        done
        # shellcheck disable=SC2086
        [ -z "${pids// /}" ] || kill -KILL $pids 2>/dev/null || true
    fi
    rm -rf "$DIR"
}

case "${1:-}" in
    up) up ;;
    down) down_quiet; log "down" ;;
    status) answers 1 || { log "not answering ($DIR)"; exit 1; } ;;
    env) env_lines ;;
    *) echo "usage: scripts/ray/cluster.sh up|down|status|env" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# One line to stderr every INTERVAL seconds (default 60) while CI runs: memory, processes, and
# any kernel OOM kill outside a sandbox's own memory cgroup. A run killed from outside (exit 137)
# then shows what the machine looked like just before. Started and stopped by .ci/run.
#   scripts/ci/monitor.sh [INTERVAL [PARENT]]   (it ends when PARENT, default its own, is gone)
set -u
interval="${1:-60}"
parent="${2:-$PPID}"
start=$(date +%s)
memcg="/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup 2>/dev/null)"

kb() { awk -v k="$1:" '$1 == k { print int($2 / 1024) }' /proc/meminfo; }
limit="unlimited"
if [ -r "$memcg/memory.limit_in_bytes" ]; then
    l=$(cat "$memcg/memory.limit_in_bytes")
    [ "$l" -lt $((1 << 50)) ] && limit="$((l >> 20)) MB"
fi
echo "[ci-monitor] start: MemTotal $(kb MemTotal) MB, MemAvailable $(kb MemAvailable) MB," \
    "this run's memory cgroup limit $limit, pid_max $(cat /proc/sys/kernel/pid_max)," \
    "$(ls -d /proc/[0-9]* 2>/dev/null | wc -l) processes" >&2
seen=$(dmesg 2>/dev/null | wc -l)
nap=""
trap '[ -n "$nap" ] && kill "$nap" 2>/dev/null; exit 0' TERM INT
while :; do
    sleep "$interval" &  # waited for with `wait`, which a TERM interrupts (a plain sleep defers it)
    nap=$!
    wait "$nap"
    kill -0 "$parent" 2>/dev/null || exit 0  # a parent killed -9 runs no trap: do not outlive it
    zombies=$(cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == "Z"' | wc -l)
    rss=$(awk '$1 == "total_rss" { print int($2 / 1048576) }' "$memcg/memory.stat" 2>/dev/null)
    echo "[ci-monitor] $(($(date +%s) - start)) s: MemAvailable $(kb MemAvailable) MB," \
        "cgroup rss ${rss:-?} MB, $(ls -d /proc/[0-9]* 2>/dev/null | wc -l) processes ($zombies zombies)," \
        "load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    # A sandbox's own limit (hermes-sbx-*) killing inside it is a test; anything else is news.
    new=$(dmesg 2>/dev/null | tail -n +"$((seen + 1))")
    if [ -n "$new" ]; then
        seen=$((seen + $(printf '%s\n' "$new" | wc -l)))
        printf '%s\n' "$new" | grep -E "Out of memory|oom-kill:" |
            grep -v "oom_memcg=[^,]*/hermes-sbx-" | sed 's/^/[ci-monitor] kernel: /' >&2
    fi
done

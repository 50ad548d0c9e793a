#!/usr/bin/env bash
# `make test-vllm`: build the CPU vLLM venv and a tiny random model with the offline Qwen
# tokenizer, start vLLM on loopback, run `pytest -m vllm tests/integration`, stop the server.
# That server runs with VLLM_SERVER_DEV_MODE=1, so vLLM registers its RL routes (POST /pause,
# POST /resume, GET /is_paused, POST /abort_requests): tests/integration/test_vllm_pause.py
# pauses generations mid-stream with them. Then start it again as a *stock* server (no
# --enable-scale-out: the generate route answers 403; no dev mode) and run the
# stock-completions tests against it (HERMES_ASYNC_VLLM_SCALE_OUT=0).
#
# Env: VLLM_VENV (.venv-vllm), VENV (.venv, the project venv), VLLM_PORT (a free port),
#      VLLM_STARTUP_TIMEOUT_SECONDS (300), PYTEST_ARGS (extra pytest arguments),
#      VLLM_WORK (artifacts: model, tokenizer, server logs; default $VLLM_VENV/work),
#      VLLM_STOCK_PHASE (1; 0 skips the stock-server run),
#      VLLM_TESTS (what the first server runs: paths or node ids; default tests/integration),
#      VLLM_DEV_MODE (1; 0 starts the first server without the pause routes: the pause tests
#      then skip, saying so).
# Relative paths are taken from the checkout this script is in, so a git worktree can run it
# with the main checkout's venvs: VENV=/path/.venv VLLM_VENV=/path/.venv-vllm bash ...
set -euo pipefail

cd "$(dirname "$0")/../.."
VLLM_VENV="${VLLM_VENV:-.venv-vllm}"
VENV="${VENV:-.venv}"
WORK="${VLLM_WORK:-$VLLM_VENV/work}"
STARTUP_TIMEOUT_SECONDS="${VLLM_STARTUP_TIMEOUT_SECONDS:-300}"
STOP_GRACE_SECONDS=30
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started )) s"; }

bash scripts/vllm/setup_venv.sh
echo "[test-vllm] venv ready after $(elapsed)"

mkdir -p "$WORK"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
tokenizer_dir=$("$VENV/bin/python" -c "
import sys
from hermes_async.inference.hf import qwen_offline_hf_dir
print(qwen_offline_hf_dir(sys.argv[1]))" "$WORK/tokenizer")
"$VLLM_VENV/bin/python" scripts/vllm/make_tiny_model.py --tokenizer "$tokenizer_dir" --out "$WORK/tiny-model"
echo "[test-vllm] model ready after $(elapsed)"

port="${VLLM_PORT:-$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
url="http://127.0.0.1:$port"
server_pid=""

# start_server LOG DEV_MODE [EXTRA_ARGS...]: vLLM (VLLM_SERVER_DEV_MODE=DEV_MODE: 0 or 1) in its
# own process group (setsid), so stopping it also stops its engine-core child process; returns
# once /health answers.
start_server() {
    local log="$1" dev_mode="$2"
    shift 2
    VLLM_SERVER_DEV_MODE="$dev_mode" HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 \
        VLLM_CACHE_ROOT="$WORK/cache" VLLM_NO_USAGE_STATS=1 \
        setsid "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$WORK/tiny-model" --served-model-name tiny --host 127.0.0.1 --port "$port" \
        --dtype float32 --max-model-len 2048 --enforce-eager "$@" \
        >"$log" 2>&1 &
    server_pid=$!
    local deadline=$(( $(date +%s) + STARTUP_TIMEOUT_SECONDS ))
    until curl -fsS -m 2 "$url/health" >/dev/null 2>&1; do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            echo "[test-vllm] vLLM exited during startup; last lines of $log:" >&2
            tail -n 40 "$log" >&2
            exit 1
        fi
        if (( $(date +%s) > deadline )); then
            echo "[test-vllm] vLLM not healthy after ${STARTUP_TIMEOUT_SECONDS} s; last lines of $log:" >&2
            tail -n 40 "$log" >&2
            exit 1
        fi
        sleep 1
    done
    echo "[test-vllm] server healthy at $url after $(elapsed) ($*)"
}

stop_server() {
    [[ -n "$server_pid" ]] || return 0
    if kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM -- "-$server_pid" 2>/dev/null || true
        for _ in $(seq "$STOP_GRACE_SECONDS"); do
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 1
        done
        kill -KILL -- "-$server_pid" 2>/dev/null || true
    fi
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
    echo "[test-vllm] server stopped; total $(elapsed)"
}
trap stop_server EXIT

start_server "$WORK/server.log" "${VLLM_DEV_MODE:-1}" --enable-scale-out
HERMES_ASYNC_VLLM_URL="$url" HERMES_ASYNC_VLLM_TOKENIZER="$tokenizer_dir" \
    "$VENV/bin/python" -m pytest -m vllm ${VLLM_TESTS:-tests/integration} -p no:cacheprovider \
    ${PYTEST_ARGS:-}
stop_server

if [[ "${VLLM_STOCK_PHASE:-1}" != "0" ]]; then
    # As shipped: no dev routes either.
    start_server "$WORK/server-stock.log" 0
    HERMES_ASYNC_VLLM_URL="$url" HERMES_ASYNC_VLLM_TOKENIZER="$tokenizer_dir" \
        HERMES_ASYNC_VLLM_SCALE_OUT=0 \
        "$VENV/bin/python" -m pytest -m vllm_stock tests/integration -p no:cacheprovider ${PYTEST_ARGS:-}
    stop_server
fi

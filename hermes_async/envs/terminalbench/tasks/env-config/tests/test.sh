#!/bin/bash
# Verifier: needs TEST_DIR and [verifier.env]; the solution's env must not leak into it.
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ "${TEST_DIR:-}" = /tests ] || fail "TEST_DIR is '${TEST_DIR:-}'"
[ -n "${EXPECTED_MODE:-}" ] || fail "[verifier.env] not applied"
[ -z "${ORACLE_MARKER:-}" ] || fail "[solution.env] leaked into the verifier"
[ "$(cat /app/mode.txt 2>/dev/null)" = "$EXPECTED_MODE" ] || fail "mode.txt"
want="$(printf '%s' "$EXPECTED_MODE" | sha256sum | cut -d' ' -f1)"
[ "$(tr -d '[:space:]' < /app/mode.sha256 2>/dev/null)" = "$want" ] || fail "mode.sha256"
echo "all checks passed"
echo 1 > /logs/verifier/reward.txt

#!/bin/bash
# Oracle; refuses to run unless [solution.env] reached it (a harness check).
set -euo pipefail
: "${ORACLE_MARKER:?[solution.env] was not applied}"
: "${APP_MODE:?[environment.env] was not applied}"
printf '%s\n' "$APP_MODE" > /app/mode.txt
printf '%s' "$APP_MODE" | sha256sum | cut -d' ' -f1 > /app/mode.sha256

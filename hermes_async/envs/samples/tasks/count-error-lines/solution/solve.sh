#!/bin/bash
# Oracle: the level is the second field.
set -euo pipefail
awk '$2 == "ERROR"' /app/service.log | wc -l > /app/errors.txt

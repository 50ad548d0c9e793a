#!/bin/bash
# Oracle: a real CSV reader, since names hold commas.
set -euo pipefail
python3 - <<'PY'
import csv

with open("/app/orders.csv", newline="") as f:
    total = sum(float(row["amount"]) for row in csv.DictReader(f))
with open("/app/total.txt", "w") as f:
    f.write(f"{total:.2f}\n")
PY

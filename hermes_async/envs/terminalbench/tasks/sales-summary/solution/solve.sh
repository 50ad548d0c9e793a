#!/bin/bash
# Oracle: compute the four fields with the csv module.
set -euo pipefail
python3 - <<'PY'
import csv
import json
from collections import defaultdict

revenue = 0.0
units = defaultdict(int)
by_product = defaultdict(float)
days = set()
with open("/app/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        amount = int(row["units"]) * float(row["unit_price"])
        revenue += amount
        units[row["region"]] += int(row["units"])
        by_product[row["product"]] += amount
        days.add(row["date"])
summary = {
    "total_revenue": round(revenue, 2),
    "units_by_region": dict(units),
    "top_product": max(by_product, key=by_product.get),
    "days": len(days),
}
with open("/app/summary.json", "w") as f:
    json.dump(summary, f, indent=2)
PY

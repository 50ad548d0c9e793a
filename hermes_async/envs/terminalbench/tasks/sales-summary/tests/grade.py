"""Grade /app/summary.json field by field; write /logs/verifier/reward.json."""

import csv
import json
from collections import defaultdict
from pathlib import Path


def expected() -> dict:
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
    return {
        "total_revenue": round(revenue, 2),
        "units_by_region": dict(units),
        "top_product": max(by_product, key=by_product.get),
        "days": len(days),
    }


def main() -> None:
    want = expected()
    try:
        got = json.loads(Path("/app/summary.json").read_text())
    except (OSError, ValueError):
        got = {}
    if not isinstance(got, dict):
        got = {}
    checks = {
        "total_revenue": isinstance(got.get("total_revenue"), (int, float))
        and abs(got["total_revenue"] - want["total_revenue"]) < 0.005,
        "units_by_region": got.get("units_by_region") == want["units_by_region"],
        "top_product": got.get("top_product") == want["top_product"],
        "days": got.get("days") == want["days"],
    }
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    result = {"reward": sum(checks.values()) / len(checks)}
    result.update({name: float(ok) for name, ok in checks.items()})
    Path("/logs/verifier/reward.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

#!/bin/bash
# Oracle: fix median (even counts) and mode (ties take the smallest value).
set -euo pipefail
python3 - <<'PY'
from pathlib import Path

path = Path("/app/stats.py")
source = path.read_text()
source = source.replace(
    "    return ordered[middle]\n",
    "    if len(ordered) % 2:\n"
    "        return ordered[middle]\n"
    "    return (ordered[middle - 1] + ordered[middle]) / 2\n",
)
source = source.replace(
    "    return max(counts, key=counts.get)\n",
    "    best = max(counts.values())\n"
    "    return min(value for value, count in counts.items() if count == best)\n",
)
path.write_text(source)
PY
cd /app && python3 -m pytest -q -p no:cacheprovider /app/tests

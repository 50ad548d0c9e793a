#!/bin/bash
# Verifier: checks the list in four batches by trial division, pausing between batches
# (about 8 s in all, to stand for a long test suite). Reward 1 when all batches pass.
export PYTHONDONTWRITEBYTECODE=1
fail() { echo "FAIL: $*"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ -f /app/primes.txt ] || fail "no /app/primes.txt"
for batch in 0 1 2 3; do
    sleep 2
    python3 - "$batch" <<'PY' || fail "batch $batch"
import sys

batch = int(sys.argv[1])
lo, hi = batch * 5000, (batch + 1) * 5000
want = [n for n in range(max(lo, 2), hi) if all(n % d for d in range(2, int(n ** 0.5) + 1))]
got = [int(x) for x in open("/app/primes.txt").read().split()]
sys.exit(0 if [p for p in got if lo <= p < hi] == want and got == sorted(got) and max(got) < 20000 else 1)
PY
    echo "batch $batch ok"
done
echo 1 > /logs/verifier/reward.txt

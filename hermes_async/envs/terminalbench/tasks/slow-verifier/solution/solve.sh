#!/bin/bash
# Oracle: a sieve.
set -euo pipefail
python3 -c '
n = 20000
sieve = bytearray([1]) * n
sieve[0:2] = b"\0\0"
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
print("\n".join(str(i) for i in range(n) if sieve[i]))
' > /app/primes.txt

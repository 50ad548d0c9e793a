#!/bin/bash
# Verifier: reward 1 when the checks pass, else 0.
export PYTHONDONTWRITEBYTECODE=1
if python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py -rA; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi

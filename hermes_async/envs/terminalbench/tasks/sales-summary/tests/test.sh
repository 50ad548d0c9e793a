#!/bin/bash
# Verifier: partial credit, a quarter per correct field, in reward.json.
export PYTHONDONTWRITEBYTECODE=1
python3 /tests/grade.py

#!/bin/bash
if diff -u /tests/expected.conf /etc/nginx/sites/app.conf; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi

#!/bin/bash
# Verifier: runs in the task's workdir; compares settings.ini (relative path) exactly.
if [ "$(pwd)" != /srv/work ]; then
    echo "FAIL: cwd is $(pwd), not /srv/work"
    echo 0 > /logs/verifier/reward.txt
elif diff -u "$TEST_DIR/expected.ini" settings.ini; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi

#!/bin/bash
# Runs as the image's user (agent), in its WORKDIR, with /logs/verifier made writable for it.
if [ "$(id -un)" = agent ] && [ "$(cat /home/agent/whoami.txt 2>/dev/null)" = agent ] \
    && [ "$(stat -c %U /home/agent/whoami.txt)" = agent ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi

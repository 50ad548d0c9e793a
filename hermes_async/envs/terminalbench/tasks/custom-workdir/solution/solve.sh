#!/bin/bash
# Oracle: relative paths only (the task's workdir is the cwd).
set -euo pipefail
awk '
    /^\[/ { section = $0 }
    section == "[server]" && /^debug[[:space:]]*=/ { print "debug = false"; next }
    { print }
    section == "[server]" && /^host[[:space:]]*=/ { print "port = 8080" }
' settings.ini > settings.ini.new
mv settings.ini.new settings.ini

#!/bin/bash
# Oracle: sort /app/inbox by extension, dropping empty files.
set -euo pipefail
cd /app/inbox
for f in *; do
    [ -f "$f" ] || continue
    if [ ! -s "$f" ]; then
        rm -- "$f"
        continue
    fi
    case "$f" in
        *.*) ext="${f##*.}"; ext="${ext,,}" ;;
        *) ext=other ;;
    esac
    mkdir -p "/app/sorted/$ext"
    mv -- "$f" "/app/sorted/$ext/"
done

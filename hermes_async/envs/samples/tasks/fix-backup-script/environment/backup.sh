#!/bin/bash
# Archive /app/data into /app/backups/data.tar.gz.
set -euo pipefail
SOURCE=/app/date
DEST=/app/backups
mkdir -p "$DEST"
tar -czf "$DEST/data.tar.gz" -C "$(dirname "$SOURCE")" "$(basename "$SORCE")"

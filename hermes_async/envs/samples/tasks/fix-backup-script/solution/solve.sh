#!/bin/bash
# Oracle: the source path and the variable's name are misspelled.
set -euo pipefail
sed -i 's|^SOURCE=/app/date$|SOURCE=/app/data|; s|\$SORCE|$SOURCE|' /app/backup.sh
/app/backup.sh

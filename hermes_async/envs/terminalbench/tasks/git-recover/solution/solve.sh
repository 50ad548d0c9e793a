#!/bin/bash
# Oracle: find the lost commits in the reflog and cherry-pick them in order.
set -euo pipefail
cd /app/repo
find_commit() {
    git log --walk-reflogs --format='%H%x09%s' | awk -F'\t' -v s="$1" '$2 == s { print $1; exit }'
}
notes="$(find_commit 'add notes')"
app="$(find_commit 'update app')"
git cherry-pick "$notes" "$app"

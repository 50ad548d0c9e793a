#!/bin/bash
# Oracle: count field 9, sort by count desc then code asc.
set -euo pipefail
awk '{ print $9 }' /app/access.log | sort | uniq -c | sort -k1,1nr -k2,2n \
    | awk '{ print $2, $1 }' > /app/report.txt

#!/bin/bash
set -euo pipefail
sed -i -E \
    -e 's/^([[:space:]]+)listen 80;/\1listen 8080;/' \
    -e 's/^([[:space:]]+)server_name [^;]*;/\1server_name app.example.org;/' \
    /etc/nginx/sites/app.conf

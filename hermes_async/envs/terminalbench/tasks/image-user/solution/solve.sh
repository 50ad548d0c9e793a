#!/bin/bash
set -euo pipefail
id -un > ~/whoami.txt

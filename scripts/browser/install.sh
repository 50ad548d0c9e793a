#!/usr/bin/env bash
# Make sure a Chromium the browser tools can drive is installed (idempotent).
#
#   scripts/browser/install.sh          install Debian's `chromium` if no Chromium is found
#   scripts/browser/install.sh check    only report (exit 1 when none is found)
#
# The browser tools (hermes_async.tools.browser) drive Chromium through Playwright's Python
# package, but never with Playwright's own browser download (`playwright install`): machines
# here reach package registries only, and Debian's package is the maintained, patched build.
# The executable is found the same way the library finds it: $HERMES_BROWSER_EXECUTABLE, else
# /usr/lib/chromium/chromium (Debian's binary behind the /usr/bin/chromium launcher), else
# chromium, chromium-browser, google-chrome-stable or google-chrome on PATH.
#
# Prints the executable's path on stdout (logs go to stderr). Requires root to install.
set -euo pipefail

log() { echo "[browser] $*" >&2; }

find_chromium() {
    if [ -n "${HERMES_BROWSER_EXECUTABLE:-}" ]; then
        if [ -x "$HERMES_BROWSER_EXECUTABLE" ]; then echo "$HERMES_BROWSER_EXECUTABLE"; return 0; fi
        log "HERMES_BROWSER_EXECUTABLE=$HERMES_BROWSER_EXECUTABLE is not an executable file"
        return 1
    fi
    if [ -x /usr/lib/chromium/chromium ]; then echo /usr/lib/chromium/chromium; return 0; fi
    local name
    for name in chromium chromium-browser google-chrome-stable google-chrome; do
        if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
    done
    return 1
}

if exe="$(find_chromium)"; then
    log "Chromium found: $exe ($("$exe" --version 2>/dev/null | head -n1 || echo 'version unknown'))"
    echo "$exe"
    exit 0
fi

if [ "${1:-}" = "check" ]; then
    log "no Chromium found; run scripts/browser/install.sh (apt-get install chromium)"
    exit 1
fi

if [ -n "${HERMES_BROWSER_EXECUTABLE:-}" ]; then
    log "not installing: HERMES_BROWSER_EXECUTABLE points somewhere else; fix or unset it"
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    log "no Chromium found and not root: run \`sudo apt-get install chromium\`"
    exit 1
fi
command -v apt-get >/dev/null 2>&1 || { log "no apt-get: install Chromium with your package manager"; exit 1; }

log "installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends chromium >&2
exe="$(find_chromium)" || { log "chromium installed but no executable found"; exit 1; }
log "installed: $exe ($("$exe" --version 2>/dev/null | head -n1 || true))"
echo "$exe"

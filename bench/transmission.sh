#!/usr/bin/env bash
# The NBD server's two transmission modes side by side: the same build's
# daemon in async mode (the default: a task per request) and in threaded
# mode (`--nbd-threads N`: N threads per connection, each carrying whole
# requests), alternating, on a simple space over raw files
# (bench/simple-ab.sh's setup), with the daemon's CPU per GB.
#
#   bench/transmission.sh [rounds] [seconds-per-run]
#
# Environment: BIN (a terrace binary; default this checkout's release
# build), THREADS (default 8), PATTERNS (as bench/simple-ab.sh; default
# 64 KiB writes and 4 KiB random reads at 1 and 64 outstanding I/Os).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${1:-3}"
seconds="${2:-6}"
if [ -z "${BIN:-}" ]; then
    cargo build --release -q -p terrace
    BIN="${CARGO_TARGET_DIR:-target}/release/terrace"
fi
bin="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
modes="$(mktemp -d /var/tmp/terrace-modes.XXXXXX)"
trap 'rm -rf "$modes"' EXIT
# One wrapper per mode, named after it: simple-ab.sh alternates "builds".
printf '#!/bin/sh\nexec "%s" "$@"\n' "$bin" >"$modes/async"
printf '#!/bin/sh\nif [ "$1" = daemon ]; then shift; exec "%s" daemon --nbd-threads %s "$@"; fi\nexec "%s" "$@"\n' \
    "$bin" "${THREADS:-8}" "$bin" >"$modes/threaded"
chmod +x "$modes/async" "$modes/threaded"
BINS="$modes/async $modes/threaded" \
    PATTERNS="${PATTERNS:-write 64k 1,write 64k 64,randread 4k 1,randread 4k 64}" \
    bench/simple-ab.sh "$rounds" "$seconds"

#!/usr/bin/env bash
# First writes into new extents of a mirror without a log (each names its
# extent in the write intent before it is written) against the same writes
# again (named already), on a pool of eight sparse files: the cost of
# naming an extent, and how it grows with the pool's metadata.
#
#   bench/intent-first-writes.sh FILE-SIZE SPACE-SIZE [writes]
#
# e.g. `1T 3T` (524,288 slabs of 16 MiB, 2.3 MB of metadata) or `16G 48G`
# (8,192 slabs, 40 KB). The pool is made of eight FILE-SIZE sparse files in
# /var/tmp in 16 MiB slabs with a 2-way mirror of SPACE-SIZE (its default
# 4 columns over the eight files); `pool status` is timed, then qemu-io
# writes 4 KiB at `writes` (default 32) offsets 256 MiB apart, each in an
# extent of its own, then at the same offsets again. Prints the median,
# least and most IO/s of each pass. BIN picks the binary (default: this
# checkout's release build). With DEGRADED=1 the pool is exported and
# imported without its last file before the writes, so each first write
# into an extent also notes it dirty for the missing disk; the pool's
# policy repairs the disk meanwhile unless RETIRE=never, at RATE per second
# (`--repair-rate`; default 0, unlimited). Needs qemu-io.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${BIN:-target/release/terrace}"
file_size="$1"
space_size="$2"
writes="${3:-32}"
work="$(mktemp -d /var/tmp/terrace-intent.XXXXXX)"
pid=""
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
for i in 0 1 2 3 4 5 6 7; do truncate -s "$file_size" "$work/d$i.img"; done
"$bin" daemon --state-dir "$work/state" --control "$work/ctl.sock" \
    --nbd-socket "$work/nbd.sock" --no-tcp >"$work/daemon.log" 2>&1 &
pid=$!
cli() { "$bin" --control "$work/ctl.sock" "$@"; }
for _ in $(seq 100); do cli status >/dev/null 2>&1 && break; sleep 0.1; done
cli pool create p "$work"/d{0..7}.img --slab 16M >/dev/null
cli space create p vm --layout mirror --size "$space_size" >/dev/null
if [ -n "${DEGRADED:-}" ]; then
    cli pool set p --retire-missing "${RETIRE:-auto}" --repair-rate "${RATE:-0}" >/dev/null
    cli pool export p >/dev/null
    cli pool import --name p "$work"/d{0..6}.img >/dev/null
    cli pool status p | grep '^status:'
fi
cli pool status p | grep 'meta:'
start=$(date +%s%N)
cli pool status p >/dev/null
echo "pool status: $(( ($(date +%s%N) - start) / 1000000 )) ms"
uri="nbd+unix:///vm?socket=$work/nbd.sock"
commands=()
for k in $(seq "$writes"); do
    commands+=(-c "write -P $((k % 250)) $((k * 256))M 4k")
done
summary() {
    grep -o '[0-9.]* ops/sec' | awk '{print $1}' | sort -n | awk '
        { v[NR] = $1 }
        END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
              printf "median %.0f IO/s, least %.0f, most %.0f (%d writes)\n", m, v[1], v[NR], NR }'
}
echo -n "new extents:        "
qemu-io -f raw "${commands[@]}" "$uri" | summary
echo -n "same offsets again: "
qemu-io -f raw "${commands[@]}" "$uri" | summary
cli shutdown >/dev/null 2>&1 || true
wait "$pid" 2>/dev/null || true
pid=""

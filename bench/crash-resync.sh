#!/usr/bin/env bash
# How soon a mirror serves again after an unclean shutdown, and how long
# its resync takes. A 2-way mirror of SPACE-SIZE over four sparse files of
# FILE-SIZE in /var/tmp (256 MiB slabs) is written whole, then 4 KiB every
# 128 MiB, into every extent (so the write intent names them all), then the daemon is
# killed with SIGKILL, the page cache dropped, and the daemon started again.
# Prints the time until its control socket answers (it imports its pools
# first), until a 4 KiB read of the space returns, and until the log says
# the resync is done (a build that resyncs before it serves says nothing:
# its resync is the import), with the IO/s of 64 random 4 KiB reads made
# meanwhile.
#
#   bench/crash-resync.sh [FILE-SIZE] [SPACE-SIZE]     (default 8G 4G)
#
# BIN picks the binary (default: this checkout's release build). Needs
# qemu-io; run as root (it writes /proc/sys/vm/drop_caches).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${BIN:-target/release/terrace}"
file_size="${1:-8G}"
space_size="${2:-4G}"
work="$(mktemp -d /var/tmp/terrace-crash.XXXXXX)"
pid=""
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
start_daemon() {
    "$bin" daemon --state-dir "$work/state" --control "$work/ctl.sock" \
        --nbd-socket "$work/nbd.sock" --no-tcp >>"$work/daemon.log" 2>&1 &
    pid=$!
}
cli() { "$bin" --control "$work/ctl.sock" "$@"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
for i in 0 1 2 3; do truncate -s "$file_size" "$work/d$i.img"; done
start_daemon
for _ in $(seq 100); do cli status >/dev/null 2>&1 && break; sleep 0.1; done
cli pool create p "$work"/d{0..3}.img >/dev/null
cli space create p m --layout mirror --size "$space_size" >/dev/null
uri="nbd+unix:///m?socket=$work/nbd.sock"
bytes=$(numfmt --from=iec "$space_size")
chunk=$(( 64 << 20 ))
commands=()
for offset in $(seq 0 "$chunk" $(( bytes - 1 ))); do
    commands+=(-c "write -P 7 $offset $chunk")
done
qemu-io -f raw "${commands[@]}" "$uri" >/dev/null
# Every 128 MiB: into every extent, whatever its columns.
commands=()
for offset in $(seq 0 $(( 128 << 20 )) $(( bytes - 1 ))); do
    commands+=(-c "write -P 9 $(( offset + 4096 )) 4k")
done
qemu-io -f raw "${commands[@]}" "$uri" >/dev/null
echo "$(cli space show m | grep 'write intent:' | sed 's/^ *//')"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
pid=""
sync
echo 3 >/proc/sys/vm/drop_caches
began=$(date +%s%N)
start_daemon
until cli status >/dev/null 2>&1; do sleep 0.01; done
echo "control socket answers: $(ms_since "$began") ms"
until qemu-io -f raw -r -c "read 0 4k" "$uri" >/dev/null 2>&1; do sleep 0.01; done
echo "first read returns:     $(ms_since "$began") ms"
reads=()
for k in $(seq 64); do
    reads+=(-c "read $(( (k * 7919 % (bytes / 4096)) * 4096 )) 4k")
done
read_began=$(date +%s%N)
qemu-io -f raw -r "${reads[@]}" "$uri" >/dev/null
echo "64 random reads:        $(( 64000 / ($(ms_since "$read_began") + 1) )) IO/s"

if grep -q "left by an unclean shutdown" "$work/daemon.log"; then
    until grep -q "resync after the unclean shutdown done" "$work/daemon.log"; do sleep 0.05; done
    echo "resync done:            $(ms_since "$began") ms"
else
    echo "resync done:            before the import ended"
fi
if qemu-io -f raw -r -c "read -P 9 4096 4k" -c "read -P 7 8192 4k" "$uri" | grep -q "Pattern verification failed"; then
    echo "data checked: MISMATCH"
else
    echo "data checked: ok"
fi
cli shutdown >/dev/null 2>&1 || true
wait "$pid" 2>/dev/null || true
pid=""

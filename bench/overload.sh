#!/usr/bin/env bash
# Writes under overload: many NBD connections of mixed, verified I/O on a
# journaled dual-parity space over raw files, more than destaging keeps up
# with, for long enough that the log fills. What a writer waits for then is
# the question: fio's completion latency per direction (p50, p99, p99.9,
# max) and IO/s, with every block written checked by reading it back
# (fio's verify, during the run).
#
#   bench/overload.sh [seconds] [connections]
#
# A pool of six sparse 8 GiB files under BENCH_DIR (default /var/tmp, this
# machine's disk); a dual parity space of 6 columns, 8 GiB, with a 256 MiB
# write-back log; `connections` fio jobs (default 16), each its own NBD
# connection (fio's nbd engine over the Unix socket) and its own slice of
# the space, random reads and writes half and half of 4 KiB to 256 KiB, 4
# in flight each, for `seconds` (default 60). The aim (the cost-of-a-request
# issue): no write waits more than 1 s, p99 under 200 ms, nothing lost.
# TERRACE picks the binary (default: this checkout's release build). Needs
# fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

seconds="${1:-60}"
connections="${2:-16}"
command -v fio >/dev/null || { echo "needs fio" >&2; exit 1; }
bench_daemon overload
files=()
for i in $(seq 0 5); do
    truncate -s 8G "$work/disk$i.img"
    files+=("$work/disk$i.img")
done
"$terrace" "${ctl[@]}" pool create p "${files[@]}" >/dev/null
"$terrace" "${ctl[@]}" space create p s --layout parity --redundancy 2 --columns 6 \
    --size 8G --cache 256M >/dev/null
slice=$((8192 / connections))
fio --name=overload --ioengine=nbd --uri="nbd+unix:///s?socket=$nbd" \
    --numjobs="$connections" --size="${slice}M" --offset_increment="${slice}M" \
    --rw=randrw --rwmixread=50 --bsrange=4k-256k --bs_unaligned=0 --iodepth=4 \
    --verify=crc32c --verify_backlog=64 --verify_fatal=1 --verify_state_save=0 \
    --time_based --runtime="$seconds" --group_reporting \
    --percentile_list=50:99:99.9 --output-format=json >"$work/fio.json" 2>"$work/fio.err" || {
    cat "$work/fio.err" >&2
    exit 1
}
python3 - "$work/fio.json" "$seconds" "$connections" <<'EOF'
import json, sys
path, seconds, connections = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
print(f"{connections} connections, {seconds} s, verify errors: {job.get('total_err', 0)}")
print("| direction | IO/s | MB/s | p50 ms | p99 ms | p99.9 ms | max ms |")
print("|---|---|---|---|---|---|---|")
for side in ("write", "read"):
    s = job[side]
    clat = s["clat_ns"]
    pct = clat.get("percentile", {})
    ms = lambda key: pct.get(key, 0) / 1e6
    print(f"| {side} | {s['iops']:.0f} | {s['bw_bytes'] / 1e6:.1f} | {ms('50.000000'):.1f} | "
          f"{ms('99.000000'):.1f} | {ms('99.900000'):.1f} | {clat['max'] / 1e6:.1f} |")
EOF

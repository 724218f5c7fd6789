#!/usr/bin/env bash
# Random 4 KiB writes into journaled single parity for long enough to fill
# its 1 GiB log, on the white paper's modelled drives: what a writer sees
# once the log is full (IO/s, p99 and worst completion latency), and, each
# second, how full the log is and how much has gone home.
#
#   bench/full-log.sh [rounds] [seconds-per-run]
#
# Each round runs every build in BINS (default: this checkout's release
# build) on a fresh pool (8 × hdd-10k + 3 × ssd-sata journal disks, as
# bench/writeback.sh) with one 8-column single-parity space of 8 GiB and a 1 GiB log,
# at DEPTH outstanding I/Os with fio's nbd engine after a 2 s ramp, then
# times the drain of what the log holds once fio stops (at most 10 minutes).
# Builds alternate within a round, so drift on a shared machine falls on
# both. TRACE=1 prints the per-second fill trace. DEPTH sets the
# outstanding I/Os (default 64); at DEPTH=1 the log does not fill in a short
# run, and the figures are those of lone logged writes. Needs fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-1}"
seconds="${2:-20}"
depth="${DEPTH:-64}"
ab_work full-log

echo "| round | build | IO/s | p99 ms | max ms | left in the log, MiB | drain s |"
echo "|---|---|---|---|---|---|---|"
# One round of one build, on its fresh pool.
full_round() {
    local round="$1" bin="$2"
    "${ctl[@]}" space create wb p1-log --layout parity --redundancy 1 --columns 8 --size 8G --cache 1G >/dev/null
    (
        for second in $(seq $((seconds + 2))); do
            sleep 1
            "${ctl[@]}" space show p1-log --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["space"]["cache"]
print("  %s s: fill %d %%, absorbed %d MiB, destaged %d MiB" % (sys.argv[1], c["fill_percent"],
      c["absorbed_bytes"] >> 20, c["destaged_bytes"] >> 20))' "$second"
        done
    ) >"$work/trace" &
    sampler=$!
    fio --name=full --ioengine=nbd --uri="nbd+unix:///p1-log?socket=$work/nbd.sock" \
        --rw=randwrite --bs=4k --iodepth="$depth" --size=8G --time_based --runtime="$seconds" \
        --ramp_time=2 --output-format=json 2>/dev/null |
        python3 -c '
import json, sys
text = sys.stdin.read()
w = json.loads(text[text.index("{"):])["jobs"][0]["write"]
clat = w["clat_ns"]
print("| %s | %s | %.0f | %.1f | %.0f " % (sys.argv[1], sys.argv[2], w["iops"],
      clat["percentile"]["99.000000"] / 1e6, clat["max"] / 1e6), end="")' "$round" "$bin"
    dirty() {
        "${ctl[@]}" space show p1-log --json |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["space"]["cache"]["dirty_bytes"])'
    }
    left=$(dirty)
    start=$(date +%s.%N)
    for _ in $(seq 1200); do [ "$(dirty)" = 0 ] && break; sleep 0.5; done
    echo "| $((left >> 20)) | $(python3 -c "import sys; print('%.0f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$start" "$(date +%s.%N)") |"
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    sampler=
    if [ -n "${TRACE:-}" ]; then cat "$work/trace"; fi
}
ab_rounds "$rounds" full_round

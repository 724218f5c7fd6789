#!/usr/bin/env bash
# Per-write latency of a restore (64 KiB sequential writes) on journaled
# single parity, on the white paper's modelled drives: where the tail is.
#
#   bench/restore-latency.sh [rounds] [seconds-per-run]
#
# Each round, for every build in BINS (default: this checkout's release
# build), makes a fresh pool (8 × hdd-10k + 3 × ssd-sata journal disks, as
# bench/writeback.sh) with an 8-column single-parity space with a 1 GiB log
# and a 64 KiB interleave (rows of 448 KiB; INTERLEAVE overrides), writes
# it with fio's nbd engine at DEPTH (default 3) outstanding writes for the
# given seconds with fio's per-write latency log, leaves out the first 2 s,
# and prints MB/s, p50, p99, p99.9 and mean latency and the writes that
# took over 4 ms. Builds alternate within a round. The journal SSDs'
# backing files live in memory (SSD_DIR, default /dev/shm; SSD_DIR= keeps
# them beside the HDDs' files; see bench/writeback.sh). Needs fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-1}"
seconds="${2:-20}"
depth="${DEPTH:-3}"
export SSD_DIR="${SSD_DIR-/dev/shm}"
ab_work restore-latency

echo "| round | build | MB/s | p50 µs | p99 µs | p99.9 µs | mean µs | writes over 4 ms |"
echo "|---|---|---|---|---|---|---|---|"
latency_round() {
    local round="$1" bin="$2"
    "${ctl[@]}" space create wb p1-log --layout parity --redundancy 1 --columns 8 \
        --interleave "${INTERLEAVE:-64K}" --size 8G --cache 1G >/dev/null
    fio --name=restore --ioengine=nbd --uri="nbd+unix:///p1-log?socket=$work/nbd.sock" \
        --rw=write --bs=64k --iodepth="$depth" --size=8G --time_based --runtime="$seconds" \
        --write_lat_log="$work/latency" --log_avg_msec=0 >/dev/null 2>&1
    python3 - "$round" "$bin" "$work"/latency_clat.*.log <<'PY'
import sys
round_, build, path = sys.argv[1:4]
rows = [line.split(",") for line in open(path)]
# Column 1: ms since the start; column 2: the write's completion latency, ns.
kept = sorted(int(r[1]) / 1000 for r in rows if int(r[0]) >= 2000)
if not kept:
    sys.exit(f"{path}: no writes after the first 2 s")
seconds = (max(int(r[0]) for r in rows) - 2000) / 1000
n = len(kept)
at = lambda share: kept[min(n - 1, int(n * share))]
print(f"| {round_} | {build} | {n * 65536 / seconds / 1e6:.1f} | {at(0.5):.0f} | {at(0.99):.0f} "
      f"| {at(0.999):.0f} | {sum(kept) / n:.0f} | {sum(1 for x in kept if x > 4000)} |")
PY
    rm -f "$work"/latency_*.log
}
ab_rounds "$rounds" latency_round

#!/usr/bin/env bash
# Restore (64 KiB sequential writes) on journaled parity at several
# outstanding-I/O depths and two interleaves, against the full-stripe limit
# measured in the same round, on the white paper's modelled drives.
#
#   bench/restore-depths.sh [rounds] [seconds-per-run]
#
# Each round, for every build in BINS (default: this checkout's release
# build), makes a fresh pool (8 × hdd-10k + 3 × ssd-sata journal disks, as
# bench/writeback.sh) with four 8 GiB spaces, the parity ones 8 columns
# wide (as the paper's, and as the limit below assumes): `s8`, simple over all eight
# drives (the limit); `p1`, single parity with a 1 GiB log and the default
# 256 KiB interleave (rows of 1.75 MiB); `p1k`, the same with a 64 KiB
# interleave (rows of 448 KiB); `p2k`, dual parity with a 1 GiB log and a
# 64 KiB interleave (rows of 384 KiB). At each depth in DEPTHS (default
# "1 3 8 16") it writes each space in turn with fio's nbd engine (2 s ramp,
# then the run) and prints MB/s with the share of the limit (7/8 of `s8`
# for single parity, 6/8 for dual) in brackets. Builds alternate within a
# round. SSD_DIR=/dev/shm puts the journal SSDs' backing files in memory,
# so that the host disk's flushes behind FUA log records do not show
# through the modelled SSDs. Needs fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-1}"
seconds="${2:-6}"
depths="${DEPTHS:-1 3 8 16}"
ab_work restore-depths

echo "| round | build | outstanding I/Os | s8 | p1 | p1k | p2k |"
echo "|---|---|---|---|---|---|---|"
# One round of one build, on its fresh pool.
depths_round() {
    local round="$1" bin="$2" depth
    "${ctl[@]}" space create wb s8 --layout simple --columns 8 --size 8G --cache 0 >/dev/null
    "${ctl[@]}" space create wb p1 --layout parity --redundancy 1 --columns 8 --size 8G --cache 1G >/dev/null
    "${ctl[@]}" space create wb p1k --layout parity --redundancy 1 --columns 8 --interleave 64K --size 8G --cache 1G >/dev/null
    "${ctl[@]}" space create wb p2k --layout parity --redundancy 2 --columns 8 --interleave 64K --size 8G --cache 1G >/dev/null
    for depth in $depths; do
        limit=$(restore_mbs s8 "$depth" "$seconds")
        p1=$(restore_mbs p1 "$depth" "$seconds")
        p1k=$(restore_mbs p1k "$depth" "$seconds")
        p2k=$(restore_mbs p2k "$depth" "$seconds")
        python3 - "$round" "$(basename "$bin")" "$depth" "$limit" "$p1" "$p1k" "$p2k" <<'PY'
import sys
round_, build, depth, limit, p1, p1k, p2k = sys.argv[1:4] + [float(v) for v in sys.argv[4:]]
share = lambda v, data: "%.1f (%.2f)" % (v, v / (limit * data / 8))
print("| %s | %s | %s | %.1f | %s | %s | %s |" % (round_, build, depth, limit,
      share(p1, 7), share(p1k, 7), share(p2k, 6)))
PY
    done
}
ab_rounds "$rounds" depths_round

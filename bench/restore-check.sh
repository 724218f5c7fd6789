#!/usr/bin/env bash
# Restore (64 KiB sequential writes) on journaled single parity against its
# full-stripe limit, on the white paper's modelled drives, with the
# daemon's CPU time per GB written: a quick check of the gathered-row
# write path, and an A/B of two builds on the same machine state.
#
#   bench/restore-check.sh [rounds] [seconds-per-run]
#
# Each round runs, for every build in BINS (default: this checkout's
# release build), a fresh pool (8 × hdd-10k + 3 × ssd-sata journal disks,
# as bench/writeback.sh) with an 8-column single-parity space with a 1 GiB log and a
# simple space over all eight drives (`s8`, the limit), and writes each
# twice with fio's nbd engine at 32 outstanding I/Os: the first run of a
# space fills its sparse files, the second rewrites them. Prints, per run,
# MB/s, the ratio to 7/8 of the round's `s8` figure of the same pass, and
# daemon CPU seconds per GB written. Builds alternate within a round, so
# drift on a shared machine falls on both. Needs fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-2}"
seconds="${2:-8}"
ab_work restore

cpu_ticks() { awk '{print $14 + $15}' "/proc/$daemon/stat"; }

echo "| round | build | pass | s8 MB/s | p1-log MB/s | of 7/8 × s8 | p1-log CPU s/GB |"
echo "|---|---|---|---|---|---|---|"
ticks_per_second=$(getconf CLK_TCK)
# One round of one build, on its fresh pool.
check_round() {
    local round="$1" bin="$2" pass
    "${ctl[@]}" space create wb p1-log --layout parity --redundancy 1 --columns 8 --size 8G --cache 1G >/dev/null
    "${ctl[@]}" space create wb s8 --layout simple --columns 8 --size 8G --cache 0 >/dev/null
    for pass in fill rewrite; do
        limit=$(restore_mbs s8 32 "$seconds")
        before=$(cpu_ticks)
        parity=$(restore_mbs p1-log 32 "$seconds")
        used=$(($(cpu_ticks) - before))
        python3 - "$round" "$bin" "$pass" "$limit" "$parity" "$used" "$ticks_per_second" "$seconds" <<'PY'
import sys
round_, build, pass_, limit, parity, ticks, hz, seconds = sys.argv[1:]
limit, parity = float(limit), float(parity)
# fio's ramp is not in its figure; the daemon works through it too.
gb = parity * (float(seconds) + 2) / 1000
cpu = int(ticks) / int(hz) / gb if gb else 0
print(f"| {round_} | {build} | {pass_} | {limit:.1f} | {parity:.1f} | {parity / (limit * 7 / 8):.2f} | {cpu:.2f} |")
PY
    done
}
ab_rounds "$rounds" check_round

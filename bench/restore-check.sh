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
# as bench/writeback.sh) with an 8-column single-parity space with a 1 GiB
# log (and the INTERLEAVE given, else the default) and a simple space over all eight drives (`s8`, the limit), and
# writes each twice with fio's nbd engine at DEPTH (default 32) outstanding
# I/Os: the first run of a space fills its sparse files, the second
# rewrites them. Prints, per run, MB/s, the ratio to 7/8 of the round's
# `s8` figure of the same pass, and daemon CPU seconds per GB written for
# both spaces. With PERF=1 the rewrite passes are also sampled by perf, and
# the kernel's share of the daemon's samples is printed. Builds alternate
# within a round, so drift on a shared machine falls on both. Needs fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-2}"
seconds="${2:-8}"
depth="${DEPTH:-32}"
ab_work restore
if [ -n "${PERF:-}" ]; then
    command -v perf >/dev/null || { echo "PERF needs perf" >&2; exit 1; }
fi

cpu_ticks() { awk '{print $14 + $15}' "/proc/$daemon/stat"; }

# restore_cpu SPACE PASS: restore on SPACE at $depth outstanding writes;
# prints "MB/s daemon-CPU-ticks kernel-share". With PERF set, the rewrite
# pass is sampled by perf (after fio's ramp) and kernel-share is the
# kernel's share of the daemon's samples; otherwise it is "-".
restore_cpu() {
    local space="$1" pass="$2" before mbs share=- recorder=
    before=$(cpu_ticks)
    if [ -n "${PERF:-}" ] && [ "$pass" = rewrite ]; then
        (sleep 2; exec perf record -q -F 999 -p "$daemon" -o "$work/perf.data" -- sleep "$seconds") \
            >/dev/null 2>&1 &
        recorder=$!
    fi
    mbs=$(restore_mbs "$space" "$depth" "$seconds")
    echo -n "$mbs $(($(cpu_ticks) - before)) "
    if [ -n "$recorder" ]; then
        wait "$recorder" || true
        share=$(perf report -i "$work/perf.data" --sort dso --stdio 2>/dev/null |
            awk '/\[kernel\.kallsyms\]/ {print $1; exit}')
    fi
    echo "${share:--}"
}

echo "| round | build | pass | s8 MB/s | p1-log MB/s | of 7/8 × s8 | s8 CPU s/GB | p1-log CPU s/GB | s8 kernel share | p1-log kernel share |"
echo "|---|---|---|---|---|---|---|---|---|---|"
ticks_per_second=$(getconf CLK_TCK)
# One round of one build, on its fresh pool.
check_round() {
    local round="$1" bin="$2" pass
    "${ctl[@]}" space create wb p1-log --layout parity --redundancy 1 --columns 8 \
        ${INTERLEAVE:+--interleave "$INTERLEAVE"} --size 8G --cache 1G >/dev/null
    "${ctl[@]}" space create wb s8 --layout simple --columns 8 --size 8G --cache 0 >/dev/null
    for pass in fill rewrite; do
        limit=$(restore_cpu s8 "$pass")
        parity=$(restore_cpu p1-log "$pass")
        python3 - "$round" "$bin" "$pass" "$ticks_per_second" "$seconds" $limit $parity <<'PY'
import sys
round_, build, pass_, hz, seconds, limit, limit_ticks, limit_share, parity, ticks, share = sys.argv[1:]
limit, parity = float(limit), float(parity)
# fio's ramp is not in its figure; the daemon works through it too.
cpu = lambda mbs, ticks: int(ticks) / int(hz) / (mbs * (float(seconds) + 2) / 1000) if mbs else 0
print(f"| {round_} | {build} | {pass_} | {limit:.1f} | {parity:.1f} | {parity / (limit * 7 / 8):.2f} "
      f"| {cpu(limit, limit_ticks):.2f} | {cpu(parity, ticks):.2f} | {limit_share} | {share} |")
PY
    done
}
ab_rounds "$rounds" check_round

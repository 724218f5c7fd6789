#!/usr/bin/env bash
# terrace's NBD export against nbdkit on the same tmpfs backing, same fio
# jobs, one run, alternating targets job by job. Prints a markdown table of
# results and ratios (terrace / nbdkit).
#
#   bench/nbd-vs-nbdkit.sh [seconds-per-job] [rounds]
#
# Environment: NBD_THREADS (the daemon's --nbd-threads, default 0: its
# default), JOBS (a subset of the jobs, `;`-separated, see below).
#
# The binary is built and taken from $CARGO_TARGET_DIR (default target/).
#
# Every job runs `rounds` times per target, targets interleaved, and the
# median is reported: the machines are shared, and a single run can be off
# by a third.
#
# Targets, all over Unix sockets:
#   terrace-simple  a simple space over 4 files in /dev/shm (4 columns)
#   nbdkit-file     nbdkit file plugin on one file in /dev/shm
#   nbdkit-memory   nbdkit memory plugin
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
seconds=${1:-10}
rounds=${2:-3}
size_mib=1024
work=$(mktemp -d /dev/shm/terrace-bench.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

cargo build --release -q -p terrace
terrace="${CARGO_TARGET_DIR:-target}/release/terrace"
ctl="$work/control.sock"

"$terrace" daemon --state-dir "$work/state" --control "$ctl" --nbd-socket "$work/terrace.sock" --no-tcp --nbd-threads "${NBD_THREADS:-0}" 2>"$work/daemon.log" &
pids+=($!)
for _ in $(seq 100); do "$terrace" --control "$ctl" status >/dev/null 2>&1 && break; sleep 0.1; done
disks=()
for i in 0 1 2 3; do
    truncate -s $(( (size_mib / 4 + 64) * 1024 * 1024 )) "$work/disk$i.img"
    disks+=("$work/disk$i.img")
done
"$terrace" --control "$ctl" pool create bench "${disks[@]}" --slab 64M >/dev/null
"$terrace" --control "$ctl" space create bench simple --layout simple --columns 4 --size ${size_mib}M >/dev/null

truncate -s ${size_mib}M "$work/nbdkit-file.img"
nbdkit --foreground --unix "$work/nbdkit-file.sock" --exit-with-parent file "$work/nbdkit-file.img" 2>/dev/null &
pids+=($!)
nbdkit --foreground --unix "$work/nbdkit-memory.sock" --exit-with-parent memory size=${size_mib}M 2>/dev/null &
pids+=($!)
sleep 1

declare -A uris=(
    [terrace-simple]="nbd+unix:///simple?socket=$work/terrace.sock"
    [nbdkit-file]="nbd+unix:///?socket=$work/nbdkit-file.sock"
    [nbdkit-memory]="nbd+unix:///?socket=$work/nbdkit-memory.sock"
)
targets=(terrace-simple nbdkit-file nbdkit-memory)
# JOBS: a subset, e.g. JOBS="read 1m 8;write 1m 8" (default all four).
IFS=';' read -r -a jobs <<<"${JOBS:-randread 4k 32;randwrite 4k 32;read 1m 8;write 1m 8}"

# Prefill every target once so reads touch written data.
for target in "${targets[@]}"; do
    fio --name=fill --ioengine=nbd --uri="${uris[$target]}" --rw=write --bs=1m --iodepth=8 \
        --size=${size_mib}M --output="$work/fill.txt" >/dev/null
done

results="$work/results.txt"
for job in "${jobs[@]}"; do
    read -r rw bs depth <<<"$job"
    for _ in $(seq "$rounds"); do
    for target in "${targets[@]}"; do
        fio --name=bench --ioengine=nbd --uri="${uris[$target]}" --rw="$rw" --bs="$bs" \
            --iodepth="$depth" --size=${size_mib}M --time_based --runtime="$seconds" \
            --ramp_time=2 --output-format=json --output="$work/fio.json" >/dev/null
        echo "$job $target $(fio_side 'round(s["iops"]), round(s["bw_bytes"] / 1048576, 1), round(s["clat_ns"]["mean"] / 1000, 1)' <"$work/fio.json")" >>"$results"
    done
    done
done

python3 - "$results" <<'PY'
import sys, collections, statistics
runs = collections.OrderedDict()
for line in open(sys.argv[1]):
    rw, bs, depth, target, iops, mbs, lat = line.split()
    runs.setdefault(f"{rw} {bs} QD{depth}", {}).setdefault(target, []).append((float(iops), float(mbs), float(lat)))
rows = collections.OrderedDict()
for job, by in runs.items():
    rows[job] = {}
    for target, samples in by.items():
        samples.sort()
        rows[job][target] = samples[len(samples) // 2]
print("| job | terrace simple (IO/s, MiB/s) | nbdkit file | nbdkit memory | terrace / nbdkit file | terrace / nbdkit memory |")
print("|---|---|---|---|---|---|")
for job, by in rows.items():
    t, f, m = by["terrace-simple"], by["nbdkit-file"], by["nbdkit-memory"]
    print(f"| {job} | {t[0]:.0f}, {t[1]:.0f} | {f[0]:.0f}, {f[1]:.0f} | {m[0]:.0f}, {m[1]:.0f} | {t[0]/f[0]:.2f} | {t[0]/m[0]:.2f} |")
PY

#!/usr/bin/env bash
# What one request costs: a terrace simple space on one file against
# qemu-nbd (io_uring, no cache) and nbdkit's file plugin on a file alike,
# and fio on the raw file itself, the files side by side under BENCH_DIR
# (default /var/tmp, this machine's disk; /dev/shm takes the disk out).
#
#   bench/read-path.sh [rounds] [seconds-per-run]
#
# Each round runs every pattern (JOBS, `;`-separated fio rw, block size,
# outstanding I/Os; default 4 KiB random reads at 1 and 32, 4 KiB random
# writes at 32) on every target, the targets' order turning by round.
# fio's nbd engine over Unix sockets for the servers, io_uring with
# O_DIRECT for the raw file, 1 GiB written whole first. Prints each run's
# IO/s and p50 completion latency, then per pattern the medians and
# terrace's IO/s over qemu-nbd's (min, median, max of the rounds). The
# latency a server adds to a request is its p50 less the raw file's.
# LAYOUT gives the terrace space's layout arguments (default
# "--layout simple") and FILES the pool's files (default 1; a 2-way
# mirror needs 2). JOBS="write 1k 16" is the small-write test: 1 KiB
# sequential writes, as a 512-byte-sector client sends them.
# Needs fio, qemu-nbd and nbdkit.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-2}"
seconds="${2:-10}"
for tool in fio qemu-nbd nbdkit; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
bench_daemon read-path
size_mib=1024
# The pool's file has room for its labels and metadata beside the space.
files=()
for i in $(seq "${FILES:-1}"); do
    truncate -s $((size_mib + 64))M "$work/terrace$i.img"
    files+=("$work/terrace$i.img")
done
truncate -s ${size_mib}M "$work/qemu.img" "$work/nbdkit.img" "$work/raw.img"
"$terrace" "${ctl[@]}" pool create p "${files[@]}" --slab 64M >/dev/null
read -r -a layout <<<"${LAYOUT:---layout simple}"
"$terrace" "${ctl[@]}" space create p s "${layout[@]}" --size ${size_mib}M >/dev/null
qemu-nbd --format=raw --aio=io_uring --cache=none --shared=8 --persistent \
    --socket="$work/qemu.sock" "$work/qemu.img" 2>"$work/qemu.log" &
pids+=($!)
nbdkit --foreground --unix "$work/nbdkit.sock" file "$work/nbdkit.img" 2>"$work/nbdkit.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/qemu.sock" ] && [ -S "$work/nbdkit.sock" ] && break; sleep 0.1; done

declare -A engines=(
    [terrace]="--ioengine=nbd --uri=nbd+unix:///s?socket=$nbd"
    [qemu-nbd]="--ioengine=nbd --uri=nbd+unix:///?socket=$work/qemu.sock"
    [nbdkit]="--ioengine=nbd --uri=nbd+unix:///?socket=$work/nbdkit.sock"
    [raw]="--ioengine=io_uring --direct=1 --filename=$work/raw.img"
)
targets=(terrace qemu-nbd nbdkit raw)
IFS=';' read -r -a jobs <<<"${JOBS:-randread 4k 1;randread 4k 32;randwrite 4k 32}"

for target in "${targets[@]}"; do
    # shellcheck disable=SC2086
    fio --name=fill ${engines[$target]} --rw=write --bs=1m --iodepth=8 \
        --size=${size_mib}M >/dev/null 2>&1
done

# fio on a target; prints "IO/s p50-µs".
run() {
    local target="$1" rw="$2" bs="$3" depth="$4"
    # shellcheck disable=SC2086
    fio --name=rp ${engines[$target]} --rw="$rw" --bs="$bs" --iodepth="$depth" \
        --size=${size_mib}M --time_based --runtime="$seconds" --ramp_time=1 \
        --output-format=json 2>/dev/null |
        fio_side '"%.0f %.1f" % (s["iops"], s["clat_ns"]["percentile"]["50.000000"] / 1000)'
}

results="$work/results"
: >"$results"
echo "| round | pattern | target | IO/s | p50 µs |"
echo "|---|---|---|---|---|"
for round in $(seq "$rounds"); do
    order=("${targets[@]:round % 4}" "${targets[@]:0:round % 4}")
    for job in "${jobs[@]}"; do
        read -r rw bs depth <<<"$job"
        for target in "${order[@]}"; do
            read -r iops p50 <<<"$(run "$target" "$rw" "$bs" "$depth")"
            echo "| $round | $rw $bs $depth | $target | $iops | $p50 |"
            echo "$round|$rw $bs $depth|$target|$iops|$p50" >>"$results"
        done
    done
done

python3 - "$results" <<'PY'
import collections, statistics, sys
runs = collections.OrderedDict()
for line in open(sys.argv[1]):
    rnd, job, target, iops, p50 = line.strip().split("|")
    runs.setdefault(job, {}).setdefault(target, {})[rnd] = (float(iops), float(p50))
print()
print("| pattern | terrace IO/s, p50 µs | qemu-nbd | nbdkit file | raw file | terrace ÷ qemu-nbd IO/s: min | median | max | µs added to p50: terrace | qemu-nbd | nbdkit |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for job, by in runs.items():
    med = {t: (statistics.median(v[0] for v in r.values()), statistics.median(v[1] for v in r.values())) for t, r in by.items()}
    ratios = sorted(by["terrace"][r][0] / by["qemu-nbd"][r][0] for r in by["terrace"] if r in by["qemu-nbd"])
    cell = lambda t: "%.0f, %.1f" % med[t]
    added = lambda t: "%.1f" % (med[t][1] - med["raw"][1])
    print(f"| {job} | {cell('terrace')} | {cell('qemu-nbd')} | {cell('nbdkit')} | {cell('raw')} | "
          f"{ratios[0]:.2f} | {statistics.median(ratios):.2f} | {ratios[-1]:.2f} | {added('terrace')} | {added('qemu-nbd')} | {added('nbdkit')} |")
PY

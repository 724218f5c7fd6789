#!/usr/bin/env bash
# What thin provisioning costs a space's first writes: the same writes into
# a thin space (each extent allocated by its first write: slabs planned,
# zeroed and committed) and into a fixed one (allocated and zeroed at
# creation), one daemon, measured alternately.
#
#   bench/thin.sh [rounds] [seconds-per-run]
#
# A pool of 4 sparse files (DISK_SIZE, default 8G) under /var/tmp (BENCH_DIR)
# with 64 MiB slabs. Each round, for every layout of LAYOUTS (default a
# 2-way mirror; name:arguments, comma-separated) and each pattern of
# PATTERNS (fio rw, block size, outstanding I/Os; default 1 MiB sequential
# writes at 8 and 4 KiB random writes at 8 and 32), a thin and a fixed
# space of SPACE_SIZE (default 2G) are created fresh and written by fio's
# nbd engine for the given seconds (no ramp: the first writes are the
# point), the thin space first in odd rounds, then both deleted. Prints
# each run's MB/s, then per layout and pattern the min, median and max of
# the rounds' ratios (thin / fixed). Needs fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-3}"
seconds="${2:-5}"
space_size="${SPACE_SIZE:-2G}"
disk_size="${DISK_SIZE:-8G}"
ab_work thin
bin="${BINS%% *}"
layouts="${LAYOUTS:-mirror:--layout mirror --copies 2}"
patterns="${PATTERNS:-write 1m 8,randwrite 4k 8,randwrite 4k 32}"
IFS=, read -r -a layout_specs <<<"$layouts"
IFS=, read -r -a specs <<<"$patterns"

daemon_in "$bin" "$work"
ctl=("$bin" --control "$work/ctl.sock")
mkdir -p "$work/disks"
disks=()
for i in 0 1 2 3; do
    truncate -s "$disk_size" "$work/disks/d$i.img"
    disks+=("$work/disks/d$i.img")
done
"${ctl[@]}" pool create p "${disks[@]}" --slab 64M >/dev/null

# A fresh space of PROVISIONING written by fio; prints MB/s.
first_writes() {
    local name="$1" provisioning="$2" rw="$3" bs="$4" depth="$5" mbs
    shift 5
    "${ctl[@]}" space create p "$name" "$@" --size "$space_size" \
        --provisioning "$provisioning" >/dev/null
    mbs=$(fio --name=thin --ioengine=nbd --uri="nbd+unix:///$name?socket=$work/nbd.sock" \
        --rw="$rw" --bs="$bs" --iodepth="$depth" --size="$space_size" --time_based \
        --runtime="$seconds" --output-format=json 2>/dev/null | fio_mbs)
    "${ctl[@]}" space delete "$name" --pool p --yes >/dev/null
    echo "$mbs"
}

results="$work/results"
: >"$results"
echo "| round | layout | pattern | thin MB/s | fixed MB/s |"
echo "|---|---|---|---|---|"
for round in $(seq "$rounds"); do
    for entry in "${layout_specs[@]}"; do
        name="${entry%%:*}"
        read -r -a args <<<"${entry#*:}"
        for spec in "${specs[@]}"; do
            read -r rw bs depth <<<"$spec"
            if [ $((round % 2)) -eq 1 ]; then order="thin fixed"; else order="fixed thin"; fi
            declare -A got=()
            for provisioning in $order; do
                got[$provisioning]=$(first_writes "$name-$provisioning" "$provisioning" \
                    "$rw" "$bs" "$depth" "${args[@]}")
            done
            echo "| $round | $name | $spec | ${got[thin]} | ${got[fixed]} |"
            echo "$name|$spec|${got[thin]}|${got[fixed]}" >>"$results"
        done
    done
done
echo
echo "| layout | pattern | thin MB/s | fixed MB/s | thin / fixed: min | median | max |"
echo "|---|---|---|---|---|---|---|"
python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, spec, thin, fixed = line.strip().split("|")
    rows.setdefault((name, spec), []).append((float(thin), float(fixed)))
for (name, spec), runs in rows.items():
    ratio = sorted(t / f for t, f in runs)
    print(f"| {name} | {spec} | {statistics.median(t for t, _ in runs):.1f} | "
          f"{statistics.median(f for _, f in runs):.1f} | {ratio[0]:.2f} | "
          f"{statistics.median(ratio):.2f} | {ratio[-1]:.2f} |")
EOF

#!/usr/bin/env bash
# What block checksums cost: the same build, one daemon, each layout as two
# spaces alike but for `--checksums on|off`, measured alternately.
#
#   bench/checksums.sh [rounds] [seconds-per-run]
#
# A pool of 4 sparse 4 GiB files under /var/tmp; for each of LAYOUTS
# (default simple, 2-way mirror, single parity with its write-back log),
# spaces NAME-on and NAME-off of 1 GiB, filled with 1 MiB writes. Each
# round runs, for every layout and each of PATTERNS (fio rw, block size,
# outstanding I/Os; default 4 KiB random writes and reads at 1 and 32,
# 1 MiB sequential writes and reads at 8), the on and off spaces one after
# the other (which first alternates by round), fio's nbd engine, 1 s ramp
# then the given seconds. Prints each run's MB/s and the daemon's CPU
# seconds per GB moved (its CPU time over the ramp and the run, over the
# bytes of the run scaled to both) and the bytes it wrote to its disks
# per byte moved (the same way; the sums' own writes show here whatever
# the load of others), then per layout and pattern the medians and the
# min, median and max of the rounds' ratios (on / off).
# On a shared machine MB/s move with the load of others; CPU per GB
# much less, so it is what tells a few per cent apart. BENCH_DIR=/dev/shm
# puts the files in memory: what remains is the checksums' own cost, with
# no disk to hide it or to add noise. MODEL=hdd-10k (or any drive model)
# puts a model in front of each file: the drives, not the CPU, are then
# the limit, as in a pool of real drives. SPACE_SIZE (default 1G) and
# DISK_SIZE (default 4G) size the spaces and the files: on a space whose
# sums pages outnumber a destage round's blocks (8G), each block a random
# write destages dirties a sums page of its own. Needs fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-3}"
seconds="${2:-5}"
space_size="${SPACE_SIZE:-1G}"
disk_size="${DISK_SIZE:-4G}"
ab_work checksums
bin="${BINS%% *}"
layouts="${LAYOUTS:-simple:--layout simple,mirror:--layout mirror --copies 2,parity:--layout parity --redundancy 1}"
patterns="${PATTERNS:-randwrite 4k 1,randwrite 4k 32,randread 4k 1,randread 4k 32,write 1m 8,read 1m 8}"
IFS=, read -r -a layout_specs <<<"$layouts"
IFS=, read -r -a specs <<<"$patterns"

daemon_in "$bin" "$work"
ctl=("$bin" --control "$work/ctl.sock")
mkdir -p "$work/disks"
disks=()
for i in 0 1 2 3; do
    truncate -s "$disk_size" "$work/disks/d$i.img"
    disks+=("$work/disks/d$i.img${MODEL:+,model=$MODEL}")
done
"${ctl[@]}" pool create p "${disks[@]}" --slab 64M >/dev/null
names=()
for entry in "${layout_specs[@]}"; do
    name="${entry%%:*}"
    read -r -a args <<<"${entry#*:}"
    names+=("$name")
    for sums in on off; do
        "${ctl[@]}" space create p "$name-$sums" "${args[@]}" --size "$space_size" --checksums "$sums" >/dev/null
        fio --name=fill --ioengine=nbd --uri="nbd+unix:///$name-$sums?socket=$work/nbd.sock" \
            --rw=write --bs=1M --iodepth=16 --size="$space_size" >/dev/null 2>&1
    done
done

# fio on a space; prints "MB/s CPU-s/GB written-per-byte" (the bytes the
# daemon wrote to its disks over the bytes the client moved).
mbs() {
    local space="$1" rw="$2" bs="$3" depth="$4" before after mbs wrote_before wrote_after
    before=$(awk '{print $14 + $15}' "/proc/$daemon/stat")
    wrote_before=$(awk '/^write_bytes/ {print $2}' "/proc/$daemon/io")
    mbs=$(fio --name=cs --ioengine=nbd --uri="nbd+unix:///$space?socket=$work/nbd.sock" \
        --rw="$rw" --bs="$bs" --iodepth="$depth" --size="$space_size" --time_based \
        --runtime="$seconds" --ramp_time=1 --output-format=json 2>/dev/null |
        fio_mbs)
    after=$(awk '{print $14 + $15}' "/proc/$daemon/stat")
    wrote_after=$(awk '/^write_bytes/ {print $2}' "/proc/$daemon/io")
    python3 -c 'import sys; t, hz, mbs, s, w = map(float, sys.argv[1:]); moved = mbs * (s + 1); print("%s %.3f %.2f" % (sys.argv[3], t / hz / (moved / 1000), w / 1e6 / moved))' \
        "$((after - before))" "$(getconf CLK_TCK)" "$mbs" "$seconds" "$((wrote_after - wrote_before))"
}

results="$work/results"
: >"$results"
echo "| round | layout | pattern | on MB/s | off MB/s | on CPU s/GB | off CPU s/GB | on written per byte | off written per byte |"
echo "|---|---|---|---|---|---|---|---|---|"
for round in $(seq "$rounds"); do
    for name in "${names[@]}"; do
        for spec in "${specs[@]}"; do
            read -r rw bs depth <<<"$spec"
            if [ $((round % 2)) -eq 1 ]; then order="on off"; else order="off on"; fi
            declare -A got=()
            for sums in $order; do
                got[$sums]=$(mbs "$name-$sums" "$rw" "$bs" "$depth")
            done
            read -r on_mbs on_cpu on_wrote <<<"${got[on]}"
            read -r off_mbs off_cpu off_wrote <<<"${got[off]}"
            echo "| $round | $name | $spec | $on_mbs | $off_mbs | $on_cpu | $off_cpu | $on_wrote | $off_wrote |"
            echo "$name|$spec|$on_mbs|$off_mbs|$on_cpu|$off_cpu|$on_wrote|$off_wrote" >>"$results"
        done
    done
done
echo
echo "| layout | pattern | on MB/s | off MB/s | MB/s on / off: min | median | max | on CPU s/GB | off CPU s/GB | CPU on / off: min | median | max | written per byte on | off |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, spec, *figures = line.strip().split("|")
    rows.setdefault((name, spec), []).append([float(f) for f in figures])
for (name, spec), runs in rows.items():
    median = [statistics.median(r[i] for r in runs) for i in range(6)]
    speed = sorted(r[0] / r[1] for r in runs)
    cpu = sorted(r[2] / r[3] for r in runs)
    print(f"| {name} | {spec} | {median[0]:.1f} | {median[1]:.1f} | {speed[0]:.2f} | "
          f"{statistics.median(speed):.2f} | {speed[-1]:.2f} | {median[2]:.2f} | {median[3]:.2f} | "
          f"{cpu[0]:.2f} | {statistics.median(cpu):.2f} | {cpu[-1]:.2f} | "
          f"{median[4]:.2f} | {median[5]:.2f} |")
EOF

#!/usr/bin/env bash
# Two or more builds on a simple space over raw files (no drive models),
# alternating, with the daemon's CPU time per GB: an A/B of the data path
# where the disks are fast and the daemon's CPU is what limits it.
#
#   bench/simple-ab.sh [rounds] [seconds-per-run]
#
# Each round, for every build in BINS (default: this checkout's release
# build), starts a daemon with a pool of 4 sparse 4 GiB files under
# /var/tmp and a 2 GiB simple space, fills the space with 1 MiB writes,
# then runs with fio's nbd engine each of PATTERNS (fio rw, block size,
# outstanding I/Os per connection, and optionally the number of connections
# (default 1); default "write 64k 8,write 64k 64,randwrite 4k 64",
# e.g. "read 64k 8,read 64k 64" for reads; 1 s ramp, then the given
# seconds each). Prints MB/s and the daemon's CPU seconds per GB moved
# (its CPU time over the ramp and the run, over the bytes of the run
# stretched to the ramp). Needs fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-3}"
seconds="${2:-6}"
ab_work simple-ab

patterns="${PATTERNS:-write 64k 8,write 64k 64,randwrite 4k 64}"
IFS=, read -r -a specs <<<"$patterns"
header="| round | build |"
rule="|---|---|"
for spec in "${specs[@]}"; do
    header="$header $spec: MB/s | CPU s/GB |"
    rule="$rule---|---|"
done
echo "$header"
echo "$rule"
# A daemon of BIN in DIR with pool p (4 sparse 4 GiB files) and a filled
# 2 GiB simple space s.
raw_pool() {
    local bin="$1" dir="$2" i
    daemon_in "$bin" "$dir"
    ctl=("$bin" --control "$dir/ctl.sock")
    mkdir -p "$dir/disks"
    disks=()
    for i in 0 1 2 3; do
        truncate -s 4G "$dir/disks/d$i.img"
        disks+=("$dir/disks/d$i.img")
    done
    "${ctl[@]}" pool create p "${disks[@]}" >/dev/null
    "${ctl[@]}" space create p s --layout simple --size 2G >/dev/null
    fio --name=fill --ioengine=nbd --uri="nbd+unix:///s?socket=$dir/nbd.sock" --rw=write \
        --bs=1M --iodepth=16 --size=2G >/dev/null 2>&1
}

# One round of one build: every pattern, with the daemon's CPU.
ab_round() {
    local round="$1" bin="$2" spec rw bs depth before after mbs
    local uri="nbd+unix:///s?socket=$work/nbd.sock" line="| $round | $bin"
    for spec in "${specs[@]}"; do
        read -r rw bs depth jobs <<<"$spec"
        before=$(awk '{print $14 + $15}' "/proc/$daemon/stat")
        mbs=$(fio --name=ab --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" \
            --iodepth="$depth" --numjobs="${jobs:-1}" --group_reporting --size=2G --time_based --runtime="$seconds" --ramp_time=1 \
            --output-format=json 2>/dev/null |
            fio_mbs)
        after=$(awk '{print $14 + $15}' "/proc/$daemon/stat")
        line="$line | $mbs | $(python3 -c 'import sys; t, hz, mbs, s = map(float, sys.argv[1:]); print("%.2f" % (t / hz / (mbs * (s + 1) / 1000)))' \
            "$((after - before))" "$(getconf CLK_TCK)" "$mbs" "$seconds")"
    done
    echo "$line |"
}
ab_rounds "$rounds" ab_round raw_pool

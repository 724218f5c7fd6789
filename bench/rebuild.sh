#!/usr/bin/env bash
# Rebuild of one failed disk in a 12-disk pool of drive models (hdd-10k):
#
#   spare     11 capacity disks + 1 hot spare: everything the failed disk
#             held is rebuilt onto the one spare;
#   parallel  12 capacity disks: the failed disk's slabs are rebuilt into
#             free space on the other 11 at once (the default policy);
#   limit     the time to read the failed disk's bytes sequentially from
#             one modelled drive (the least a rebuild onto one disk takes),
#             from the streaming rate of a one-disk pool in the same run.
#
# Also the client side: the database profile (8 KiB random, 67 % reads) at
# 16 outstanding I/Os on the 2-way mirror space, healthy and then during
# each rebuild at the default rate limit.
#
#   bench/rebuild.sh [space-size] [disk-size]
#
# Prints a markdown table. Binds only Unix sockets; see bench/lib.sh for the
# binary and the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

space_size="${1:-24G}"
disk_size="${2:-16G}"
. bench/lib.sh
bench_daemon rebuild

# database profile on a space for a few seconds; prints IO/s.
database() {
    "$terrace" "${ctl[@]}" bench --profile database --depths 16 --warmup 1s --duration 4s \
        --prefill never --no-progress --json "x=nbd+unix:///$1?socket=$nbd" 2>/dev/null |
        json 'd["points"][0]["iops"]'
}

# A pool of `count` hdd-10k files, the last `spares` of them hot spares, and
# a 2-way mirror space on it.
make_pool() {
    local pool="$1" count="$2" spares="$3" disks=()
    mkdir -p "$work/$pool"
    for i in $(seq 1 "$count"); do
        truncate -s "$disk_size" "$work/$pool/hdd$i.img"
        if [ "$i" -gt $((count - spares)) ]; then
            disks+=("$work/$pool/hdd$i.img,model=hdd-10k,media=hdd,usage=hot-spare")
        else
            disks+=("$work/$pool/hdd$i.img,model=hdd-10k,media=hdd")
        fi
    done
    "$terrace" "${ctl[@]}" pool create "$pool" "${disks[@]}" >/dev/null
    "$terrace" "${ctl[@]}" pool set "$pool" --retire-missing always >/dev/null
    [ "$count" -gt 1 ] || return 0
    "$terrace" "${ctl[@]}" space create "$pool" "$pool-m" --layout mirror --copies 2 \
        --size "$space_size" >/dev/null
}

# Fail disk 0 of a pool (its file goes away), time its repair from the
# job's start to its end and measure the client meanwhile; prints "seconds bytes client-IO/s".
rebuild() {
    local pool="$1"
    local bytes
    bytes=$("$terrace" "${ctl[@]}" pool status "$pool" --json |
        json 'd[0]["disks"][0]["slabs_used"] * d[0]["slab_bytes"]')
    rm "$work/$pool/hdd1.img"
    local job=""
    for _ in $(seq 600); do
        job=$("$terrace" "${ctl[@]}" job list --json |
            json '" ".join(str(j["id"]) for j in d if j["pool"] == "'"$pool"'" and j["kind"] == "repair")')
        [ -n "$job" ] && break
        sleep 0.1
    done
    [ -n "$job" ] || { echo "no repair started on $pool" >&2; exit 1; }
    local start
    start=$(date +%s.%N)
    local during
    during=$(database "$pool-m")
    # Wait until no job of the pool runs; every repair must have finished.
    local active
    while :; do
        active=$("$terrace" "${ctl[@]}" job list --json |
            json 'sum(1 for j in d if j["pool"] == "'"$pool"'" and j["state"] in ("running", "paused"))')
        [ "$active" = 0 ] && break
        sleep 0.2
    done
    local failed
    failed=$("$terrace" "${ctl[@]}" job list --json |
        json '" ".join(str(j["id"]) + ":" + j["state"] for j in d if j["pool"] == "'"$pool"'" and j["state"] != "done")')
    [ -z "$failed" ] || { echo "repair on $pool: jobs $failed" >&2; exit 1; }
    local end
    end=$(date +%s.%N)
    echo "$(python3 -c "print(f'{$end - $start:.1f}')") $bytes $during"
}

make_pool one 1 0
"$terrace" "${ctl[@]}" space create one one-s --layout simple --size 8G >/dev/null
one_mb_s=$("$terrace" "${ctl[@]}" bench --profile streaming --depths 8 --warmup 1s \
    --duration 4s --size 4G --prefill never --no-progress --json \
    "x=nbd+unix:///one-s?socket=$nbd" 2>/dev/null | json 'd["points"][0]["mb_per_s"]')

make_pool spare 12 1
spare_healthy=$(database spare-m)
read -r spare_s spare_bytes spare_during <<<"$(rebuild spare)"

make_pool parallel 12 0
parallel_healthy=$(database parallel-m)
read -r parallel_s parallel_bytes parallel_during <<<"$(rebuild parallel)"

python3 - "$one_mb_s" "$spare_s" "$spare_bytes" "$spare_healthy" "$spare_during" \
    "$parallel_s" "$parallel_bytes" "$parallel_healthy" "$parallel_during" <<'PY'
import sys
one, s_s, s_b, s_h, s_d, p_s, p_b, p_h, p_d = map(float, sys.argv[1:])
print(f"one hdd-10k reads sequentially at {one:.1f} MB/s\n")
print("| rebuild | bytes on the failed disk | seconds | MB/s | limit: one disk read (s) | database IO/s healthy | during rebuild | during / healthy |")
print("|---|---|---|---|---|---|---|---|")
for name, s, b, h, d in (("hot spare", s_s, s_b, s_h, s_d), ("parallel into free space", p_s, p_b, p_h, p_d)):
    print(f"| {name} | {b / 2**30:.2f} GiB | {s:.1f} | {b / s / 1e6:.0f} | {b / one / 1e6:.1f} | {h:.0f} | {d:.0f} | {d / h:.2f} |")
print(f"\nparallel / hot spare speed-up: {s_s / p_s:.2f}×")
PY

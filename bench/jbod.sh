#!/usr/bin/env bash
# Do drive models make sparse files behave like a JBOD? One pool of a single
# hdd-10k file and one of eight, a simple space on each (1 and 8 columns),
# the streaming (64 KiB sequential reads) and restore (64 KiB sequential
# writes) profiles over outstanding I/Os through NBD, and the ratio
# eight / one at each depth: a real JBOD of 8 drives striped streams about
# 8 × one drive once enough requests are in flight to keep every drive busy.
#
#   bench/jbod.sh [seconds-per-point] [depths]
#
# Binds only Unix sockets; see bench/lib.sh for the binary and the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-3}"
depths="${2:-1,8,32,64,128}"
. bench/lib.sh
bench_daemon jbod

make_pool() {
    local name="$1" count="$2" disks=()
    mkdir -p "$work/$name"
    for i in $(seq 1 "$count"); do
        truncate -s 16G "$work/$name/hdd$i.img"
        disks+=("$work/$name/hdd$i.img,model=hdd-10k,media=hdd")
    done
    "$terrace" "${ctl[@]}" pool create "$name" "${disks[@]}" >/dev/null
    "$terrace" "${ctl[@]}" space create "$name" "$name" --layout simple --columns "$count" --size 8G >/dev/null
}
make_pool one 1
make_pool eight 8

"$terrace" "${ctl[@]}" bench --profile streaming --profile restore --depths "$depths" \
    --warmup 1s --duration "${seconds}s" --size 4G --no-progress --json-file "$work/jbod.json" \
    "one=nbd+unix:///one?socket=$nbd" \
    "eight=nbd+unix:///eight?socket=$nbd" >/dev/null
python3 - "$work/jbod.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
points = {}
for p in report["points"]:
    points[(p["profile"], p["target"], p["outstanding"])] = p["mb_per_s"]
profiles = sorted({k[0] for k in points}, key=["streaming", "restore"].index)
depths = sorted({k[2] for k in points})
print("| profile | outstanding I/Os | 1 × hdd-10k MB/s | 8 × hdd-10k simple MB/s | eight / one |")
print("|---|---|---|---|---|")
for profile in profiles:
    for depth in depths:
        one = points.get((profile, "one", depth))
        eight = points.get((profile, "eight", depth))
        if one and eight:
            print(f"| {profile} | {depth} | {one:.1f} | {eight:.1f} | {eight / one:.2f} |")
PY

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
# Binds only Unix sockets. The binary is built and taken from
# $CARGO_TARGET_DIR (default target/).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-3}"
depths="${2:-1,8,32,64,128}"
work="$(mktemp -d /var/tmp/terrace-jbod.XXXXXX)"
pids=()
cleanup() {
    set +e
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cargo build --release -q -p terrace
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$(pwd)/$target_dir" ;; esac
terrace="$target_dir/release/terrace"
ctl=(--control "$work/ctl.sock")

"$terrace" daemon --state-dir "$work/state" --control "$work/ctl.sock" \
    --nbd-socket "$work/nbd.sock" --no-tcp 2>"$work/daemon.log" &
pids+=($!)
for _ in $(seq 100); do "$terrace" "${ctl[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done

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
    "one=nbd+unix:///one?socket=$work/nbd.sock" \
    "eight=nbd+unix:///eight?socket=$work/nbd.sock" >/dev/null
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

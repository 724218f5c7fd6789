#!/usr/bin/env bash
# Write-back cache benchmark: the white paper's machine from drive models
# (8 × hdd-10k + 3 × ssd-sata journal disks), parity with and without the
# log against a 2-way mirror, over the write-bearing standard profiles; then
# the same layouts on the raw files (no models) beside btrfs raid5/raid6 on
# loop devices over the same kind of files.
#
#   bench/writeback.sh [seconds-per-run] [outstanding-ios]
#
# DEPTHS="1 8 32 128" sweeps outstanding I/Os instead (every part, every
# profile, at each depth in turn; one table per depth).
#
# Each run on a space with a log starts from an empty log (the previous
# run's dirty data is destaged first), as separate measurements would; a
# run shows what the log absorbs plus what destaging manages meanwhile.
# Prints markdown tables (IO/s and MB/s per space and profile, and the
# ratios the write-back issue aims at). The restore limit, a simple space
# striped over all eight drives, is measured before and after the other
# spaces' restores and averaged. Each part stops its processes and deletes
# its files before the next starts. A third part puts btrfs raid5/raid6
# on the same modelled drives: eight one-disk pools of `hdd-10k` files, each
# a simple space served over NBD, presented as files by nbdfuse and as
# block devices by loop devices. PROFILES, SPACES and PARTS (model, raw,
# btrfs-model) narrow a run (e.g. PROFILES="restore random-write"
# SPACES="p2-log p2" PARTS=model);
# ratios whose operands were not measured are left out. Parity spaces are
# 8 columns wide and the mirror 4 (2 copies), as in the paper: every drive
# holds a column of every row, so the full-stripe limit is exactly (data
# columns / 8) of the eight drives' aggregate bandwidth (left to choose, a
# space keeps one drive free for rebuilds and uses seven). Parity spaces get
# INTERLEAVE (default 64K: rows of 448 and 384 KiB, which 8 outstanding
# 64 KiB writes cover, so a stream's rows go straight to the disks; with the
# 256K default a stream needs 28 or 24 of them in flight for that);
# INTERLEAVE=256K measures the default. The journal SSDs' backing files
# live in memory (SSD_DIR, default /dev/shm; SSD_DIR= keeps them beside the
# HDDs' files): a modelled SSD acknowledges a FUA write from its protected
# buffer in 30 us, but on the host disk its backing file's flush behind
# every FUA log record takes longer than that and would show through (see
# docs/BENCHMARKS.md). Needs root (loop devices, mount),
# fio, btrfs-progs. The binary is built and taken from $CARGO_TARGET_DIR
# (default target/).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

seconds="${1:-10}"
depth="${2:-32}"
depths="${DEPTHS:-$depth}"
interleave="${INTERLEAVE:-64K}"
export SSD_DIR="${SSD_DIR-/dev/shm}"
work="$(mktemp -d /var/tmp/terrace-writeback.XXXXXX)"
pids=()
loops=()
fuses=()
cleanup() {
    set +e
    mountpoint -q "$work/btrfs" && umount "$work/btrfs"
    for loop in "${loops[@]}"; do losetup -d "$loop"; done
    for fuse in "${fuses[@]}"; do fusermount3 -u "$fuse"; done
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    rm -rf "$work" "${ssd_dirs[@]}"
}
trap cleanup EXIT

for tool in fio mkfs.btrfs nbdfuse fusermount3; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
cargo build --release -q -p terrace
terrace="${CARGO_TARGET_DIR:-target}/release/terrace"

# name rw bs rwmixread size: the paper's five profiles, then 4 KiB and
# 8 KiB random writes. Streaming reads the first 1008 MiB of each target, written whole
# rows at a time before any profile runs (see prefill): unwritten extents
# of a btrfs file read as zeroes without touching a drive.
profiles=(
    "file-copy randrw 64k 50 8G"
    "file-server randrw 64k 67 8G"
    "database randrw 8k 67 8G"
    "restore write 64k 0 8G"
    "streaming read 64k 100 1008M"
    "random-write randwrite 4k 0 8G"
    "random-write-8k randwrite 8k 0 8G"
)

# Write the range streaming reads, in writes of whole rows of every parity
# layout here (10.5 MiB: 7 × 1.5 MiB and 6 × 1.75 MiB). $1: fio's target.
prefill() {
    fio --name=prefill $1 --rw=write --bs=10752k --size=1008M --iodepth=4 \
        >"$work/prefill.log" 2>&1 || { echo "prefill failed on $1:" >&2; cat "$work/prefill.log" >&2; }
}

# fio on a target; prints "IO/s MB/s".
run_fio() {
    local target="$1" rw="$2" bs="$3" mix="$4" size="$5"
    local out="$work/fio.json"
    local rc=0
    fio --name=bench $target --rw="$rw" --bs="$bs" --rwmixread="$mix" --iodepth="$depth" \
        --size="$size" --time_based --runtime="$seconds" --ramp_time=2 \
        --output-format=json --output="$out" >"$work/fio.log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        # Everything fio said, wherever it said it.
        echo "fio failed (exit $rc) on $target:" >&2
        cat "$work/fio.log" >&2
        tail -n 20 "$out" >&2 2>/dev/null
        echo "0 0"
        return
    fi
    python3 - "$out" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
# fio may print notes before its JSON document.
job = json.loads(text[text.index("{"):])["jobs"][0]
iops = job["read"]["iops"] + job["write"]["iops"]
mbs = (job["read"]["bw_bytes"] + job["write"]["bw_bytes"]) / 1e6
print(f"{iops:.0f} {mbs:.1f}")
PY
}

# Wait (at most 5 minutes) until a space's log holds nothing dirty, so each
# run starts from an empty log as a separate measurement would.
drain() {
    local dir="$1" space="$2"
    for _ in $(seq 600); do
        dirty=$("$terrace" --control "$dir/ctl.sock" space show "$space" --json |
            python3 -c 'import json,sys; c=json.load(sys.stdin)["space"].get("cache"); print(c["dirty_bytes"] if c else 0)')
        [ "$dirty" = 0 ] && return
        sleep 0.5
    done
    echo "warning: $space still has $dirty dirty bytes" >&2
}

# Stop every daemon and nbdfuse started so far (an nbdfuse has usually
# exited already, once unmounted).
stop_all() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    pids=()
}

# A part is done: stop its processes and delete its files, so that the
# next part has the disk's free space (a full run writes tens of GB into
# sparse files; btrfs on a full disk fails its writes).
end_part() {
    stop_all
    rm -rf "$1" "${ssd_dirs[@]}"
    ssd_dirs=()
    df -h "$work" | tail -n 1 >&2
}

start_daemon() {
    local dir="$1"
    mkdir -p "$dir"
    daemon_in "$terrace" "$dir"
    pids+=("$daemon")
}

# Spaces of one pool; $1 folder, $2 "model" or "raw".
make_pool() {
    local dir="$1" kind="$2" disks
    paper_disks "$dir" "$kind"
    local ctl=(--control "$dir/ctl.sock")
    "$terrace" "${ctl[@]}" pool create wb "${disks[@]}" --slab 256M >/dev/null
    "$terrace" "${ctl[@]}" space create wb p2-log --layout parity --redundancy 2 --columns 8 --interleave "$interleave" --size 8G --cache 1G >/dev/null
    "$terrace" "${ctl[@]}" space create wb p2 --layout parity --redundancy 2 --columns 8 --interleave "$interleave" --size 8G --cache 0 >/dev/null
    "$terrace" "${ctl[@]}" space create wb p1-log --layout parity --redundancy 1 --columns 8 --interleave "$interleave" --size 8G --cache 1G >/dev/null
    "$terrace" "${ctl[@]}" space create wb p1 --layout parity --redundancy 1 --columns 8 --interleave "$interleave" --size 8G --cache 0 >/dev/null
    "$terrace" "${ctl[@]}" space create wb m2 --layout mirror --copies 2 --columns 4 --size 8G --cache 0 >/dev/null
    "$terrace" "${ctl[@]}" space create wb m2-log --layout mirror --copies 2 --columns 4 --size 8G --cache 1G >/dev/null
    # The drives' aggregate bandwidth, measured the same way: a simple
    # space striped over all eight (restore only).
    "$terrace" "${ctl[@]}" space create wb s8 --layout simple --columns 8 --size 8G --cache 0 >/dev/null
}

# prefill_spaces DIR SPACE...: prefill each space wanted of DIR's daemon,
# then drain its log.
prefill_spaces() {
    local dir="$1" space
    shift
    wanted "${PROFILES:-}" streaming || return 0
    for space in "$@"; do
        wanted "${SPACES:-}" "$space" || continue
        prefill "--ioengine=nbd --uri=nbd+unix:///$space?socket=$dir/nbd.sock"
        drain "$dir" "$space"
    done
}

wanted() { # wanted LIST ITEM: ITEM is in LIST, or LIST is empty
    [ -z "$1" ] || [[ " $1 " == *" $2 "* ]]
}

# One profile on a space of the daemon in DIR: "KIND PROFILE SPACE IO/s
# MB/s" into the results, then the space's log drained.
run_space() {
    local kind="$1" dir="$2" name="$3" rw="$4" bs="$5" mix="$6" size="$7" space="$8"
    local uri="nbd+unix:///$space?socket=$dir/nbd.sock"
    echo "$kind@$depth $name $space $(run_fio "--ioengine=nbd --uri=$uri" "$rw" "$bs" "$mix" "$size")" >>"$results"
    tail -1 "$results" >&2
    drain "$dir" "$space"
}

# A loop device (direct I/O) on FILE, added to `devs` and to `loops` (which
# cleanup detaches); detach_loops lets them all go.
attach_loop() {
    local loop
    loop=$(losetup --find --show --direct-io=on "$1")
    loops+=("$loop")
    devs+=("$loop")
}
detach_loops() {
    for loop in "${loops[@]}"; do losetup -d "$loop"; done
    loops=()
}

# btrfs data raidN (metadata raid1c3) on the given devices, every profile;
# results as "KIND PROFILE btrfs-LEVEL IO/s MB/s".
run_btrfs() {
    local kind="$1" level="$2"
    shift 2
    mkdir -p "$work/btrfs"
    mkfs.btrfs -q -f -d "$level" -m raid1c3 "$@" >/dev/null
    mount "$1" "$work/btrfs"
    df -h "$work/btrfs" | tail -n 1 >&2
    if wanted "${PROFILES:-}" streaming; then
        prefill "--ioengine=libaio --direct=1 --filename=$work/btrfs/file"
    fi
    for depth in $depths; do
        for profile in "${profiles[@]}"; do
            read -r name rw bs mix size <<<"$profile"
            wanted "${PROFILES:-}" "$name" || continue
            echo "$kind@$depth $name btrfs-$level $(run_fio "--ioengine=libaio --direct=1 --filename=$work/btrfs/file" "$rw" "$bs" "$mix" "$size")" >>"$results"
            tail -1 "$results" >&2
        done
    done
    umount "$work/btrfs"
}

results="$work/results.txt"
: >"$results"

if wanted "${PARTS:-}" model; then
echo "== with drive models (8 × hdd-10k, 3 × ssd-sata journal disks)" >&2
start_daemon "$work/model"
make_pool "$work/model" model
prefill_spaces "$work/model" s8 p2-log p2 p1-log p1 m2 m2-log
for depth in $depths; do
for profile in "${profiles[@]}"; do
    read -r name rw bs mix size <<<"$profile"
    wanted "${PROFILES:-}" "$name" || continue
    # The limit (s8) is measured first and last, and averaged: the shared
    # machine's speed drifts over the minutes between.
    for space in s8 p2-log p2 p1-log p1 m2 m2-log s8; do
        wanted "${SPACES:-}" "$space" || continue
        [ "$space" = s8 ] && [ "$name" != restore ] && continue
        run_space model "$work/model" "$name" "$rw" "$bs" "$mix" "$size" "$space"
    done
done
done
end_part "$work/model"
fi

if wanted "${PARTS:-}" raw; then
echo "== raw files, terrace vs btrfs raid5/raid6 on loop devices" >&2
start_daemon "$work/raw"
make_pool "$work/raw" raw
prefill_spaces "$work/raw" p2-log p1-log
for level in raid5 raid6; do
    mkdir -p "$work/$level" "$work/btrfs"
    devs=()
    for i in $(seq 0 7); do
        truncate -s 24G "$work/$level/d$i.img"
        attach_loop "$work/$level/d$i.img"
    done
    run_btrfs raw "$level" "${devs[@]}"
    detach_loops
    rm -rf "$work/$level"
done
for depth in $depths; do
for profile in "${profiles[@]}"; do
    read -r name rw bs mix size <<<"$profile"
    wanted "${PROFILES:-}" "$name" || continue
    for space in p2-log p1-log; do
        wanted "${SPACES:-}" "$space" || continue
        run_space raw "$work/raw" "$name" "$rw" "$bs" "$mix" "$size" "$space"
    done
done
done
end_part "$work/raw"
fi

if wanted "${PARTS:-}" btrfs-model; then
echo "== btrfs raid5/raid6 on the same modelled drives (one-disk pools over NBD, nbdfuse, loop)" >&2
for level in raid5 raid6; do
    # A daemon and fresh drives for each level: the previous file system's
    # blocks would otherwise be read and written again, and its files
    # would hold the disk's space.
    dir="$work/bm-$level"
    start_daemon "$dir"
    mkdir -p "$dir/disks"
    devs=()
    for i in $(seq 0 7); do
        disk="$dir/disks/$level-hdd$i.img"
        truncate -s 24G "$disk"
        "$terrace" --control "$dir/ctl.sock" pool create "$level$i" "$disk,model=hdd-10k,media=hdd" --slab 256M >/dev/null
        "$terrace" --control "$dir/ctl.sock" space create "$level$i" "$level-d$i" --layout simple --size 4G >/dev/null
        mkdir -p "$dir/fuse-$level$i"
        nbdfuse -P "$dir/fuse-$level$i.pid" "$dir/fuse-$level$i/disk" "nbd+unix:///$level-d$i?socket=$dir/nbd.sock" \
            </dev/null >"$dir/fuse-$level$i.log" 2>&1 &
        pids+=($!)
        fuses+=("$dir/fuse-$level$i")
        for _ in $(seq 100); do [ -s "$dir/fuse-$level$i.pid" ] && break; sleep 0.1; done
        attach_loop "$dir/fuse-$level$i/disk"
    done
    run_btrfs model "$level" "${devs[@]}"
    detach_loops
    for fuse in "${fuses[@]}"; do fusermount3 -u "$fuse"; done
    fuses=()
    end_part "$dir"
done
fi

python3 - "$results" <<'PY'
import sys, collections
rows = collections.defaultdict(dict)
runs = collections.defaultdict(list)
depths = []
for line in open(sys.argv[1]):
    kind, profile, target, iops, mbs = line.split()
    base, depth = kind.split("@")
    if depth not in depths:
        depths.append(depth)
    runs[(base, depth, profile, target)].append((float(iops), float(mbs)))
# A target measured more than once (the restore limit) counts as its mean.
for (base, depth, profile, target), measured in runs.items():
    rows[(base, depth, profile)][target] = tuple(sum(m[i] for m in measured) / len(measured) for i in (0, 1))
def cell(by, t):
    return f"{by[t][0]:.0f} ({by[t][1]:.1f})" if t in by else "–"
def ratio(by, a, b):
    return f"{by[a][0] / max(by[b][0], 1e-9):.2f}" if a in by and b in by else "–"
spaces = ["p2-log", "p2", "p1-log", "p1", "m2", "m2-log", "btrfs-raid6", "btrfs-raid5"]
targets = ["p2-log", "btrfs-raid6", "p1-log", "btrfs-raid5"]
to_btrfs = [("p2-log", "btrfs-raid6"), ("p1-log", "btrfs-raid5")]
short = lambda t: t.removeprefix("btrfs-")
# One table of a part at one depth: a row per profile, a column per
# target, then the ratios; False if the part measured nothing there.
def table(base, depth, title, columns, ratios):
    measured = [(profile, by) for (b, d, profile), by in rows.items() if b == base and d == depth]
    if not measured:
        return False
    print(f"{title}, {depth} outstanding I/Os: IO/s (MB/s)\n")
    print("| profile | " + " | ".join(columns) + " | " + " | ".join(f"{a} / {short(b)}" for a, b in ratios) + " |")
    print("|---|" + "---|" * (len(columns) + len(ratios)))
    for profile, by in measured:
        cells = [cell(by, t) for t in columns] + [ratio(by, a, b) for a, b in ratios]
        print(f"| {profile} | " + " | ".join(cells) + " |")
    return True
for depth in depths:
    if table("model", depth, "With drive models", spaces, [("p2-log", "m2"), ("p2-log", "m2-log"), ("p2-log", "p2"), ("p1-log", "p1")] + to_btrfs):
        restore = rows.get(("model", depth, "restore"), {})
        if "s8" in restore:
            limit = restore["s8"][1]
            each = ", ".join(f"{m[1]:.1f}" for m in runs[("model", depth, "restore", "s8")])
            print(f"\nRestore against the drives' aggregate bandwidth (s8: simple over all 8, {limit:.1f} MB/s, the mean of {each}):")
            for space, data, columns in (("p2-log", 6, 8), ("p1-log", 7, 8)):
                if space in restore:
                    print(f"- {space}: {restore[space][1]:.1f} MB/s = {restore[space][1] / (limit * data / columns):.2f}"
                          f" of the full-stripe limit ({data}/{columns} × {limit:.1f})")
        print()
    if table("raw", depth, "Raw files (no models)", targets, to_btrfs):
        print()
PY

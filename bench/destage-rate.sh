#!/usr/bin/env bash
# How fast destaging takes a restore stream (64 KiB sequential writes) home
# from journaled single parity, on the white paper's modelled HDDs, against
# the same disks' full-stripe limit measured in the same round.
#
#   bench/destage-rate.sh [rounds] [seconds-per-run]
#
# Each round, for every build in BINS (default: this checkout's release
# build), makes a fresh pool (8 × hdd-10k + 3 journal SSDs of SSD_MODEL,
# default nvme so that the log takes writes faster than destaging can move
# them; SSD_DIR, default /dev/shm, holds their files) with an 8-column
# single-parity space with a 1 GiB log and a 64 KiB interleave (rows of
# 448 KiB), and a simple space over the eight HDDs (`s8`). It writes the
# parity space at DEPTH (default 3) outstanding writes for the given
# seconds, sampling the log each second after fio's 2 s ramp; then it
# writes `s8` at 32 outstanding writes (the disks' streaming limit). Prints
# the client's MB/s, the bytes destaged per second while writes came, the
# highest fill, the median of the sampled round rates (`space show`'s
# destage rate: the last round's bytes over its time, i.e. how fast a
# round moves data once it runs), and that rate as a share of 7/8 × s8 (the
# data share of a full-stripe write). Where destaging keeps up, the log
# stays near its start threshold (25 %) and the bytes destaged per second
# are the client's. Builds alternate within a round. Needs fio.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

rounds="${1:-1}"
seconds="${2:-12}"
depth="${DEPTH:-3}"
export SSD_DIR="${SSD_DIR-/dev/shm}" SSD_MODEL="${SSD_MODEL:-nvme}"
ab_work destage-rate

echo "| round | build | client MB/s | destaged MB/s while writing | highest fill % | round rate MB/s (median) | s8 MB/s at 32 | round rate ÷ 7/8 × s8 |"
echo "|---|---|---|---|---|---|---|---|"
cache() {
    "${ctl[@]}" space show p1-log --json |
        python3 -c 'import json,sys; c = json.load(sys.stdin)["space"]["cache"]; print(*(c[k] for k in sys.argv[1:]))' "$@"
}
rate_round() {
    local round="$1" bin="$2" client destaged0 destaged1 ramp s8
    "${ctl[@]}" space create wb p1-log --layout parity --redundancy 1 --columns 8 \
        --interleave 64K --size 8G --cache 1G >/dev/null
    "${ctl[@]}" space create wb s8 --layout simple --columns 8 --size 8G --cache 0 >/dev/null
    (
        sleep 2
        for _ in $(seq "$seconds"); do sleep 1; cache fill_percent destage_rate_bytes_per_second; done
    ) >"$work/samples" &
    sampler=$!
    # restore_mbs ramps for 2 s first: the destaged bytes are counted from
    # the end of the ramp, as fio counts the client's.
    (sleep 2; cache destaged_bytes >"$work/destaged0") &
    ramp=$!
    client=$(restore_mbs p1-log "$depth" "$seconds")
    destaged1=$(cache destaged_bytes)
    wait "$sampler" "$ramp"
    sampler=
    destaged0=$(cat "$work/destaged0")
    s8=$(restore_mbs s8 32 "$seconds")
    python3 - "$round" "$bin" "$client" "$destaged0" "$destaged1" "$seconds" "$s8" "$work/samples" <<'PY'
import statistics, sys
round_, build, client, d0, d1, seconds, s8, samples = sys.argv[1:]
rows = [line.split() for line in open(samples) if line.strip()]
fill = max(int(r[0]) for r in rows)
rates = [int(r[1]) / 1e6 for r in rows if int(r[1]) > 0]
rate = statistics.median(rates) if rates else 0.0
destaged = (int(d1) - int(d0)) / float(seconds) / 1e6
limit = float(s8) * 7 / 8
print(f"| {round_} | {build} | {float(client):.1f} | {destaged:.1f} | {fill} | {rate:.1f} "
      f"| {float(s8):.1f} | {rate / limit:.2f} |")
PY
}
ab_rounds "$rounds" rate_round

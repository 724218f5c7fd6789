#!/usr/bin/env bash
# How fast a scrub reads modelled drives, and what it leaves to clients.
#
#   bench/scrub.sh [rounds] [seconds-per-run] [space-size]
#
# One daemon, three pools of four hdd-10k sparse files of 64 GiB (the
# spaces lie in the drives' outer zone):
#   seq     a simple space over the four disks, checksums off: fio's
#           1 MiB sequential reads at 16 outstanding through the daemon
#           (shown, not the baseline: on a shared machine it moves with
#           the CPU the daemon gets);
#   mirror  a 2-way mirror over the four disks (two columns);
#   parity  single parity over the four disks (three data columns) with
#           its write-back log on the same disks;
# each space SIZE (default 4G) and filled by 3 MiB writes.
#
# Each round (the order of the parts alternates by round):
#   rate    the seq read, then `pool scrub` of the mirror and of the parity
#           pool, each timed from its start to its end (polled every
#           0.1 s) on an idle pool. Its rate is the bytes it read from
#           disks over that time; its limit is the bytes read over the
#           time the busiest disk takes to read its slabs at the model's
#           media rate (204 MB/s at the outer edge falling linearly to
#           125 at the inner, the slabs from the outer edge on).
#   client  fio 4 KiB random reads, then writes, 32 outstanding, on the
#           mirror space, alone and during a scrub of its pool (started
#           1 s before, at its default pace, cancelled after), which of
#           the two first alternating by round. Writes ramp for
#           WRITE_RAMP seconds (default 5) before they count, so that the
#           drives' write caches are full (as they stay under sustained
#           random writes) in both runs, not empty in one of them.
# Prints each round's figures, then min, median and max of each ratio.
# Needs fio; binds only Unix sockets; see bench/lib.sh for the binary.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${1:-3}"
seconds="${2:-5}"
size="${3:-4G}"
. bench/lib.sh
command -v fio >/dev/null || { echo "needs fio" >&2; exit 1; }
bench_daemon scrub
t=("$terrace" "${ctl[@]}")

# fio on a space; prints MB/s read + written.
mbs() {
    local space="$1" rw="$2" bs="$3" depth="$4" ramp=1
    case "$rw" in *write*) ramp="${WRITE_RAMP:-5}" ;; esac
    fio --name=scrub --ioengine=nbd --uri="nbd+unix:///$space?socket=$nbd" \
        --rw="$rw" --bs="$bs" --iodepth="$depth" --size="$size" --time_based \
        --runtime="$seconds" --ramp_time="$ramp" --output-format=json 2>/dev/null |
        fio_mbs
}

make_pool() {
    local pool="$1" disks=() i
    shift
    mkdir -p "$work/$pool"
    for i in 0 1 2 3; do
        truncate -s 64G "$work/$pool/hdd$i.img"
        disks+=("$work/$pool/hdd$i.img,model=hdd-10k,media=hdd")
    done
    "${t[@]}" pool create "$pool" "${disks[@]}" >/dev/null
    "${t[@]}" space create "$pool" "$pool" "$@" --size "$size" >/dev/null
    fio --name=fill --ioengine=nbd --uri="nbd+unix:///$pool?socket=$nbd" \
        --rw=write --bs=3M --iodepth=8 --size="$size" >/dev/null 2>&1
}

make_pool seq --layout simple --columns 4 --checksums off
make_pool mirror --layout mirror --copies 2 --columns 2
make_pool parity --layout parity --redundancy 1 --columns 4

# The running scrub's job id on a pool (empty if none).
scrub_job() {
    "${t[@]}" job list --json |
        json '" ".join(str(j["id"]) for j in d if j["pool"] == "'"$1"'" and j["kind"] == "scrub" and j["state"] == "running")'
}

# Scrub a pool from end to end; prints "seconds bytes_read seconds_at_media_rate".
scrub() {
    local pool="$1" start end job state
    start=$(date +%s.%N)
    "${t[@]}" pool scrub "$pool" >/dev/null
    job=$("${t[@]}" job list --json |
        json 'max(j["id"] for j in d if j["pool"] == "'"$pool"'" and j["kind"] == "scrub")')
    while :; do
        state=$("${t[@]}" job list --json | json '[j["state"] for j in d if j["id"] == '"$job"' and j["pool"] == "'"$pool"'"][0]')
        [ "$state" = running ] || break
        sleep 0.1
    done
    end=$(date +%s.%N)
    [ "$state" = done ] || { echo "scrub of $pool: $state" >&2; exit 1; }
    local bytes most
    bytes=$("${t[@]}" job list --json | json '[j["bytes_total"] for j in d if j["id"] == '"$job"' and j["pool"] == "'"$pool"'"][0]')
    # hdd-10k: 204 MB/s outer, 125 inner, over the 64 GiB file; reading
    # B bytes from the outer edge takes L/(o-i) * ln(o / (o - (o-i) B/L)).
    most=$("${t[@]}" pool status "$pool" --json | json 'max(__import__("math").log(204 / (204 - 79 * x["slabs_used"] * d[0]["slab_bytes"] / 2**36)) * 2**36 / 79e6 for x in d[0]["disks"])')
    echo "$(python3 -c "print(f'{$end - $start:.2f}')") $bytes $most"
}

# Client MB/s on the mirror space with or without a scrub of its pool.
client() {
    local rw="$1" with="$2" got job
    if [ "$with" = with ]; then
        "${t[@]}" pool scrub mirror >/dev/null
        sleep 1
        got=$(mbs mirror "$rw" 4k 32)
        job=$(scrub_job mirror)
        [ -n "$job" ] || { echo "the scrub ended before the client did; use a larger space" >&2; exit 1; }
        "${t[@]}" job cancel "$job" --pool mirror >/dev/null
        while [ -n "$(scrub_job mirror)" ]; do sleep 0.1; done
    else
        got=$(mbs mirror "$rw" 4k 32)
    fi
    echo "$got"
}

results="$work/results"
: >"$results"
echo "| round | part | figure | value |"
echo "|---|---|---|---|"
rate_part() {
    local round="$1" seq_mbs pool
    seq_mbs=$(mbs seq read 1m 16)
    echo "| $round | rate | seq read MB/s (4 drives) | $seq_mbs |"
    for pool in mirror parity; do
        read -r s bytes media_s <<<"$(scrub "$pool")"
        python3 - "$round" "$pool" "$s" "$bytes" "$media_s" "$results" <<'PY'
import sys
round_, pool, s, b, media_s, out = sys.argv[1:]
s, b, media_s = float(s), float(b), float(media_s)
rate = b / s / 1e6
limit = b / media_s / 1e6
print(f"| {round_} | rate | scrub {pool}: {b / 2**30:.2f} GiB in {s:.1f} s, MB/s (limit {limit:.1f}) | {rate:.1f} |")
with open(out, "a") as f:
    f.write(f"scrub {pool}|{rate}|{limit}\n")
PY
    done
}
client_part() {
    local round="$1" rw first second
    if [ $((round % 2)) -eq 1 ]; then first=without second=with; else first=with second=without; fi
    for rw in randread randwrite; do
        declare -A got=()
        got[$first]=$(client "$rw" "$first")
        got[$second]=$(client "$rw" "$second")
        echo "| $round | client | $rw 4k QD32 MB/s alone / during a scrub | ${got[without]} / ${got[with]} |"
        echo "client $rw|${got[with]}|${got[without]}" >>"$results"
    done
    sleep 5 # the drives destage their write caches: the next part's pool is idle
}
for round in $(seq "$rounds"); do
    if [ $((round % 2)) -eq 1 ]; then
        rate_part "$round"
        client_part "$round"
    else
        client_part "$round"
        rate_part "$round"
    fi
done
echo
echo "| figure | value (median) | baseline (median) | ratio min | median | max |"
echo "|---|---|---|---|---|---|"
python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, value, base = line.strip().split("|")
    rows.setdefault(name, []).append((float(value), float(base)))
for name, runs in rows.items():
    ratios = sorted(v / b for v, b in runs)
    print(f"| {name} | {statistics.median(v for v, _ in runs):.1f} | "
          f"{statistics.median(b for _, b in runs):.1f} | {ratios[0]:.2f} | "
          f"{statistics.median(ratios):.2f} | {ratios[-1]:.2f} |")
EOF

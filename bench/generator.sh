#!/usr/bin/env bash
# Is the load generator out of the way? `terrace bench` against
# `fio --ioengine=nbd` on the same `nbdkit memory` export: 4 KiB random
# reads at 32 outstanding I/Os, alternating, median of the rounds.
#
#   bench/generator.sh [seconds-per-run] [rounds]
#
# nbdkit memory answers from RAM, so the client side is what is measured.
# Both clients use one connection; the export is prefilled once (by
# `terrace bench --prefill only`) so that reads return written data.
# Prints a markdown table: IO/s of each client per round, the medians and
# their ratio (terrace bench / fio). Binds only a Unix socket.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-5}"
rounds="${2:-3}"
size=1G
work="$(mktemp -d /tmp/terrace-generator.XXXXXX)"
pids=()
cleanup() {
    local status=$?
    set +e
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for tool in fio nbdkit; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
cargo build --release -q -p terrace
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$(pwd)/$target_dir" ;; esac
terrace="$target_dir/release/terrace"

nbdkit --foreground --exit-with-parent --unix "$work/memory.sock" memory size=$size 2>/dev/null &
pids+=($!)
for _ in $(seq 50); do [ -S "$work/memory.sock" ] && break; sleep 0.1; done
uri="nbd+unix:///?socket=$work/memory.sock"
"$terrace" bench --no-progress --prefill only "memory=$uri" >/dev/null 2>&1

terrace_run() {
    "$terrace" --json bench --no-progress --prefill never -p random:100:4K --depths 32 \
        --warmup 1s --duration "${seconds}s" "memory=$uri" 2>/dev/null |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["points"][0]["iops"]))'
}
fio_run() {
    fio --name=generator --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=32 \
        --size=$size --time_based --runtime="$seconds" --ramp_time=1 \
        --output-format=json --output="$work/fio.json" >/dev/null 2>&1
    python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["read"]["iops"]))' "$work/fio.json"
}

terrace_iops=()
fio_iops=()
for round in $(seq "$rounds"); do
    terrace_iops+=("$(terrace_run)")
    fio_iops+=("$(fio_run)")
    echo "round $round: terrace bench ${terrace_iops[-1]} IO/s, fio ${fio_iops[-1]} IO/s" >&2
done
python3 - "${terrace_iops[*]}" "${fio_iops[*]}" <<'PY'
import statistics, sys
ours = [int(x) for x in sys.argv[1].split()]
fio = [int(x) for x in sys.argv[2].split()]
print("| client | IO/s per round | median |")
print("|---|---|---|")
print(f"| terrace bench | {', '.join(f'{x:,}' for x in ours)} | {statistics.median(ours):,.0f} |")
print(f"| fio --ioengine=nbd | {', '.join(f'{x:,}' for x in fio)} | {statistics.median(fio):,.0f} |")
print(f"\nterrace bench / fio: {statistics.median(ours) / statistics.median(fio):.2f}")
PY

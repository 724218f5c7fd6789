# Shared by bench scripts (source it): a scratch folder under /var/tmp, the
# release binary, and one daemon serving on Unix sockets in that folder; the
# daemon is stopped and the folder removed on exit (KEEP=1 keeps the folder).
#
#   bench_daemon NAME    sets work, terrace, ctl (control arguments), nbd
#                        (the NBD socket) and starts the daemon
#   paper_disks DIR KIND sets disks to the white paper's drives as sparse
#                        files in DIR/disks: 8 × 24G HDDs and 3 × 8G journal
#                        SSDs, with drive models if KIND is model (the
#                        SSDs' model spec from SSD_MODEL, default ssd-sata,
#                        e.g. nvme or ssd-sata,write_mbs=1040); with
#                        SSD_DIR set, the SSDs' files go into a new folder
#                        there instead (listed in ssd_dirs, for cleanup)
#   daemon_in BIN DIR    starts BIN's daemon serving on sockets in DIR
#                        (ctl.sock, nbd.sock) and waits until it answers;
#                        sets daemon (its pid)
#   ab_bins              sets BINS, if unset, to this checkout's release
#                        build (built), for scripts that alternate builds
#   paper_pool BIN DIR   a daemon of BIN in DIR with pool wb on the white
#                        paper's modelled drives; sets daemon and ctl (BIN
#                        and its control arguments)
#   ab_work NAME         for scripts that start a daemon per build (with
#                        fio): ab_bins, then sets work (a fresh folder under
#                        BENCH_DIR, default /var/tmp; /dev/shm takes the
#                        disk's noise out of a CPU cost) and
#                        daemon (none yet); on exit the daemon and, if set,
#                        sampler are stopped and the folder removed
#   stop_daemon          stops the daemon in daemon, and forgets it
#   ab_rounds ROUNDS FN [POOL]
#                        ROUNDS times, for every build in BINS in turn: a
#                        fresh POOL BIN $work (default paper_pool), then
#                        FN ROUND BIN, then stop_daemon
#   fio_mbs              MB/s read and written in fio's JSON on stdin
#   fio_side EXPR        prints EXPR over the side of fio's JSON on stdin
#                        that moved data (as s)
#   json EXPR            prints EXPR over the JSON on stdin (as d)
#   restore_mbs SPACE DEPTH SECONDS
#                        64 KiB sequential writes on SPACE of $work's NBD
#                        socket by fio at DEPTH outstanding I/Os (2 s ramp,
#                        then SECONDS); prints MB/s
#
# The binary is built and taken from $CARGO_TARGET_DIR (default target/);
# bench_daemon takes $TERRACE instead where it is set (as the A/B scripts
# take BINS), without building.

bench_cleanup() {
    set +e
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}

ab_work() {
    ab_bins
    command -v fio >/dev/null || { echo "needs fio" >&2; exit 1; }
    work="$(mktemp -d "${BENCH_DIR:-/var/tmp}/terrace-$1.XXXXXX")"
    daemon=
    sampler=
    trap ab_cleanup EXIT
}

ab_cleanup() {
    set +e
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null
    [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
    rm -rf "$work" "${ssd_dirs[@]}"
}

ab_rounds() {
    local rounds="$1" body="$2" pool="${3:-paper_pool}" round bin
    for round in $(seq "$rounds"); do
        for bin in $BINS; do
            rm -rf "${work:?}"/* "${ssd_dirs[@]}"
            ssd_dirs=()
            "$pool" "$bin" "$work"
            "$body" "$round" "$bin"
            stop_daemon
        done
    done
}

stop_daemon() {
    kill "$daemon"
    wait "$daemon" 2>/dev/null || true
    daemon=
}

# fio's JSON report (on stdin, after any lines fio printed before it):
# MB/s read and written by its first job.
fio_mbs() {
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print("%.2f" % ((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6))'
}

# The JSON on stdin as the Python expression $1 over it (`d`) prints it.
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# fio's JSON on stdin (what precedes it skipped): prints the Python
# expression $1 over the job's side that moved data (`s`, its reads, else
# its writes).
fio_side() {
    python3 -c "import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index('{'):])['jobs'][0]
s = j['read'] if j['read']['io_bytes'] else j['write']
print($1)"
}

restore_mbs() {
    fio --name=restore --ioengine=nbd --uri="nbd+unix:///$1?socket=$work/nbd.sock" \
        --rw=write --bs=64k --iodepth="$2" --size=8G --time_based --runtime="$3" \
        --ramp_time=2 --output-format=json 2>/dev/null |
        fio_mbs
}

bench_daemon() {
    work="$(mktemp -d "${BENCH_DIR:-/var/tmp}/terrace-$1.XXXXXX")"
    pids=()
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    if [ -n "${TERRACE:-}" ]; then
        terrace="$TERRACE"
    else
        cargo build --release -q -p terrace
        local target_dir="${CARGO_TARGET_DIR:-target}"
        case "$target_dir" in /*) ;; *) target_dir="$(pwd)/$target_dir" ;; esac
        terrace="$target_dir/release/terrace"
    fi
    ctl=(--control "$work/ctl.sock")
    nbd="$work/nbd.sock"
    daemon_in "$terrace" "$work"
    pids+=("$daemon")
}

daemon_in() {
    local bin="$1" dir="$2"
    "$bin" daemon --state-dir "$dir/state" --control "$dir/ctl.sock" \
        --nbd-socket "$dir/nbd.sock" --no-tcp 2>"$dir/daemon.log" &
    daemon=$!
    for _ in $(seq 100); do "$bin" --control "$dir/ctl.sock" status >/dev/null 2>&1 && break; sleep 0.1; done
}

ab_bins() {
    if [ -z "${BINS:-}" ]; then
        cargo build --release -q -p terrace
        BINS="${CARGO_TARGET_DIR:-target}/release/terrace"
    fi
}

paper_pool() {
    local bin="$1" dir="$2"
    daemon_in "$bin" "$dir"
    ctl=("$bin" --control "$dir/ctl.sock")
    paper_disks "$dir" model
    "${ctl[@]}" pool create wb "${disks[@]}" --slab 256M >/dev/null
}

ssd_dirs=()

paper_disks() {
    local dir="$1" kind="$2" i hdd=",model=hdd-10k,media=hdd" ssd=",model=${SSD_MODEL:-ssd-sata},media=ssd"
    [ "$kind" = model ] || { hdd=; ssd=; }
    disks=()
    mkdir -p "$dir/disks"
    local ssd_dir="$dir/disks"
    if [ -n "${SSD_DIR:-}" ]; then
        ssd_dir="$(mktemp -d "$SSD_DIR/terrace-ssd.XXXXXX")"
        ssd_dirs+=("$ssd_dir")
    fi
    for i in $(seq 0 7); do
        truncate -s 24G "$dir/disks/hdd$i.img"
        disks+=("$dir/disks/hdd$i.img$hdd")
    done
    for i in 0 1 2; do
        truncate -s 8G "$ssd_dir/ssd$i.img"
        disks+=("$ssd_dir/ssd$i.img$ssd,usage=journal")
    done
}

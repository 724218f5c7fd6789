//! Seeded whole-engine simulation: a few hundred runs in the suite,
//! `TERRACE_SIM_SEEDS=N` for more, `TERRACE_SIM_SEED=S` to replay one.

#[test]
fn simulated_runs_keep_every_acknowledged_write() {
    let seeds = terrace_sim::seeds(500);
    let mut failures = Vec::new();
    let mut totals = terrace_sim::Report::default();
    for &seed in &seeds {
        match terrace_sim::run(seed) {
            Ok(report) => {
                totals.crashes += report.crashes;
                totals.cached_runs += report.cached_runs;
                totals.destaged_bytes += report.destaged_bytes;
                totals.losses += report.losses;
                totals.writes += report.writes;
                totals.reads += report.reads;
                totals.repairs += report.repairs;
                totals.moves += report.moves;
                totals.returns += report.returns;
                totals.returns_at_import += report.returns_at_import;
                totals.cleared += report.cleared;
                totals.journals_added += report.journals_added;
                totals.scratch_spaces += report.scratch_spaces;
                totals.thin_runs += report.thin_runs;
                totals.thin_refused += report.thin_refused;
                totals.silent_runs += report.silent_runs;
                totals.beyond_runs += report.beyond_runs;
                totals.silent.add(&report.silent);
            }
            Err(message) => {
                eprintln!("seed {seed} FAILED: {message}\n  replay: TERRACE_SIM_SEED={seed} cargo test -p terrace-sim");
                failures.push(seed);
            }
        }
    }
    eprintln!(
        "{} runs ({} with a write-back log, {} MiB destaged): {} power cuts, {} disks lost ({} taken back live, {} back at an import, {} cleared), {} repairs done ({} moves), journal disks added to {} runs, {} spaces created and deleted beside the clients, {} writes, {} verified reads",
        seeds.len(),
        totals.cached_runs,
        totals.destaged_bytes >> 20,
        totals.crashes,
        totals.losses,
        totals.returns,
        totals.returns_at_import,
        totals.cleared,
        totals.repairs,
        totals.moves,
        totals.journals_added,
        totals.scratch_spaces,
        totals.writes,
        totals.reads
    );
    eprintln!(
        "thin spaces in {} runs: {} writes refused for want of room",
        totals.thin_runs, totals.thin_refused
    );
    let silent = &totals.silent;
    eprintln!(
        "silent faults in {} runs ({} beyond tolerance): {} injected ({} bit flips, {} lost writes, {} misdirected writes, {} unreadable sectors), {} found ({} checksum errors on reads, {} blocks by the scrub, {} unreadable sectors rewritten); beyond tolerance {} reads and {} writes failed",
        totals.silent_runs,
        totals.beyond_runs,
        silent.injected(),
        silent.flips,
        silent.lost_writes,
        silent.misdirected_writes,
        silent.bad_sectors,
        silent.found(),
        silent.checksum_errors,
        silent.scrubbed_blocks,
        silent.bad_sectors_rewritten,
        silent.failed_reads,
        silent.failed_writes
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    if seeds.len() >= 100 {
        assert!(
            totals.crashes > seeds.len() / 4,
            "the suite must actually cut the power"
        );
        assert!(totals.losses > 0, "the suite must actually lose disks");
        assert!(
            totals.thin_runs > 0,
            "the suite must actually run thin spaces"
        );
        assert!(
            totals.repairs > 0,
            "the suite must actually repair lost disks under the clients"
        );
        assert!(
            totals.returns > 0 && totals.returns_at_import > 0,
            "the suite must actually bring vanished disks back"
        );
        assert!(
            totals.cleared > 0,
            "the suite must actually clear failed disks"
        );
        assert!(
            totals.journals_added > 0,
            "the suite must actually add journal disks under the clients"
        );
        assert!(
            totals.silent.injected() > 0 && totals.silent.found() > 0 && totals.beyond_runs > 0,
            "the suite must actually inject silent faults and find them"
        );
        assert!(
            totals.cached_runs > seeds.len() / 4 && totals.destaged_bytes > 0,
            "the suite must actually run write-back logs through destaging"
        );
    }
}

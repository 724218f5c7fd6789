//! Repair through the daemon, with a real client: a disk of a dual-parity
//! space vanishes, the pool's policy starts a repair at once, fio writes
//! and verifies through NBD during the whole repair, the daemon is killed
//! in the middle of it, and after the restart the repair goes on from where
//! it stopped, finishes, and leaves every row consistent and every byte
//! written before and during it readable.

mod common;

use std::time::{Duration, Instant};

use common::{
    command, random_bytes, run_ok, run_with, sha256_file, skip_without, Daemon, GIB, MIB,
};
use serde_json::Value;

fn repair_job(daemon: &Daemon) -> Option<Value> {
    let jobs = daemon.cli_json(&["job", "list"]);
    jobs.as_array()?
        .iter()
        .find(|job| job["kind"] == "repair")
        .cloned()
}

/// fio through NBD on the second half of the space, with verify.
fn fio_verify(daemon: &Daemon, seconds: u64) -> common::Run {
    run_with(
        command("fio")
            .current_dir(daemon.temp())
            .args([
                "--name=during-repair",
                "--ioengine=nbd",
                "--rw=randrw",
                "--bs=16k",
                "--iodepth=8",
                "--offset=64M",
                "--size=64M",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--time_based",
                &format!("--runtime={seconds}"),
            ])
            .arg(format!("--uri={}", daemon.uri("vault"))),
        None,
        Duration::from_secs(seconds + 120),
    )
}

#[test]
fn repair_under_load_survives_sigkill_and_resumes_from_its_watermark() {
    if skip_without("the repair test", &["fio", "nbdcopy"]) {
        return;
    }
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("r", 9, GIB);
    daemon.create_pool("rp", &disks, "8M");
    daemon.create_space(
        "rp",
        "vault",
        &["--layout", "parity", "--redundancy", "2", "--cache", "0"],
        "128M",
    );
    // Known data in the first half.
    let source = daemon.temp().join("known.bin");
    std::fs::write(&source, random_bytes(7, 64 * MIB as usize)).expect("source");
    run_ok(command("nbdcopy").arg(&source).arg(daemon.uri("vault")));
    daemon.cli_json(&[
        "pool",
        "set",
        "rp",
        "--retire-missing",
        "always",
        "--repair-rate",
        "2M",
    ]);

    // A disk the space uses vanishes.
    std::fs::remove_file(&disks[2]).expect("remove a disk file");
    let started = Instant::now();
    let job = loop {
        if let Some(job) = repair_job(&daemon).filter(|job| job["state"] == "running") {
            break job;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no repair started"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let id = job["id"].as_u64().expect("job id");

    // Client writes with verify while the repair runs.
    let answer = fio_verify(&daemon, 4);
    assert!(
        answer.success() && !answer.stderr.contains("verify:"),
        "fio during repair\n{}",
        answer.describe()
    );
    let before = repair_job(&daemon).expect("the repair");
    let done_before = before["bytes_done"].as_u64().unwrap_or(0);
    assert_eq!(before["state"], "running", "{before}");
    assert!(done_before > 0, "no progress before the kill: {before}");

    daemon.kill();
    daemon.restart();
    let after = repair_job(&daemon).expect("the repair after restart");
    assert_eq!(after["id"].as_u64(), Some(id), "{after}");
    assert!(
        after["bytes_done"].as_u64().unwrap_or(0) > 0,
        "the repair started over: before {before}, after {after}"
    );
    daemon.cli_json(&["pool", "set", "rp", "--repair-rate", "0"]);
    let started = Instant::now();
    loop {
        let job = repair_job(&daemon).expect("the repair");
        if job["state"] == "done" {
            break;
        }
        assert!(
            job["state"] == "running",
            "the repair did not finish well: {job}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "repair stuck: {job}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let space = daemon.cli_json(&["space", "show", "vault"]);
    assert_eq!(space["space"]["health"], "healthy", "{space}");
    let check = daemon.cli_json(&["space", "verify", "vault"]);
    assert_eq!(check["mismatched_rows"], 0, "{check}");
    assert_eq!(check["skipped_rows"], 0, "{check}");
    let copy = daemon.temp().join("back.bin");
    run_ok(command("nbdcopy").arg(daemon.uri("vault")).arg(&copy));
    assert_eq!(
        sha256_file(&copy, Some(64 * MIB)),
        sha256_file(&source, None),
        "known data after repair"
    );
    daemon.stop();
}

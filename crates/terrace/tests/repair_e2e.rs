//! Failures and repair end to end, through the daemon, the CLI and NBD:
//!
//! - disks zeroed under a running daemon are found out and failed, every
//!   redundant layout reads back byte-identical, is repaired onto hot
//!   spares or by `disk replace`, verifies clean, and survives one more loss;
//! - beyond tolerance a space is offline, exactly the extents that lost too
//!   much fail to read, every other extent reads right, also after a restart;
//! - fio with verify runs through NBD before, during and after a repair;
//! - SIGKILL mid-repair: the job comes back from its watermark, a paused job
//!   stays paused across another kill, and it finishes with the data intact;
//! - the repair target cannot be released while it is filled, vanishing is
//!   survived by retargeting, a tolerated second failure mid-repair ends
//!   healthy, and no job reports a failure that did not happen;
//! - a disk file moved away and back is taken back by `disk add` while fio
//!   writes: its repair is cancelled and it catches up in place.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{
    assert_reads_back, command, delete_and_wait, disks_of, extent_disks, random_bytes, run, run_ok,
    run_with, skip_without, wait_until, zero_disk, Daemon, MIB,
};
use serde_json::Value;

const DISK_BYTES: u64 = 256 * MIB;
const SLAB: &str = "8M";
const SLAB_BYTES: u64 = 8 * MIB;

fn space_view(daemon: &Daemon, name: &str) -> Value {
    daemon.cli_json(&["space", "show", name])["space"].clone()
}

fn disk_view(daemon: &Daemon, pool: &str, disk: usize) -> Value {
    daemon.pool_status(pool)["disks"][disk].clone()
}

fn jobs(daemon: &Daemon) -> Vec<Value> {
    daemon
        .cli_json(&["job", "list"])
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn job(daemon: &Daemon, id: u64) -> Value {
    jobs(daemon)
        .into_iter()
        .find(|job| job["id"].as_u64() == Some(id))
        .unwrap_or_else(|| panic!("job {id} is not listed: {:?}", jobs(daemon)))
}

/// The one active repair of `disk`, once it has started.
fn repair_of(daemon: &Daemon, disk: usize) -> Value {
    let mut found = None;
    wait_until(daemon, "a repair starting", || {
        found = jobs(daemon).into_iter().find(|job| {
            job["kind"] == "repair"
                && job["description"]
                    .as_str()
                    .is_some_and(|d| d.contains(&format!("disk {disk} ")))
                && job["state"] == "running"
        });
        found.is_none().then(|| format!("{:?}", jobs(daemon)))
    });
    found.expect("a repair")
}

/// Every job the pool remembers ended well: none failed or was cancelled.
#[track_caller]
fn assert_no_failed_jobs(daemon: &Daemon) {
    let listed = jobs(daemon);
    for job in &listed {
        assert!(
            job["state"] == "done",
            "a job did not end well: {job}\nall: {listed:?}"
        );
    }
}

/// Wait until no job runs and the space is healthy again.
fn wait_healthy(daemon: &Daemon, name: &str) {
    wait_until(daemon, "the repair", || {
        let view = space_view(daemon, name);
        let busy = jobs(daemon)
            .iter()
            .any(|job| job["state"] == "running" || job["state"] == "paused");
        (busy || view["health"] != "healthy").then(|| format!("{view} {:?}", jobs(daemon)))
    });
}

/// Every copy equal, every parity consistent, nothing left unchecked, and
/// no disk holding two slots of one extent (one failure would cost two).
#[track_caller]
fn assert_redundant(daemon: &Daemon, name: &str) {
    for (extent, slots) in extent_disks(daemon, name).iter().enumerate() {
        let distinct: BTreeSet<&usize> = slots.iter().collect();
        assert_eq!(
            distinct.len(),
            slots.len(),
            "{name}: extent {extent} has two slots on one disk: {slots:?}"
        );
    }
    let check = daemon.cli_json(&["space", "verify", name]);
    assert_eq!(check["mismatched_rows"], 0, "{name}: {check}");
    assert_eq!(check["skipped_rows"], 0, "{name}: {check}");
    assert!(check["rows"].as_u64().unwrap_or(0) > 0, "{name}: {check}");
}

/// Zero a disk and wait until the pool has failed it for its lost label.
fn zero_and_wait(daemon: &Daemon, pool: &str, files: &[PathBuf], disk: usize) {
    zero_disk(&files[disk]);
    wait_until(daemon, "the zeroed disk failing", || {
        let view = disk_view(daemon, pool, disk);
        let failed =
            view["state"] == "FAILED" && view["reason"].as_str().unwrap_or("").contains("label");
        (!failed).then(|| view.to_string())
    });
}

/// Delete a disk file and wait until the pool calls the disk missing.
fn write_source(daemon: &Daemon, name: &str, seed: u64, length: u64) -> PathBuf {
    let source = daemon.temp().join(format!("{name}.in"));
    std::fs::write(&source, random_bytes(seed, length as usize)).expect("source");
    run_ok(command("nbdcopy").arg(&source).arg(daemon.uri(name)));
    source
}

/// `pool create` with some of the disks as hot spares.
fn create_pool_with_spares(daemon: &Daemon, pool: &str, files: &[PathBuf], spares: usize) {
    daemon.create_pool_with_usage(pool, files, files.len() - spares, "hot-spare", SLAB);
}

fn set_pool(daemon: &Daemon, pool: &str, settings: &[&str]) {
    let mut args = vec!["pool", "set", pool];
    args.extend_from_slice(settings);
    daemon.cli_json(&args);
}

/// How a layout gets its redundancy back after the tolerated losses.
#[derive(Clone, Copy, Debug)]
enum Repair {
    /// Hot spares in the pool and this retire-missing policy.
    HotSpares(&'static str),
    /// `disk replace LOST NEW` for every lost disk.
    Replace,
}

struct Template {
    name: &'static str,
    layout: &'static [&'static str],
    tolerance: usize,
    capacity_disks: usize,
    repair: Repair,
}

const TEMPLATES: [Template; 4] = [
    Template {
        name: "m2",
        layout: &["--layout", "mirror", "--copies", "2", "--columns", "2"],
        tolerance: 1,
        capacity_disks: 4,
        repair: Repair::HotSpares("auto"),
    },
    Template {
        name: "m3",
        layout: &["--layout", "mirror", "--copies", "3", "--columns", "1"],
        tolerance: 2,
        capacity_disks: 3,
        repair: Repair::Replace,
    },
    Template {
        name: "p1",
        layout: &["--layout", "parity", "--redundancy", "1", "--columns", "3"],
        tolerance: 1,
        capacity_disks: 3,
        repair: Repair::Replace,
    },
    Template {
        name: "p2",
        layout: &["--layout", "parity", "--redundancy", "2", "--columns", "4"],
        tolerance: 2,
        capacity_disks: 4,
        repair: Repair::HotSpares("always"),
    },
];

/// The redundancy template for one layout, in its own pool.
fn redundancy_template(daemon: &Daemon, template: &Template, seed: u64) {
    let name = template.name;
    let pool = format!("pool-{name}");
    let spares = match template.repair {
        Repair::HotSpares(_) => template.tolerance,
        Repair::Replace => 0,
    };
    let files = daemon.disk_files(name, template.capacity_disks + spares, DISK_BYTES);
    create_pool_with_spares(daemon, &pool, &files, spares);
    set_pool(daemon, &pool, &["--retire-missing", "never"]);
    let mut layout = template.layout.to_vec();
    layout.extend(["--cache", "0"]);
    daemon.create_space(&pool, name, &layout, "32M");
    let source = write_source(daemon, name, seed, 32 * MIB);

    let lost: Vec<usize> = disks_of(daemon, name)[..template.tolerance].to_vec();
    for &disk in &lost {
        zero_and_wait(daemon, &pool, &files, disk);
    }
    let view = space_view(daemon, name);
    assert_eq!(
        view["health"], "degraded",
        "{name} with its tolerated losses: {view}"
    );
    assert_eq!(view["survives"], 0, "{name}: {view}");
    assert_reads_back(daemon, name, &source, "with the tolerated disks zeroed");

    let mut replacements = Vec::new();
    match template.repair {
        Repair::HotSpares(policy) => set_pool(daemon, &pool, &["--retire-missing", policy]),
        Repair::Replace => {
            for &disk in &lost {
                let new = daemon.disk_files(&format!("{name}-new{disk}"), 1, DISK_BYTES);
                let new_path = new[0].display().to_string();
                let answer =
                    daemon.cli_json(&["disk", "replace", &pool, &disk.to_string(), &new_path]);
                assert_eq!(answer["kind"], "replace", "{answer}");
                replacements.push(new_path);
            }
        }
    }
    wait_healthy(daemon, name);
    assert_no_failed_jobs(daemon);
    assert_redundant(daemon, name);
    let status = daemon.pool_status(&pool);
    for &disk in &lost {
        assert_eq!(
            status["disks"][disk]["slabs_used"], 0,
            "{name}: the lost disk {disk} still holds slabs: {status}"
        );
        if matches!(template.repair, Repair::Replace) {
            assert_eq!(
                status["disks"][disk]["state"], "REMOVED",
                "{name}: the replaced disk {disk}: {status}"
            );
            assert_eq!(
                status["disks"][disk]["reason"], "removed from the pool",
                "{name}: the replaced disk {disk}: {status}"
            );
        }
    }
    if matches!(template.repair, Repair::Replace) {
        // The pool's disk count leaves the released disks out.
        let in_pool = status["disks"]
            .as_array()
            .expect("disks")
            .iter()
            .filter(|disk| disk["state"] != "REMOVED")
            .count();
        assert_eq!(
            in_pool,
            status["disks"].as_array().unwrap().len() - lost.len()
        );
        let list = daemon.cli_json(&["pool", "list"]);
        let summary = list
            .as_array()
            .expect("pools")
            .iter()
            .find(|p| p["name"] == pool.as_str())
            .expect("the pool is listed");
        assert_eq!(summary["disk_count"], in_pool, "{name}: {list}");
    }
    let now_on: BTreeSet<usize> = disks_of(daemon, name).into_iter().collect();
    let expected_new: Vec<usize> = match template.repair {
        Repair::HotSpares(_) => (template.capacity_disks..files.len()).collect(),
        Repair::Replace => status["disks"]
            .as_array()
            .expect("disks")
            .iter()
            .filter(|d| replacements.iter().any(|p| d["device"] == p.as_str()))
            .map(|d| d["index"].as_u64().expect("index") as usize)
            .collect(),
    };
    assert_eq!(expected_new.len(), template.tolerance, "{name}: {status}");
    for disk in &expected_new {
        assert!(
            now_on.contains(disk),
            "{name}: the repair did not use disk {disk}: {now_on:?}"
        );
    }
    assert_reads_back(daemon, name, &source, "after the repair");

    // One more loss, of a disk that took part in the repair.
    set_pool(daemon, &pool, &["--retire-missing", "never"]);
    let next = expected_new[0];
    let next_file = status["disks"][next]["device"]
        .as_str()
        .map(PathBuf::from)
        .expect("device");
    std::fs::remove_file(&next_file).expect("remove a repaired disk");
    wait_until(daemon, "the repaired disk going missing", || {
        let view = disk_view(daemon, &pool, next);
        (view["state"] != "MISSING").then(|| view.to_string())
    });
    // A missing disk (not a failed one): its data may come back.
    let view = space_view(daemon, name);
    assert_eq!(
        view["health"], "incomplete",
        "{name} after one more loss: {view}"
    );
    assert_eq!(
        view["survives"],
        template.tolerance - 1,
        "{name}: {view}\n{}",
        daemon.cli_json(&["space", "show", name])["extent_map"]
    );
    assert_reads_back(daemon, name, &source, "after losing one more disk");
}

#[test]
fn zeroed_disks_are_failed_and_every_layout_reads_back_repairs_and_survives_one_more() {
    if skip_without("the redundancy template", &["nbdcopy"]) {
        return;
    }
    let mut daemon = Daemon::start();
    for (index, template) in TEMPLATES.iter().enumerate() {
        redundancy_template(&daemon, template, 500 + index as u64);
    }
    daemon.stop();
}

/// Pattern byte of extent `extent` of the beyond-tolerance spaces.
fn pattern(extent: usize) -> usize {
    0x21 + extent
}

/// Read every extent with qemu-io, checking its pattern; lost extents must
/// fail, the others must read right. Never wrong data.
fn check_extents(daemon: &Daemon, name: &str, extent_bytes: u64, lost: &[bool], when: &str) {
    for (extent, &is_lost) in lost.iter().enumerate() {
        let answer = run(command("qemu-io")
            .args(["-f", "raw"])
            .arg(daemon.uri(name))
            .arg("-c")
            .arg(format!(
                "read -P {} {} {}",
                pattern(extent),
                extent as u64 * extent_bytes,
                extent_bytes
            )));
        let output = format!("{}{}", answer.stdout, answer.stderr);
        assert!(
            !output.contains("Pattern verification failed"),
            "{name} {when}: extent {extent} returned wrong data\n{}",
            answer.describe()
        );
        let read_ok = answer.success() && !output.contains("failed");
        assert_eq!(
            read_ok,
            !is_lost,
            "{name} {when}: extent {extent} (lost: {is_lost})\n{}",
            answer.describe()
        );
    }
}

/// One beyond-tolerance case: lose one more disk than `tolerance` among
/// those of extent 0, in a space whose extents sit on varying disk sets.
fn beyond_tolerance(
    daemon: &mut Daemon,
    name: &str,
    layout: &[&str],
    disks: usize,
    tolerance: usize,
    extent_bytes: u64,
) {
    let pool = format!("pool-{name}");
    let files = daemon.disk_files(name, disks, DISK_BYTES);
    daemon.create_pool(&pool, &files, SLAB);
    set_pool(daemon, &pool, &["--retire-missing", "never"]);
    let mut args = layout.to_vec();
    args.extend(["--cache", "0"]);
    daemon.create_space(&pool, name, &args, "64M");
    let extents = (64 * MIB / extent_bytes) as usize;
    let mut writes = command("qemu-io");
    writes.args(["-f", "raw"]).arg(daemon.uri(name));
    for extent in 0..extents {
        writes.arg("-c").arg(format!(
            "write -P {} {} {}",
            pattern(extent),
            extent as u64 * extent_bytes,
            extent_bytes
        ));
    }
    run_ok(&mut writes);

    let map = extent_disks(daemon, name);
    assert_eq!(map.len(), extents, "{map:?}");
    let victims: Vec<usize> = map[0][..=tolerance].to_vec();
    let lost: Vec<bool> = map
        .iter()
        .map(|slots| slots.iter().filter(|d| victims.contains(d)).count() > tolerance)
        .collect();
    assert!(
        lost.iter().any(|l| !l),
        "{name}: placement left no extent that survives {victims:?}: {map:?}"
    );
    for &disk in &victims {
        delete_and_wait(daemon, &pool, &files, disk);
    }
    let view = space_view(daemon, name);
    assert_eq!(view["health"], "offline", "{name}: {view}");
    let status = daemon.pool_status(&pool);
    assert_ne!(status["state"], "ONLINE", "{name}: {status}");
    assert!(
        status["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{name}: the pool gives no reason: {status}"
    );
    check_extents(daemon, name, extent_bytes, &lost, "beyond tolerance");

    daemon.stop();
    daemon.restart();
    let view = space_view(daemon, name);
    assert_eq!(view["health"], "offline", "{name} after a restart: {view}");
    check_extents(daemon, name, extent_bytes, &lost, "after a restart");
}

#[test]
fn beyond_tolerance_spaces_go_offline_and_only_lost_extents_fail_to_read() {
    if skip_without("the beyond-tolerance test", &["qemu-io"]) {
        return;
    }
    let mut daemon = Daemon::start();
    // One column of two copies over four disks: extents on varying pairs.
    let mirror = ["--layout", "mirror", "--copies", "2", "--columns", "1"];
    beyond_tolerance(&mut daemon, "m2x", &mirror, 4, 1, SLAB_BYTES);
    // Four columns of dual parity over seven disks: 16 MiB extents.
    let parity = ["--layout", "parity", "--redundancy", "2", "--columns", "4"];
    beyond_tolerance(&mut daemon, "p2x", &parity, 7, 2, 2 * SLAB_BYTES);
    daemon.stop();
}

/// fio writing with verify through NBD on `[32M, 48M)` of `name`, one
/// round: random writes with checksums checked as it goes and at the end.
fn fio_round(daemon: &Daemon, name: &str, round: u64) -> common::Run {
    run_with(
        command("fio")
            .current_dir(daemon.temp())
            .args([
                "--name=repair-load",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bs=16k",
                "--iodepth=8",
                "--offset=32M",
                "--size=16M",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_backlog=64",
                "--verify_fatal=1",
                &format!("--randseed={}", 1000 + round),
            ])
            .arg(format!("--uri={}", daemon.uri(name))),
        None,
        Duration::from_secs(120),
    )
}

#[test]
fn fio_verifies_through_nbd_before_during_and_after_a_repair() {
    if skip_without("the repair-under-load test", &["fio", "nbdcopy"]) {
        return;
    }
    let daemon = Arc::new(Daemon::start());
    let files = daemon.disk_files("load", 5, DISK_BYTES);
    daemon.create_pool("load", &files, SLAB);
    set_pool(
        &daemon,
        "load",
        &["--retire-missing", "always", "--repair-rate", "4M"],
    );
    daemon.create_space(
        "load",
        "busy",
        &[
            "--layout",
            "mirror",
            "--copies",
            "2",
            "--columns",
            "2",
            "--cache",
            "0",
        ],
        "64M",
    );
    let source = write_source(&daemon, "busy", 31, 32 * MIB);

    // fio runs round after round until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (daemon, stop) = (daemon.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = Vec::new();
            for round in 0.. {
                let answer = fio_round(&daemon, "busy", round);
                let failed = !answer.success() || answer.stderr.contains("verify");
                rounds.push((answer, failed));
                if failed || stop.load(Ordering::Acquire) {
                    break;
                }
            }
            rounds
        })
    };
    let victim = disks_of(&daemon, "busy")[0];
    std::fs::remove_file(&files[victim]).expect("remove a disk file");
    let repair = repair_of(&daemon, victim);
    let id = repair["id"].as_u64().expect("job id");
    wait_until(&daemon, "the repair finishing under load", || {
        let job = job(&daemon, id);
        let broken = load.is_finished();
        (job["state"] != "done" && !broken).then(|| job.to_string())
    });
    // The repair is done; one more round runs entirely after it.
    stop.store(true, Ordering::Release);
    let rounds = load.join().expect("the fio thread");
    for (round, (answer, failed)) in rounds.iter().enumerate() {
        assert!(!failed, "fio round {round}\n{}", answer.describe());
    }
    assert!(rounds.len() >= 2, "fio ran {} rounds", rounds.len());
    assert_eq!(job(&daemon, id)["state"], "done");
    assert_no_failed_jobs(&daemon);
    assert_eq!(space_view(&daemon, "busy")["health"], "healthy");
    assert_redundant(&daemon, "busy");
    assert_reads_back(&daemon, "busy", &source, "after a repair under load");
    // The daemon's log tells the story: the disk gone, the repair run.
    wait_until(&daemon, "the log of the repair's end", || {
        let log = daemon.log_text();
        let logged = |words: &[&str]| log.lines().any(|l| words.iter().all(|w| l.contains(w)));
        let told = logged(&[&format!("disk {victim} ("), "ONLINE -> MISSING"])
            && logged(&[&format!("job {id} (re-create"), "running"])
            && logged(&[&format!("job {id} (re-create"), "-> done"]);
        (!told).then(|| log.clone())
    });
    Arc::into_inner(daemon).expect("the only owner").stop();
}

#[test]
fn sigkill_mid_repair_resumes_from_the_watermark_and_a_paused_job_stays_paused() {
    if skip_without("the crash-during-repair test", &["nbdcopy"]) {
        return;
    }
    let mut daemon = Daemon::start();
    let files = daemon.disk_files("crash", 5, DISK_BYTES);
    create_pool_with_spares(&daemon, "crash", &files, 1);
    set_pool(
        &daemon,
        "crash",
        &["--retire-missing", "never", "--repair", "sequential"],
    );
    daemon.create_space(
        "crash",
        "vault",
        &[
            "--layout",
            "parity",
            "--redundancy",
            "1",
            "--columns",
            "3",
            "--cache",
            "0",
        ],
        "64M",
    );
    let source = write_source(&daemon, "vault", 57, 64 * MIB);
    let victim = disks_of(&daemon, "vault")[0];
    delete_and_wait(&daemon, "crash", &files, victim);
    set_pool(
        &daemon,
        "crash",
        &["--retire-missing", "always", "--repair-rate", "4M"],
    );
    let id = repair_of(&daemon, victim)["id"].as_u64().expect("job id");

    // Mid-way: at least one move committed, the job far from done.
    let mut before = Value::Null;
    wait_until(&daemon, "the first move of the repair", || {
        before = job(&daemon, id);
        (before["moves_done"].as_u64().unwrap_or(0) == 0).then(|| before.to_string())
    });
    let percent = before["percent"].as_u64().expect("percent");
    assert!(percent > 0 && percent < 100, "not mid-way: {before}");
    assert_eq!(before["state"], "running", "{before}");
    let view = space_view(&daemon, "vault");
    assert_eq!(view["health"], "repairing", "{view}");
    assert_eq!(view["repair_job"].as_u64(), Some(id), "{view}");
    let moves_done = before["moves_done"].as_u64().expect("moves done");

    daemon.kill();
    daemon.restart();
    let after = job(&daemon, id);
    assert_eq!(
        after["state"], "running",
        "the repair did not come back: {after}"
    );
    assert!(
        after["bytes_done"].as_u64().unwrap_or(0) >= moves_done * SLAB_BYTES,
        "the repair went back before its watermark: before {before}, after {after}"
    );

    // Paused, killed again: still paused, not gone back.
    daemon.cli_json(&["job", "pause", &id.to_string()]);
    daemon.kill();
    daemon.restart();
    let still = job(&daemon, id);
    assert_eq!(still["state"], "paused", "{still}");
    assert!(
        still["bytes_done"].as_u64() >= after["bytes_done"].as_u64(),
        "the paused repair went back: before the pause {after}, after the restart {still}"
    );

    set_pool(&daemon, "crash", &["--repair-rate", "0"]);
    daemon.cli_json(&["job", "resume", &id.to_string()]);
    wait_healthy(&daemon, "vault");
    assert_eq!(job(&daemon, id)["state"], "done");
    assert_no_failed_jobs(&daemon);
    assert_eq!(
        disk_view(&daemon, "crash", victim)["slabs_used"],
        0,
        "the lost disk still holds slabs"
    );
    assert_redundant(&daemon, "vault");
    assert_reads_back(&daemon, "vault", &source, "after a repair across two kills");
    daemon.stop();
}

#[test]
fn the_repair_target_is_kept_while_filled_and_tolerated_failures_mid_repair_end_healthy() {
    if skip_without("the mid-repair failure test", &["nbdcopy"]) {
        return;
    }
    let mut daemon = Daemon::start();
    // Three-way mirror over five capacity disks and one hot spare.
    let files = daemon.disk_files("mid", 6, DISK_BYTES);
    create_pool_with_spares(&daemon, "mid", &files, 1);
    let spare = 5;
    set_pool(
        &daemon,
        "mid",
        &["--retire-missing", "never", "--repair-rate", "2M"],
    );
    daemon.create_space(
        "mid",
        "m",
        &[
            "--layout",
            "mirror",
            "--copies",
            "3",
            "--columns",
            "1",
            "--cache",
            "0",
        ],
        "48M",
    );
    let source = write_source(&daemon, "m", 91, 48 * MIB);
    let used = disks_of(&daemon, "m");
    let first = used[0];
    delete_and_wait(&daemon, "mid", &files, first);
    set_pool(&daemon, "mid", &["--retire-missing", "always"]);
    let id = repair_of(&daemon, first)["id"].as_u64().expect("job id");
    wait_until(&daemon, "the hot spare receiving the repair", || {
        let slabs = disk_view(&daemon, "mid", spare)["slabs_used"].as_u64();
        (slabs == Some(0)).then(|| format!("{slabs:?}"))
    });

    // Releasing the disk the repair is filling is refused, and says why.
    let answer = daemon.cli(&["disk", "remove", "mid", &spare.to_string()]);
    assert!(
        !answer.success() && answer.stderr.contains(&format!("job {id}")),
        "removing the repair target must be refused naming the job\n{}",
        answer.describe()
    );
    assert_eq!(disk_view(&daemon, "mid", spare)["state"], "ONLINE");

    // The target vanishes: the repair moves to free space and goes on.
    delete_and_wait(&daemon, "mid", &files, spare);
    // A second, tolerated, failure in the middle of the repair.
    let second = *used
        .iter()
        .find(|&&d| d != first)
        .expect("a second disk of the space");
    delete_and_wait(&daemon, "mid", &files, second);
    let view = space_view(&daemon, "m");
    assert_ne!(view["health"], "offline", "{view}");
    assert_reads_back(&daemon, "m", &source, "with two disks lost mid-repair");

    set_pool(&daemon, "mid", &["--repair-rate", "0"]);
    wait_healthy(&daemon, "m");
    assert_eq!(job(&daemon, id)["state"], "done");
    assert_no_failed_jobs(&daemon);
    let status = daemon.pool_status("mid");
    for disk in [first, second, spare] {
        assert_eq!(
            status["disks"][disk]["slabs_used"], 0,
            "disk {disk} is gone but holds slabs: {status}"
        );
    }
    let view = space_view(&daemon, "m");
    assert_eq!(view["survives"], 2, "{view}");
    assert_redundant(&daemon, "m");
    assert_reads_back(&daemon, "m", &source, "after both repairs");
    daemon.stop();
}

/// A drive far slower than its peers is flagged SLOW in `pool status`,
/// with its service time; once it is gone it is MISSING, and no longer
/// slow: a disk out of service says why instead.
#[test]
fn a_slow_disk_is_flagged_until_it_leaves_service() {
    if skip_without("the slow-disk test", &["fio"]) {
        return;
    }
    let mut daemon = Daemon::start();
    let mut files = daemon.disk_files("lag", 4, DISK_BYTES);
    // The last disk behaves like a 7,200 rpm drive: milliseconds per
    // random read, where the files answer in microseconds.
    let slow_file = files.pop().expect("four disks");
    let mut args: Vec<String> = ["pool", "create", "lag"].map(String::from).to_vec();
    args.extend(files.iter().map(|file| file.display().to_string()));
    args.push(format!("{},model=hdd-7k", slow_file.display()));
    args.extend(["--slab".into(), SLAB.into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    daemon.cli_json(&args);
    daemon.create_space("lag", "s", &["--layout", "mirror", "--columns", "2"], "32M");
    run_ok(
        command("fio")
            .current_dir(daemon.temp())
            .args([
                "--name=slow-disk",
                "--ioengine=nbd",
                "--rw=randrw",
                "--bs=4k",
                "--iodepth=4",
                "--size=32M",
                "--runtime=2",
                "--time_based",
            ])
            .arg(format!("--uri={}", daemon.uri("s"))),
    );
    let slow = disk_view(&daemon, "lag", 3);
    assert_eq!(slow["slow"], true, "{slow}");
    for disk in 0..3 {
        let view = disk_view(&daemon, "lag", disk);
        assert_eq!(view["slow"], false, "{view}");
    }
    let text = daemon.cli_ok(&["pool", "status", "lag"]).stdout;
    assert!(text.contains("SLOW: "), "{text}");

    std::fs::remove_file(&slow_file).expect("remove the slow disk's file");
    wait_until(&daemon, "the slow disk going missing", || {
        let view = disk_view(&daemon, "lag", 3);
        (view["state"] != "MISSING").then(|| view.to_string())
    });
    let gone = disk_view(&daemon, "lag", 3);
    assert_eq!(gone["slow"], false, "{gone}");
    let text = daemon.cli_ok(&["pool", "status", "lag"]).stdout;
    assert!(!text.contains("SLOW"), "{text}");
    daemon.stop();
}

/// The pool's state line says what it sees: a disk holding no data that
/// goes missing leaves the pool ONLINE but is not hidden behind "all disks
/// online"; a pool imported from too few of its disks is DATA-LOSS and
/// says it is read-only as well.
#[test]
fn the_pool_state_line_names_missing_empty_disks_and_a_read_only_import() {
    let mut daemon = Daemon::start();
    // Five disks: the mirror's two copies and its sums' two leave one empty.
    let files = daemon.disk_files("idle", 5, DISK_BYTES);
    daemon.create_pool("idle", &files, SLAB);
    set_pool(&daemon, "idle", &["--retire-missing", "never"]);
    daemon.create_space("idle", "m", &["--layout", "mirror", "--columns", "1"], "8M");
    let used = disks_of(&daemon, "m");
    let status = daemon.pool_status("idle");
    let empty = (0..files.len())
        .find(|&disk| status["disks"][disk]["slabs_used"] == 0)
        .expect("a disk without slabs");
    std::fs::remove_file(&files[empty]).expect("remove the empty disk's file");
    // A metadata commit writes every disk, and finds this one gone.
    set_pool(&daemon, "idle", &["--repair-rate", "200M"]);
    wait_until(&daemon, "the empty disk going missing", || {
        let view = disk_view(&daemon, "idle", empty);
        (view["state"] != "MISSING").then(|| view.to_string())
    });
    let status = daemon.pool_status("idle");
    assert_eq!(status["state"], "ONLINE", "{status}");
    assert_eq!(
        status["reason"],
        "every disk holding data is online; 1 disk failed or missing, holding none",
        "{status}"
    );

    // Export, and import from one disk that holds none of the space.
    daemon.cli_ok(&["pool", "export", "idle"]);
    let alone = (0..files.len())
        .find(|disk| *disk != empty && !used.contains(disk))
        .expect("a second disk without slabs");
    let path = files[alone].display().to_string();
    let status = daemon.cli_json(&["pool", "import", &path]);
    assert_eq!(status["state"], "DATA-LOSS", "{status}");
    let reason = status["reason"].as_str().expect("reason");
    assert!(reason.contains("; read-only: "), "{status}");
    daemon.stop();
}

/// A disk file moved away goes missing and its repair starts; moved back
/// and given to `disk add`, it is taken back while fio writes: the repair
/// is cancelled, the disk catches up in place on what it missed, and every
/// copy agrees at the end, fio's data and the data from before alike.
#[test]
fn a_missing_disk_given_to_disk_add_is_taken_back_and_catches_up() {
    if skip_without("the disk-comes-back test", &["fio", "nbdcopy"]) {
        return;
    }
    let mut daemon = Daemon::start();
    let files = daemon.disk_files("back", 5, DISK_BYTES);
    daemon.create_pool("back", &files, SLAB);
    set_pool(&daemon, "back", &["--repair-rate", "2M"]);
    daemon.create_space(
        "back",
        "busy",
        &["--layout", "mirror", "--columns", "2", "--cache", "0"],
        "64M",
    );
    let source = write_source(&daemon, "busy", 41, 32 * MIB);
    let victim = disks_of(&daemon, "busy")[0];
    let away = files[victim].with_extension("away");
    std::fs::rename(&files[victim], &away).expect("move a disk file away");
    wait_until(&daemon, "the moved disk going missing", || {
        let view = disk_view(&daemon, "back", victim);
        (view["state"] != "MISSING").then(|| view.to_string())
    });
    let repair = repair_of(&daemon, victim);
    let written = fio_round(&daemon, "busy", 1);
    assert!(written.success(), "{}", written.describe());
    // What it missed shows, and is all it will resync.
    let missed = disk_view(&daemon, "back", victim)["missed_extents"]
        .as_u64()
        .unwrap_or(0);
    assert!(missed > 0, "{}", disk_view(&daemon, "back", victim));
    let status = daemon.cli_ok(&["pool", "status", "back"]).stdout;
    assert!(
        status.contains(&format!("{missed} extent")) && status.contains("written since it left"),
        "{status}"
    );
    std::fs::rename(&away, &files[victim]).expect("move it back");
    let path = files[victim].to_str().expect("path");
    let with_usage = daemon.cli(&["disk", "add", "back", &format!("{path},usage=journal")]);
    assert_eq!(with_usage.code(), Some(2), "{}", with_usage.describe());
    assert!(
        with_usage
            .stderr
            .contains("keeps the media, usage and place"),
        "{}",
        with_usage.describe()
    );
    assert_eq!(disk_view(&daemon, "back", victim)["state"], "MISSING");
    daemon.cli_ok(&["disk", "add", "back", path]);
    assert_eq!(disk_view(&daemon, "back", victim)["state"], "ONLINE");
    let again = fio_round(&daemon, "busy", 2);
    assert!(again.success(), "{}", again.describe());
    wait_healthy(&daemon, "busy");
    assert_eq!(disk_view(&daemon, "back", victim)["missed_extents"], 0);
    let cancelled = job(&daemon, repair["id"].as_u64().expect("job id"));
    assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
    assert!(
        cancelled["reason"]
            .as_str()
            .is_some_and(|r| r.contains("returned and catches up in place")),
        "{cancelled}"
    );
    let resync = jobs(&daemon)
        .into_iter()
        .find(|job| job["kind"] == "resync")
        .expect("a resync");
    assert_eq!(resync["state"], "done", "{resync}");
    assert!(resync["moves_total"].as_u64().unwrap_or(0) > 0, "{resync}");
    assert_eq!(disks_of(&daemon, "busy")[0], victim, "it keeps its slabs");
    assert_redundant(&daemon, "busy");
    assert_reads_back(&daemon, "busy", &source, "after the disk came back");
    daemon.stop();
}

/// Wait until disk `disk` of `pool` is FAILED.
fn wait_failed(daemon: &Daemon, pool: &str, disk: usize) {
    wait_until(daemon, "the failing disk failed", || {
        let view = disk_view(daemon, pool, disk);
        (view["state"] != "FAILED").then(|| view.to_string())
    });
}

/// Overwrite `length` bytes at `offset` of space `name` with `byte`
/// through NBD, and of `source` too.
fn write_pattern(daemon: &Daemon, name: &str, source: &Path, byte: u8, offset: u64, length: u64) {
    run_ok(
        command("qemu-io")
            .args(["-f", "raw"])
            .arg(daemon.uri(name))
            .arg("-c")
            .arg(format!("write -P {byte} {offset} {length}")),
    );
    let mut data = std::fs::read(source).expect("source");
    data[offset as usize..(offset + length) as usize].fill(byte);
    std::fs::write(source, data).expect("source");
}

/// Two of the three disks of a single-parity space fail, I/O errors
/// injected below their files: the first under writes (they complete
/// degraded), the second under a read, and the space is offline. A clear while the
/// faults last changes nothing and exits 1. The faults pass; after a
/// restart the disks are failed but present and the pool points to `pool
/// clear`, which takes both back and says what each missed; the space is
/// healthy again and every byte read through NBD is what was written.
#[test]
fn a_double_failure_that_passes_is_cleared_and_every_byte_verifies() {
    if skip_without(
        "the pool clear test",
        &["nbdkit", "nbdfuse", "nbdcopy", "qemu-io"],
    ) {
        return;
    }
    let folder = tempfile::tempdir().expect("a folder for the disks");
    let disks: Vec<common::FaultyDisk> = (0..3)
        .map(|i| common::FaultyDisk::new(folder.path(), &format!("d{i}"), DISK_BYTES))
        .collect();
    let mut daemon = Daemon::start();
    let files: Vec<PathBuf> = disks.iter().map(|disk| disk.file.clone()).collect();
    daemon.create_pool("tank", &files, SLAB);
    let parity = ["--layout", "parity", "--redundancy", "1"];
    daemon.create_space("tank", "p", &parity, "64M");
    let source = daemon.temp().join("p.src");
    std::fs::write(&source, random_bytes(41, 64 * MIB as usize)).expect("source");
    run_ok(command("nbdcopy").arg(&source).arg(daemon.uri("p")));

    disks[1].fail();
    write_pattern(&daemon, "p", &source, 0x5a, 0, 16 * MIB);
    write_pattern(&daemon, "p", &source, 0x6b, 40 * MIB, MIB);
    wait_failed(&daemon, "tank", 1);
    assert_eq!(space_view(&daemon, "p")["health"], "degraded");
    disks[2].fail();
    let read = run(command("nbdcopy").arg(daemon.uri("p")).arg("null:"));
    assert!(!read.success(), "{}", read.describe());
    wait_failed(&daemon, "tank", 2);
    assert_eq!(space_view(&daemon, "p")["health"], "offline");
    let refused = daemon.cli(&["pool", "clear", "tank"]);
    assert_eq!(refused.code(), Some(1), "{}", refused.describe());
    assert!(
        refused.stdout.contains("still fails"),
        "{}",
        refused.describe()
    );
    for disk in [1, 2] {
        assert_eq!(disk_view(&daemon, "tank", disk)["state"], "FAILED");
    }

    // The faults pass; a restart imports the pool with both disks failed
    // but present, and says how to take them back.
    disks[1].heal();
    disks[2].heal();
    daemon.stop();
    daemon.restart();
    for disk in [1, 2] {
        let view = disk_view(&daemon, "tank", disk);
        assert_eq!(view["state"], "FAILED", "{view}");
        let reason = view["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("terrace pool clear tank"), "{view}");
    }
    let cleared = daemon.cli_ok(&["pool", "clear", "tank"]).stdout;
    assert!(
        cleared.contains("disk 1 ") && cleared.contains("taken back"),
        "{cleared}"
    );
    assert!(
        cleared.contains("nothing was written since disk 2 failed"),
        "{cleared}"
    );
    assert!(
        cleared.contains("written since disk 1 failed: resynchronised"),
        "{cleared}"
    );
    // Disk 2's reads failed while the space had no redundancy left: it
    // stayed in service (failing it would have cost data) until a write
    // failed on it (the idle probe's rewrite of its label, unless a write
    // of the pool's came first); every byte still verifies below.
    wait_until(&daemon, "the resyncs ending", || {
        let running: Vec<Value> = jobs(&daemon)
            .into_iter()
            .filter(|job| job["state"] == "running")
            .collect();
        (!running.is_empty()).then(|| format!("{running:?}"))
    });
    // The repair that found no room while both disks were out stays in
    // the history as failed; every job since is done.
    for job in jobs(&daemon) {
        let no_room = job["kind"] == "repair"
            && job["reason"]
                .as_str()
                .is_some_and(|reason| reason.starts_with("no repair started"));
        assert!(job["state"] == "done" || no_room, "{job}");
    }
    assert_eq!(space_view(&daemon, "p")["health"], "healthy");
    assert_eq!(daemon.pool_status("tank")["state"], "ONLINE");
    assert_reads_back(&daemon, "p", &source, "after pool clear");
    daemon.stop();
}

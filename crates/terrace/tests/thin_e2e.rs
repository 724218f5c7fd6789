//! A thin space through real NBD clients: larger than its pool, it takes
//! room as it is written (fio with verify), says how much (`space list`),
//! shows its holes (`qemu-img map`), refuses writes that need room once the
//! pool is full with ENOSPC while every acknowledged block still verifies,
//! and keeps it all across a restart.

mod common;

use common::{command, run, run_ok, skip_without, Daemon, MIB};
use serde_json::Value;

/// The one space of `space list --json` named `name`.
fn listed(daemon: &Daemon, name: &str) -> Value {
    let list = daemon.cli_json(&["space", "list"]);
    list.as_array()
        .and_then(|spaces| spaces.iter().find(|space| space["name"] == name))
        .unwrap_or_else(|| panic!("no space {name} in {list}"))
        .clone()
}

fn qemu_io(daemon: &Daemon, space: &str, commands: &[String]) -> common::Run {
    let mut qemu = command("qemu-io");
    qemu.args(["-f", "raw"]).arg(daemon.uri(space));
    for each in commands {
        qemu.args(["-c", each]);
    }
    run(&mut qemu)
}

#[test]
fn a_thin_space_larger_than_its_pool_serves_until_full_then_refuses_new_room() {
    if skip_without("thin", &["qemu-io", "qemu-img", "fio"]) {
        return;
    }
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("tank", 4, 256 * MIB);
    daemon.create_pool("tank", &disks, "16M");
    let view = daemon.cli_json(&[
        "space",
        "create",
        "tank",
        "thin",
        "--layout",
        "mirror",
        "--size",
        "4G",
        "--provisioning",
        "thin",
        "--cache",
        "0",
    ]);
    assert_eq!(view["provisioning"], "thin", "{view}");
    assert_eq!(view["allocated_bytes"], 0, "{view}");
    let size = view["size_bytes"].as_u64().expect("size");
    let capacity = daemon.pool_status("tank")["capacity_bytes"]
        .as_u64()
        .expect("capacity");
    assert!(
        size > 4 * capacity,
        "a 4G space on {capacity} bytes of disks"
    );
    let extent = 16 * MIB * view["data_columns"].as_u64().expect("data columns");

    // fio writes and verifies 64 MiB at 1 GiB: those extents only are taken.
    let fio = run(command("fio")
        .args([
            "--name=thin",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=64k",
        ])
        .args(["--offset=1G", "--size=64M", "--iodepth=8"])
        .args(["--verify=crc32c", "--do_verify=1", "--verify_fatal=1"])
        .args(["--randrepeat=0", "--verify_state_save=0"])
        .arg(format!("--uri={}", daemon.uri("thin")))
        .current_dir(daemon.temp()));
    assert!(fio.success(), "fio\n{}", fio.describe());
    let allocated = listed(&daemon, "thin")["allocated_bytes"]
        .as_u64()
        .expect("allocated");
    assert_eq!(allocated, (64 * MIB).div_ceil(extent) * extent);
    let map = run_ok(
        command("qemu-img")
            .args(["map", "--output=json", "-f", "raw"])
            .arg(daemon.uri("thin")),
    )
    .json();
    let data: Vec<(u64, u64)> = map
        .as_array()
        .expect("qemu-img map")
        .iter()
        .filter(|range| range["data"] == true)
        .map(|range| {
            let start = range["start"].as_u64().unwrap();
            (start, start + range["length"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(data, vec![(1 << 30, (1 << 30) + 64 * MIB)], "{map}");

    // Fill from the start, one extent a write, until the pool refuses.
    let mut written = Vec::new();
    let refused = loop {
        let at = written.len() as u64 * extent;
        assert!(at < 1 << 30, "4 × 256 MiB of disks took a GiB of mirror");
        let pattern = 1 + written.len() % 250;
        let answer = qemu_io(&daemon, "thin", &[format!("write -P {pattern} {at} 1M")]);
        let out = format!("{}{}", answer.stdout, answer.stderr);
        if out.contains("failed") {
            break out;
        }
        assert!(answer.success(), "{}", answer.describe());
        written.push((at, pattern));
    };
    assert!(refused.contains("No space left on device"), "{refused}");
    let log = daemon.log_text();
    assert!(
        log.contains("past the 70% alert"),
        "no allocation alert logged:\n{log}"
    );
    assert!(written.len() > 4, "only {} extents fit", written.len());
    // Writes to extents that have room go on; everything acknowledged verifies.
    let answer = qemu_io(&daemon, "thin", &[format!("write -P 7 {} 4k", MIB)]);
    assert!(!answer.stdout.contains("failed"), "{}", answer.describe());
    let check = |daemon: &Daemon, written: &[(u64, usize)]| {
        let mut reads: Vec<String> = written
            .iter()
            .map(|(at, pattern)| format!("read -P {pattern} {at} 1M"))
            .collect();
        reads.push(format!("read -P 7 {} 4k", MIB));
        reads.push(format!("read -P 0 {} 1M", written.len() as u64 * extent));
        let answer = qemu_io(daemon, "thin", &reads);
        assert!(
            answer.success()
                && !answer.stdout.contains("fail")
                && !answer.stdout.contains("Pattern verification"),
            "{}",
            answer.describe()
        );
    };
    check(&daemon, &written);
    // A discard of whole extents gives them back: the refused write then
    // finds room, with no restart.
    let pool_full = daemon.pool_status("tank")["allocated_bytes"].as_u64();
    let (last, _) = written.pop().expect("extents written");
    let answer = qemu_io(&daemon, "thin", &[format!("discard {last} {extent}")]);
    assert!(
        answer.success() && !answer.stdout.contains("failed"),
        "{}",
        answer.describe()
    );
    assert!(daemon.pool_status("tank")["allocated_bytes"].as_u64() < pool_full);
    let answer = qemu_io(&daemon, "thin", &[format!("read -P 0 {last} {extent}")]);
    assert!(
        answer.success() && !answer.stdout.contains("fail"),
        "{}",
        answer.describe()
    );
    let at = last + extent;
    let answer = qemu_io(&daemon, "thin", &[format!("write -P 9 {at} 1M")]);
    assert!(
        answer.success() && !answer.stdout.contains("failed"),
        "{}",
        answer.describe()
    );
    written.push((last, 0));
    written.push((at, 9));
    check(&daemon, &written);
    let text = daemon.cli_ok(&["space", "list"]).stdout;
    assert!(text.contains("(thin)"), "{text}");
    daemon.stop();
    daemon.restart();
    check(&daemon, &written);
    assert_eq!(
        listed(&daemon, "thin")["allocated_bytes"].as_u64(),
        Some((written.len() as u64 - 1) * extent + allocated),
        "the extents written but the one discarded, after a restart"
    );
    // The pool's default: spaces created without saying are thin.
    daemon.cli_ok(&["pool", "set", "tank", "--provisioning", "thin"]);
    let status = daemon.pool_status("tank");
    assert_eq!(status["settings"]["provisioning"], "thin", "{status}");
    let view = daemon.create_space("tank", "more", &["--layout", "mirror"], "8G");
    assert_eq!(view["provisioning"], "thin", "{view}");
    assert_eq!(view["allocated_bytes"], 0, "{view}");
}

//! What the daemon remembers across stops: pools come back from the state
//! folder, data acknowledged before a flush survives SIGKILL, and SIGTERM
//! flushes whatever was acknowledged, even with a client still connected.

mod common;

use common::nbd::{Connection, Outcome, CMD_FLAG_FUA, CMD_FLUSH, CMD_WRITE};
use common::{command, random_bytes, run, run_ok, skip_without, Daemon, GIB, MIB};

/// Run qemu-io commands on `uri`; fail on any failed command or pattern.
#[track_caller]
fn qemu_io(uri: &str, commands: &[String], when: &str) {
    let mut qemu = command("qemu-io");
    qemu.args(["-f", "raw"]).arg(uri);
    for c in commands {
        qemu.arg("-c").arg(c);
    }
    let answer = run(&mut qemu);
    let output = format!("{}{}", answer.stdout, answer.stderr);
    assert!(
        answer.success() && !output.contains("failed") && !output.contains("Pattern verification"),
        "qemu-io {when}\n{}",
        answer.describe()
    );
}

fn commands(list: &[&str]) -> Vec<String> {
    list.iter().map(|c| c.to_string()).collect()
}

#[track_caller]
fn assert_online(daemon: &Daemon, when: &str) {
    let pool = daemon.pool_status("keep");
    assert_eq!(pool["state"], "ONLINE", "pool state {when}: {pool}");
    let spaces = pool["spaces"].as_array().expect("spaces");
    assert_eq!(spaces.len(), 2, "spaces {when}: {pool}");
    for space in spaces {
        assert_eq!(space["health"], "healthy", "space health {when}: {space}");
    }
    let status = daemon.cli_json(&["status"]);
    assert_eq!(
        status["pools"],
        serde_json::json!(["keep"]),
        "daemon status {when}: {status}"
    );
}

/// The extents `space show` marks named in the write intent, and its
/// write-intent line (empty without one).
fn named_extents(daemon: &Daemon, space: &str) -> (Vec<u64>, String) {
    let detail = daemon.cli_json(&["space", "show", space]);
    let named = detail["extent_map"]
        .as_array()
        .expect("extent map")
        .iter()
        .filter(|extent| extent["write_intent"] == true)
        .map(|extent| extent["index"].as_u64().expect("index"))
        .collect();
    let text = daemon.cli_ok(&["space", "show", space]).stdout;
    let line = text
        .lines()
        .find(|line| line.contains("write intent"))
        .unwrap_or_default()
        .trim()
        .to_string();
    (named, line)
}

#[test]
fn data_survives_sigkill_after_flush_and_sigterm_without_one() {
    if skip_without("the persistence test", &["qemu-io"]) {
        return;
    }
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("keep", 5, GIB);
    daemon.create_pool("keep", &disks, "16M");
    daemon.create_space(
        "keep",
        "mirror",
        &["--layout", "mirror", "--copies", "2"],
        "64M",
    );
    daemon.create_space(
        "keep",
        "parity",
        &["--layout", "parity", "--redundancy", "2"],
        "64M",
    );

    // Patterns written and flushed, then SIGKILL.
    let first = [
        "write -P 0x5a 0 4M",
        "write -P 0x5b 4M 4k",        // a partial parity row: read-modify-write
        "write -P 0x5c 9437696 1000", // unaligned, mid-space
        "flush",
    ];
    let first_check = [
        "read -P 0x5a 0 4M",
        "read -P 0x5b 4M 4k",
        "read -P 0x5c 9437696 1000",
    ];
    for space in ["mirror", "parity"] {
        qemu_io(
            &daemon.uri(space),
            &commands(&first),
            &format!("writing {space}"),
        );
        if space == "mirror" {
            // Written within the last 5 s: its extent is named, and a
            // crash would resynchronise it alone.
            let (named, line) = named_extents(&daemon, space);
            assert_eq!(named, vec![0], "{line}");
            assert!(line.contains("1 extent of 2 named (0)"), "{line}");
        }
    }
    // The parity space has a log, whose records say what to replay.
    assert_eq!(named_extents(&daemon, "parity"), (vec![], String::new()));
    daemon.kill();
    daemon.restart();
    assert_online(&daemon, "after SIGKILL and restart");
    for space in ["mirror", "parity"] {
        qemu_io(
            &daemon.uri(space),
            &commands(&first_check),
            &format!("reading {space} after SIGKILL"),
        );
    }
    // Import read the intent and serves at once; extent 0 is resynchronised
    // in the background (or by the reads above, row by row), and dropped
    // from the intent once done.
    let log = daemon.log_text();
    assert!(
        log.contains("left by an unclean shutdown")
            && log.contains(": importing (")
            && log.contains(": imported in "),
        "{}",
        daemon.log_tail()
    );
    let mut waited = 0;
    let line = loop {
        let (named, line) = named_extents(&daemon, "mirror");
        let left = daemon.cli_json(&["space", "show", "mirror"])["space"]["resync_extents_left"]
            .as_u64()
            .expect("resync_extents_left");
        let logged = daemon
            .log_text()
            .contains("resync after the unclean shutdown done");
        if named.is_empty() && left == 0 && logged {
            break line;
        }
        assert!(waited < 300, "still named {named:?}, {left} left: {line}");
        std::thread::sleep(std::time::Duration::from_millis(100));
        waited += 1;
    };
    assert!(line.contains("no extent named"), "{line}");
    let check = daemon.cli_json(&["space", "verify", "mirror"]);
    assert_eq!(check["mismatched_rows"], 0, "{check}");
    assert_eq!(check["unsynced_rows"], 0, "{check}");
    assert!(check["rows"].as_u64().unwrap_or(0) > 0, "{check}");

    // More patterns, no explicit flush, then a clean stop.
    let second = ["write -P 0x6d 1M 2M", "write -P 0x6e 60M 4M"];
    let second_check = [
        "read -P 0x5a 0 1M",
        "read -P 0x6d 1M 2M",
        "read -P 0x5a 3M 1M",
        "read -P 0x5b 4M 4k",
        "read -P 0x6e 60M 4M",
    ];
    for space in ["mirror", "parity"] {
        qemu_io(
            &daemon.uri(space),
            &commands(&second),
            &format!("writing {space} again"),
        );
    }
    daemon.stop();
    daemon.restart();
    assert_online(&daemon, "after SIGTERM and restart");
    for space in ["mirror", "parity"] {
        qemu_io(
            &daemon.uri(space),
            &commands(&second_check),
            &format!("reading {space} after SIGTERM"),
        );
    }
    // A clean stop marks the pool clean: nothing to resynchronise, and the
    // log says the pool closed cleanly.
    daemon.stop();
    assert!(
        daemon.log_text().contains("closed cleanly"),
        "{}",
        daemon.log_tail()
    );
}

#[test]
fn sigterm_with_a_client_connected_keeps_acknowledged_writes() {
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("keep", 4, GIB);
    daemon.create_pool("keep", &disks, "16M");
    daemon.create_space(
        "keep",
        "mirror",
        &["--layout", "mirror", "--copies", "2"],
        "64M",
    );
    daemon.create_space(
        "keep",
        "parity",
        &["--layout", "parity", "--redundancy", "1"],
        "64M",
    );

    // Writes acknowledged (one with FUA, the others without), no flush, and
    // the connections stay open while the daemon is told to stop.
    let mut connections = Vec::new();
    for (seed, space) in [(1u64, "mirror"), (2, "parity")] {
        let mut connection = Connection::open(&daemon.nbd_socket, space);
        for block in 0..8u64 {
            let data = random_bytes(seed * 100 + block, MIB as usize);
            let flags = if block == 3 { CMD_FLAG_FUA } else { 0 };
            connection
                .write(block * 3 * MIB + 512, &data, flags)
                .unwrap_or_else(|e| panic!("write to {space} failed with error {e}"));
        }
        connections.push(connection);
    }
    daemon.stop();
    drop(connections);

    daemon.restart();
    assert_online(&daemon, "after SIGTERM with clients connected");
    for (seed, space) in [(1u64, "mirror"), (2, "parity")] {
        let mut connection = Connection::open(&daemon.nbd_socket, space);
        for block in 0..8u64 {
            let expected = random_bytes(seed * 100 + block, MIB as usize);
            let data = connection
                .read(block * 3 * MIB + 512, MIB as u32)
                .unwrap_or_else(|e| panic!("read from {space} failed with error {e}"));
            assert!(
                data == expected,
                "{space}: block {block} differs after SIGTERM and restart"
            );
        }
        connection.disconnect();
    }
    daemon.stop();
}

#[test]
fn exported_pools_stay_out_until_imported() {
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("keep", 3, GIB);
    daemon.create_pool("keep", &disks, "16M");
    daemon.create_space("keep", "data", &["--layout", "mirror"], "32M");
    let mut connection = Connection::open(&daemon.nbd_socket, "data");
    let pattern = random_bytes(7, 64 * 1024);
    connection.write(0, &pattern, 0).expect("write");
    connection.flush().expect("flush");
    connection.disconnect();

    daemon.cli_ok(&["pool", "export", "keep"]);
    daemon.stop();
    daemon.restart();
    let pools = daemon.cli_json(&["pool", "list"]);
    assert_eq!(
        pools,
        serde_json::json!([]),
        "an exported pool came back at start: {pools}"
    );

    let folder = daemon.root.join("disks").display().to_string();
    let pool = daemon.cli_json(&["pool", "import", "--name", "keep", &folder]);
    assert_eq!(pool["state"], "ONLINE", "{pool}");
    daemon.stop();
    daemon.restart();
    // Imported again, so remembered again.
    assert_eq!(daemon.pool_status("keep")["state"], "ONLINE");
    let mut connection = Connection::open(&daemon.nbd_socket, "data");
    assert!(
        connection.read(0, 64 * 1024).expect("read") == pattern,
        "data changed across export and import"
    );
    connection.disconnect();
    daemon.stop();
}

/// A pool's disks are held by the daemon that has the pool open: another
/// daemon can neither import the pool (named or not), nor start with it,
/// nor make a new pool of one of its disks, and the holder goes on
/// serving. Once exported, the pool imports elsewhere.
#[test]
fn a_second_daemon_cannot_take_a_pool_another_holds() {
    let mut first = Daemon::start();
    let disks = first.disk_files("held", 3, GIB);
    first.create_pool("held", &disks, "16M");
    first.create_space("held", "data", &["--layout", "mirror"], "32M");
    let folder = first.root.join("disks").display().to_string();

    let mut second = Daemon::start();
    let disk = disks[0].display().to_string();
    for args in [
        vec!["pool", "import", "--name", "held", folder.as_str()],
        vec!["pool", "import", folder.as_str()],
        vec!["pool", "create", "other", disk.as_str()],
        // Forced too: a held disk is never probed, let alone wiped.
        vec!["pool", "create", "other", disk.as_str(), "--force"],
    ] {
        let refused = second.cli(&args);
        assert!(
            !refused.success() && refused.stderr.contains("in use"),
            "{args:?} was not refused as in use\n{}",
            refused.describe()
        );
    }
    assert_eq!(second.cli_json(&["pool", "list"]), serde_json::json!([]));
    assert_eq!(first.pool_status("held")["state"], "ONLINE");

    // Saved by the first, taken by the second while the first is down:
    // the first, started again, finds it held and leaves it alone, and
    // imports it at the next start once the second has let go.
    first.stop();
    let pool = second.cli_json(&["pool", "import", "--name", "held", &folder]);
    assert_eq!(pool["state"], "ONLINE", "{pool}");
    first.restart();
    assert_eq!(first.cli_json(&["pool", "list"]), serde_json::json!([]));
    assert!(
        first.log_text().contains("not imported: pool held") && first.log_text().contains("in use"),
        "{}",
        first.log_tail()
    );
    assert_eq!(second.pool_status("held")["state"], "ONLINE");
    second.cli_ok(&["pool", "export", "held"]);
    first.stop();
    first.restart();
    assert_eq!(first.pool_status("held")["state"], "ONLINE");
    second.stop();
    first.stop();
}

#[test]
fn a_grown_space_keeps_its_data_and_serves_the_new_size() {
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("keep", 4, GIB);
    daemon.create_pool("keep", &disks, "16M");
    daemon.create_space(
        "keep",
        "grow",
        &["--layout", "parity", "--redundancy", "1"],
        "40M",
    );
    let mut connection = Connection::open(&daemon.nbd_socket, "grow");
    assert_eq!(connection.info.size, 40 * MIB);
    let head = random_bytes(11, MIB as usize);
    let tail = random_bytes(12, MIB as usize);
    connection.write(0, &head, 0).expect("write head");
    connection.write(39 * MIB, &tail, 0).expect("write tail");
    connection.flush().expect("flush");
    connection.disconnect();

    let view = daemon.cli_json(&["space", "resize", "grow", "--size", "200M"]);
    assert_eq!(view["size_bytes"].as_u64(), Some(200 * MIB), "{view}");
    // Shrinking is refused and changes nothing.
    let answer = daemon.cli(&["space", "resize", "grow", "--size", "100M"]);
    assert_eq!(
        answer.code(),
        Some(1),
        "shrinking a space\n{}",
        answer.describe()
    );
    assert!(
        answer
            .stderr
            .contains("space grow is 200M; shrinking to 100M would destroy"),
        "the refusal names both sizes as people write them\n{}",
        answer.describe()
    );

    let mut connection = Connection::open(&daemon.nbd_socket, "grow");
    assert_eq!(connection.info.size, 200 * MIB, "export size after resize");
    let end = random_bytes(13, MIB as usize);
    connection
        .write(199 * MIB, &end, 0)
        .expect("write the new end");
    // The grown part reads as zeroes.
    let zeroes = connection
        .read(100 * MIB, 64 * 1024)
        .expect("read the grown part");
    assert!(
        zeroes.iter().all(|&b| b == 0),
        "the grown part of the space is not zeroed"
    );
    connection.disconnect();

    daemon.stop();
    daemon.restart();
    let mut connection = Connection::open(&daemon.nbd_socket, "grow");
    assert_eq!(connection.info.size, 200 * MIB, "export size after restart");
    for (offset, expected) in [(0, &head), (39 * MIB, &tail), (199 * MIB, &end)] {
        let data = connection.read(offset, MIB as u32).expect("read back");
        assert!(
            data == *expected,
            "data at {offset} changed across resize and restart"
        );
    }
    connection.disconnect();
    daemon.stop();
}

/// A writer that flushes after every batch of writes; the daemon is killed
/// while it writes. Every batch whose flush was acknowledged reads back.
#[test]
fn sigkill_during_writes_keeps_every_flushed_batch() {
    const BLOCK: usize = 192 * 1024; // not a multiple of any row: partial-row writes
    const BLOCKS_PER_BATCH: u64 = 8;
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("keep", 6, GIB);
    daemon.create_pool("keep", &disks, "16M");
    daemon.create_space(
        "keep",
        "mirror",
        &["--layout", "mirror", "--copies", "2"],
        "96M",
    );
    daemon.create_space(
        "keep",
        "parity",
        &["--layout", "parity", "--redundancy", "2"],
        "96M",
    );
    let spaces = ["mirror", "parity"];
    let block_data = |space: usize, batch: u64, block: u64| {
        random_bytes(((space as u64) << 40) | (batch << 20) | block, BLOCK)
    };
    let offset = |batch: u64, block: u64| (batch * BLOCKS_PER_BATCH + block) * BLOCK as u64 + 4096;
    let batches_in_space = 96 * MIB / (BLOCKS_PER_BATCH * BLOCK as u64) - 1;

    let (sender, receiver) = std::sync::mpsc::channel::<(usize, u64)>();
    let writers: Vec<_> = spaces
        .iter()
        .enumerate()
        .map(|(index, space)| {
            let mut connection = Connection::open(&daemon.nbd_socket, space);
            let sender = sender.clone();
            std::thread::spawn(move || {
                // Keep writing until the connection dies.
                for batch in 0.. {
                    let batch = batch % batches_in_space;
                    for block in 0..BLOCKS_PER_BATCH {
                        let data = block_data(index, batch, block);
                        if connection
                            .try_send(CMD_WRITE, 0, offset(batch, block), BLOCK as u32, &data)
                            .is_err()
                        {
                            return;
                        }
                    }
                    for _ in 0..BLOCKS_PER_BATCH {
                        if !matches!(connection.outcome(), Outcome::Reply { error: 0, .. }) {
                            return;
                        }
                    }
                    if connection.try_send(CMD_FLUSH, 0, 0, 0, &[]).is_err()
                        || !matches!(connection.outcome(), Outcome::Reply { error: 0, .. })
                    {
                        return;
                    }
                    if sender.send((index, batch)).is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    drop(sender);

    // Kill once both writers have flushed a few batches (and are writing more).
    let mut flushed: Vec<Vec<u64>> = vec![Vec::new(); spaces.len()];
    while flushed.iter().any(|batches| batches.len() < 6) {
        let (index, batch) = receiver
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("writers flushed nothing within 60s");
        flushed[index].push(batch);
    }
    daemon.kill();
    // Flushes acknowledged before the kill, whose messages were still queued.
    for (index, batch) in receiver.try_iter() {
        flushed[index].push(batch);
    }
    for writer in writers {
        writer.join().expect("writer thread");
    }

    daemon.restart();
    assert_eq!(
        daemon.pool_status("keep")["state"],
        "ONLINE",
        "after SIGKILL during writes"
    );
    for (index, space) in spaces.iter().enumerate() {
        let mut connection = Connection::open(&daemon.nbd_socket, space);
        let mut batches = flushed[index].clone();
        batches.sort_unstable();
        batches.dedup();
        for batch in batches {
            for block in 0..BLOCKS_PER_BATCH {
                let data = connection
                    .read(offset(batch, block), BLOCK as u32)
                    .unwrap_or_else(|e| {
                        panic!("{space}: reading block {block} of batch {batch} after SIGKILL failed with error {e}")
                    });
                assert!(
                    data == block_data(index, batch, block),
                    "{space}: block {block} of batch {batch} was flushed before SIGKILL but reads back different"
                );
            }
        }
        connection.disconnect();
    }
    daemon.stop();
}

/// A tmpfs of a few MiB mounted in the test's folder, whose files can be
/// made to refuse every write as a full filesystem does (ENOSPC), reading
/// back zeroes. Unmounted (lazily: a daemon may still hold its files) on
/// drop.
struct FullingFolder {
    dir: std::path::PathBuf,
}

impl FullingFolder {
    /// None (after saying why) where tmpfs cannot be mounted (not root).
    fn mount(daemon: &Daemon, test: &str) -> Option<FullingFolder> {
        let dir = daemon.temp().join("full");
        std::fs::create_dir_all(&dir).expect("mount point");
        let answer = run(command("mount")
            .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
            .arg(&dir));
        if !answer.success() {
            common::note(format!("SKIPPED: {test} needs to mount a tmpfs (root)"));
            return None;
        }
        Some(FullingFolder { dir })
    }

    /// `count` sparse 1 GiB disk files in the folder.
    fn disk_files(&self, prefix: &str, count: usize) -> Vec<std::path::PathBuf> {
        (0..count)
            .map(|i| {
                let path = self.dir.join(format!("{prefix}-{i}.img"));
                common::sparse_file(&path, GIB);
                path
            })
            .collect()
    }

    /// Free every block of `files` and fill the filesystem: from now on
    /// every write to them fails with ENOSPC and every read gives zeroes.
    fn fail(&self, files: &[std::path::PathBuf]) {
        for file in files {
            run_ok(
                command("fallocate")
                    .args(["--punch-hole", "--offset", "0", "--length"])
                    .arg(GIB.to_string())
                    .arg(file),
            );
        }
        let filler = self.dir.join("filler");
        let answer = run(command("dd")
            .args(["if=/dev/zero", "bs=1M"])
            .arg(format!("of={}", filler.display())));
        assert!(
            answer.stderr.contains("No space left"),
            "{}",
            answer.describe()
        );
    }
}

impl Drop for FullingFolder {
    fn drop(&mut self) {
        let _ = run(command("umount").arg("-l").arg(&self.dir));
    }
}

/// The daemon's open files that are disk images of `pool_prefix`.
fn open_disk_files(daemon: &Daemon, prefix: &str) -> Vec<String> {
    let folder = format!("/proc/{}/fd", daemon.pid());
    std::fs::read_dir(folder)
        .expect("the daemon's descriptors")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .map(|target| target.display().to_string())
        .filter(|target| target.contains(&format!("/{prefix}-")))
        .collect()
}

/// Destroy, export or a failed close let the pool go for good: out of the
/// list and the state file, its files closed, its name free again.
#[track_caller]
fn assert_gone(daemon: &Daemon, name: &str, prefix: &str) {
    assert_eq!(daemon.cli_json(&["pool", "list"]), serde_json::json!([]));
    let state = std::fs::read_to_string(daemon.state_dir.join("pools.json")).expect("state file");
    assert!(!state.contains(name), "still in the state file: {state}");
    assert_eq!(open_disk_files(daemon, prefix), Vec::<String>::new());
    let answer = daemon.cli(&["pool", "status", name]);
    assert!(
        answer.stderr.contains(&format!("no pool named {name}")),
        "{}",
        answer.describe()
    );
}

/// A pool whose two journal disks failed (every write refused with ENOSPC,
/// reads giving zeroes) is destroyed: the healthy disks' labels are erased,
/// the failed ones named as left, and the pool is gone from the daemon.
#[test]
fn a_pool_with_failed_journal_disks_is_destroyed() {
    let mut daemon = Daemon::start();
    let Some(full) = FullingFolder::mount(&daemon, "destroying a pool with failed disks") else {
        return;
    };
    let capacity = daemon.disk_files("t3", 4, GIB);
    let journals = full.disk_files("t3j", 2);
    let mut args: Vec<String> = ["pool", "create", "t3"].map(String::from).to_vec();
    args.extend(capacity.iter().map(|path| path.display().to_string()));
    args.extend(
        journals
            .iter()
            .map(|path| format!("{},usage=journal", path.display())),
    );
    args.extend(["--slab", "16M"].map(String::from));
    daemon.cli_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
    daemon.create_space("t3", "s", &["--layout", "mirror", "--cache", "32M"], "64M");
    full.fail(&journals);
    // A logged write reaches both journal disks where nothing is allocated
    // yet, and fails there (a commit alone may land in metadata pages
    // allocated before the folder filled, as background commits do on a
    // slow machine); the next commit records them failed.
    let mut connection = Connection::open(&daemon.nbd_socket, "s");
    let _ = connection.write(0, &random_bytes(3, 4096), 0);
    connection.disconnect();
    daemon.cli_ok(&["pool", "set", "t3", "--repair-rate", "100M"]);
    // The journal disks are failed; whether the pool still reads DEGRADED
    // depends on how far the repair of the log's copies has come.
    let pool = daemon.pool_status("t3");
    for disk in [4, 5] {
        assert_eq!(pool["disks"][disk]["state"], "FAILED", "{pool}");
    }

    let answer = daemon.cli(&["pool", "destroy", "t3", "--yes"]);
    assert!(answer.success(), "{}", answer.describe());
    for disk in [4, 5] {
        assert!(
            answer
                .stdout
                .contains(&format!("label left on disk {disk} (")),
            "{}",
            answer.describe()
        );
    }
    assert_gone(&daemon, "t3", "t3");
    let mut args = vec!["disk", "list"];
    let paths: Vec<String> = capacity.iter().map(|p| p.display().to_string()).collect();
    args.extend(paths.iter().map(String::as_str));
    for candidate in daemon.cli_json(&args).as_array().expect("disk list") {
        assert_eq!(candidate["status"], "available", "{candidate}");
    }
    daemon.create_pool("t3", &capacity, "16M");
    daemon.stop();
}

/// An export whose last commit cannot be written (every disk refuses
/// writes) says so, and the pool, closed all the same, leaves the daemon
/// rather than staying listed as a closed pool nothing can be done with.
#[test]
fn an_export_that_cannot_commit_still_lets_the_pool_go() {
    let mut daemon = Daemon::start();
    let Some(full) = FullingFolder::mount(&daemon, "exporting a pool that cannot commit") else {
        return;
    };
    let disks = full.disk_files("t4", 3);
    daemon.create_pool("t4", &disks, "16M");
    daemon.create_space("t4", "m", &["--layout", "mirror"], "32M");
    full.fail(&disks);
    let answer = daemon.cli(&["pool", "export", "t4"]);
    assert!(!answer.success(), "{}", answer.describe());
    assert!(
        answer.stderr.contains("pool t4 is exported, but"),
        "{}",
        answer.describe()
    );
    assert_gone(&daemon, "t4", "t4");
    daemon.stop();
}

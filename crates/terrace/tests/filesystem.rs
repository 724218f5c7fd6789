//! ext4 on a space, through the kernel: nbdfuse presents the space as a
//! file, a loop device (direct I/O) makes it a block device, and mkfs,
//! mount, e2fsck work on it. Checked on a 2-way mirror and on dual parity,
//! then again after the pool was imported with one of its disks missing.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{
    assert_same_tree, command, hash_tree, run, run_ok, skip_without, write_tree, Daemon, FuseFile,
    LoopDevice, Mount, GIB,
};

const TOOLS: [&str; 7] = [
    "nbdfuse",
    "fusermount3",
    "losetup",
    "mkfs.ext4",
    "e2fsck",
    "mount",
    "umount",
];

/// The space as a block device: nbdfuse file, then loop device. Drop order
/// (loop device first, then the fuse file) is the teardown order.
struct BlockDevice {
    loop_device: LoopDevice,
    fuse: FuseFile,
}

impl BlockDevice {
    fn attach(daemon: &Daemon, space: &str) -> BlockDevice {
        let fuse = FuseFile::attach(daemon.temp(), space, &daemon.uri(space));
        let loop_device = LoopDevice::attach(&fuse.file);
        BlockDevice { loop_device, fuse }
    }

    fn device(&self) -> &str {
        &self.loop_device.device
    }

    fn detach(self) {
        self.loop_device.detach();
        self.fuse.detach();
    }
}

fn fsck_clean(device: &str, when: &str) {
    let answer = run(command("e2fsck").args(["-f", "-n"]).arg(device));
    assert_eq!(
        answer.code(),
        Some(0),
        "e2fsck -fn {when}\n{}",
        answer.describe()
    );
}

fn sync() {
    // SAFETY: sync(2) has no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// mkfs, write a tree, unmount, fsck, mount again, compare. Returns the tree.
fn fill_and_check(daemon: &Daemon, space: &str) -> BTreeMap<String, String> {
    let mountpoint = daemon.temp().join(format!("mnt-{space}"));
    let device = BlockDevice::attach(daemon, space);
    run_ok(command("mkfs.ext4").args(["-q", "-F"]).arg(device.device()));
    let mount = Mount::at(device.device(), &mountpoint);
    let written = write_tree(&mountpoint, 1, 200);
    sync();
    assert_same_tree(
        &written,
        &hash_tree(&mountpoint),
        &format!("{space}: read back before unmount"),
    );
    mount.unmount();
    fsck_clean(
        device.device(),
        &format!("of {space} after the first unmount"),
    );
    // A fresh connection, device and mount: nothing comes from a cache.
    device.detach();
    let device = BlockDevice::attach(daemon, space);
    let mount = Mount::at(device.device(), &mountpoint);
    assert_same_tree(
        &written,
        &hash_tree(&mountpoint),
        &format!("{space}: after remount"),
    );
    mount.unmount();
    device.detach();
    written
}

/// Mount with a disk missing: old files intact, new files written, fsck clean.
fn check_degraded(daemon: &Daemon, space: &str, written: &BTreeMap<String, String>) {
    let mountpoint = daemon.temp().join(format!("mnt-{space}"));
    let device = BlockDevice::attach(daemon, space);
    let mount = Mount::at(device.device(), &mountpoint);
    assert_same_tree(
        written,
        &hash_tree(&mountpoint),
        &format!("{space}: degraded, before writing"),
    );
    let mut all = written.clone();
    all.extend(
        write_tree(&mountpoint.join("degraded"), 2, 60)
            .into_iter()
            .map(|(k, v)| (format!("degraded/{k}"), v)),
    );
    sync();
    assert_same_tree(
        &all,
        &hash_tree(&mountpoint),
        &format!("{space}: degraded, after writing"),
    );
    mount.unmount();
    fsck_clean(device.device(), &format!("of degraded {space}"));
    device.detach();
    let device = BlockDevice::attach(daemon, space);
    let mount = Mount::at(device.device(), &mountpoint);
    assert_same_tree(
        &all,
        &hash_tree(&mountpoint),
        &format!("{space}: degraded, after remount"),
    );
    mount.unmount();
    device.detach();
}

/// A disk holding a slab of `space` (from `space show --json`).
fn disk_of(daemon: &Daemon, space: &str) -> String {
    let detail = daemon.cli_json(&["space", "show", space]);
    detail["extent_map"][0]["slots"][1]["device"]
        .as_str()
        .unwrap_or_else(|| panic!("no device in the extent map: {detail}"))
        .to_string()
}

fn ext4_survives_a_missing_disk(space: &str, layout: &[&str]) {
    if skip_without("the filesystem test", &TOOLS) {
        return;
    }
    let mut daemon = Daemon::start();
    let disks: Vec<PathBuf> = daemon.disk_files("fs", 6, 2 * GIB);
    daemon.create_pool("fs", &disks, "16M");
    // The space runs degraded here: no repair into the free disk.
    daemon.cli_ok(&["pool", "set", "fs", "--retire-missing", "never"]);
    daemon.create_space("fs", space, layout, "256M");

    let written = fill_and_check(&daemon, space);

    // Import the pool again without one of the disks the space uses.
    let missing = disk_of(&daemon, space);
    daemon.cli_ok(&["pool", "export", "fs"]);
    let present: Vec<String> = disks
        .iter()
        .map(|p| p.display().to_string())
        .filter(|p| Path::new(p) != Path::new(&missing))
        .collect();
    assert_eq!(
        present.len(),
        disks.len() - 1,
        "{missing} is not one of the pool's disks"
    );
    let mut args = vec!["pool", "import", "--name", "fs"];
    args.extend(present.iter().map(String::as_str));
    let pool = daemon.cli_json(&args);
    assert_eq!(
        pool["state"], "DEGRADED",
        "pool imported without {missing}: {pool}"
    );
    let view = pool["spaces"]
        .as_array()
        .and_then(|s| s.iter().find(|v| v["name"] == space))
        .cloned();
    let view = view.unwrap_or_else(|| panic!("space {space} missing after import: {pool}"));
    // A disk that is missing (not failed) leaves the space incomplete:
    // its data is intact and it works degraded until the disk returns.
    assert_eq!(view["health"], "incomplete", "{view}");
    assert_eq!(view["read_only"], false, "{view}");

    check_degraded(&daemon, space, &written);
    // The one disk left out, and nothing else.
    daemon.assert_log_clean(&["ONLINE -> DEGRADED: 1 disk failed or missing"]);
    daemon.stop();
}

#[test]
fn ext4_on_a_two_way_mirror() {
    ext4_survives_a_missing_disk("mirror", &["--layout", "mirror", "--copies", "2"]);
}

#[test]
fn ext4_on_dual_parity() {
    ext4_survives_a_missing_disk("parity", &["--layout", "parity", "--redundancy", "2"]);
}

/// A discard of a whole device, from `blkdiscard` and from `mkfs.ext4`
/// (which discards first by default, `-E discard`), goes through the loop
/// device and nbdfuse as trims of hundreds of MiB, past the 32 MiB payload
/// limit: a space of 1 GiB takes them, mkfs and fsck succeed, and neither
/// nbdfuse nor the daemon reports an error. On single parity (with its
/// write-back log) and on a mirror (without one, so its trims reach the
/// disks).
#[test]
fn whole_device_discards_and_mkfs_with_discard_work_on_a_large_space() {
    let mut tools = TOOLS.to_vec();
    tools.push("blkdiscard");
    if skip_without("the whole-device discard test", &tools) {
        return;
    }
    let mut daemon = Daemon::start();
    let disks: Vec<PathBuf> = daemon.disk_files("discard", 4, 2 * GIB);
    daemon.create_pool("discard", &disks, "64M");
    let parity = ["--layout", "parity", "--redundancy", "1"];
    daemon.create_space("discard", "parity", &parity, "1G");
    daemon.create_space("discard", "mirror", &["--layout", "mirror"], "1G");
    for space in ["parity", "mirror"] {
        let mountpoint = daemon.temp().join(format!("mnt-{space}"));
        let device = BlockDevice::attach(&daemon, space);
        run_ok(command("blkdiscard").arg(device.device()));
        run_ok(
            command("mkfs.ext4")
                .args(["-q", "-F", "-E", "discard"])
                .arg(device.device()),
        );
        fsck_clean(device.device(), &format!("of {space} after mkfs"));
        let mount = Mount::at(device.device(), &mountpoint);
        let written = write_tree(&mountpoint, 3, 40);
        sync();
        mount.unmount();
        fsck_clean(device.device(), &format!("of {space} after writing"));
        device.detach();
        let device = BlockDevice::attach(&daemon, space);
        let mount = Mount::at(device.device(), &mountpoint);
        assert_same_tree(&written, &hash_tree(&mountpoint), space);
        mount.unmount();
        device.detach();
    }
    daemon.assert_log_clean(&[]);
    daemon.stop();
}

/// ext4 on a 2-way mirror one of whose copies is overwritten, behind the
/// daemon, in 64 KiB pieces every 512 KiB of every slab (metadata and file
/// data alike): mounted again, every file reads back as written, and
/// `e2fsck -fn` finds the file system clean. The reads that met damage
/// rebuilt it from the other copy and counted it against the disk.
#[test]
fn ext4_on_a_mirror_with_a_corrupted_copy_reads_its_files_and_passes_fsck() {
    use std::os::unix::fs::FileExt;
    if skip_without("the filesystem test", &TOOLS) {
        return;
    }
    let mut daemon = Daemon::start();
    let disks: Vec<PathBuf> = daemon.disk_files("rot", 4, 2 * GIB);
    daemon.create_pool("rot", &disks, "16M");
    let space = "rotted";
    daemon.create_space(
        "rot",
        space,
        &["--layout", "mirror", "--copies", "2"],
        "256M",
    );
    let written = fill_and_check(&daemon, space);

    let detail = daemon.cli_json(&["space", "show", space]);
    let status = daemon.pool_status("rot");
    let slab_bytes = status["slab_bytes"].as_u64().expect("slab bytes");
    let data_start = terrace_engine::meta::format::data_offset(
        status["metadata_slot_bytes"].as_u64().expect("slot bytes"),
    );
    let mut damaged = std::collections::BTreeSet::new();
    for extent in detail["extent_map"].as_array().expect("extent map") {
        // Copy 0 of every column.
        for slot in extent["slots"].as_array().expect("slots") {
            if slot["role"]
                .as_str()
                .is_some_and(|role| !role.ends_with("copy 0"))
            {
                continue;
            }
            let device = slot["device"].as_str().expect("device");
            damaged.insert(slot["disk"].as_u64().expect("disk"));
            let start = data_start + slot["slab"].as_u64().expect("slab") * slab_bytes;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(device)
                .expect("backing file");
            for at in (0..slab_bytes).step_by(512 << 10) {
                file.write_all_at(&[0x5c; 64 << 10], start + at)
                    .expect("overwrite");
            }
            file.sync_all().expect("sync");
        }
    }
    assert!(!damaged.is_empty(), "no copy 0 in {detail}");

    let mountpoint = daemon.temp().join(format!("mnt-{space}"));
    let device = BlockDevice::attach(&daemon, space);
    let mount = Mount::at(device.device(), &mountpoint);
    assert_same_tree(
        &written,
        &hash_tree(&mountpoint),
        &format!("{space}: with a corrupted copy"),
    );
    mount.unmount();
    fsck_clean(
        device.device(),
        &format!("of {space} with a corrupted copy"),
    );
    device.detach();
    let status = daemon.pool_status("rot");
    let counted: u64 = status["disks"]
        .as_array()
        .expect("disks")
        .iter()
        .map(|disk| disk["checksum_errors"].as_u64().unwrap_or(0))
        .sum();
    assert!(counted > 0, "no checksum errors counted: {status}");
    daemon.stop();
}

/// ext4 on a thin space (a 2-way mirror, and single parity with its
/// write-back log), larger than its pool: files written take room, files
/// deleted and `fstrim` give whole extents back (`space list` and `pool
/// status` say so), and the file system stays clean.
#[test]
fn ext4_on_a_thin_space_gives_room_back_at_fstrim() {
    let mut tools = TOOLS.to_vec();
    tools.extend(["fstrim", "dd"]);
    if skip_without("the thin fstrim test", &tools) {
        return;
    }
    let mut daemon = Daemon::start();
    let disks: Vec<PathBuf> = daemon.disk_files("thin", 4, GIB);
    daemon.create_pool("thin", &disks, "16M");
    let thin = ["--provisioning", "thin"];
    let parity = ["--layout", "parity", "--redundancy", "1", thin[0], thin[1]];
    daemon.create_space("thin", "parity", &parity, "8G");
    daemon.create_space(
        "thin",
        "mirror",
        &["--layout", "mirror", thin[0], thin[1]],
        "8G",
    );
    let allocated = |daemon: &Daemon, space: &str| -> u64 {
        let list = daemon.cli_json(&["space", "list"]);
        let view = list
            .as_array()
            .and_then(|spaces| spaces.iter().find(|view| view["name"] == space))
            .unwrap_or_else(|| panic!("no space {space} in {list}"));
        view["allocated_bytes"].as_u64().expect("allocated_bytes")
    };
    let pool_allocated = |daemon: &Daemon| -> u64 {
        daemon.pool_status("thin")["allocated_bytes"]
            .as_u64()
            .expect("allocated_bytes")
    };
    for space in ["parity", "mirror"] {
        let mountpoint = daemon.temp().join(format!("mnt-{space}"));
        let device = BlockDevice::attach(&daemon, space);
        run_ok(command("mkfs.ext4").args(["-q", "-F"]).arg(device.device()));
        let mount = Mount::at(device.device(), &mountpoint);
        let before = allocated(&daemon, space);
        for file in 0..3 {
            run_ok(
                command("dd")
                    .arg("if=/dev/urandom")
                    .arg(format!("of={}/file{file}", mountpoint.display()))
                    .args(["bs=1M", "count=128", "status=none"]),
            );
        }
        let kept = write_tree(&mountpoint, 4, 20);
        sync();
        let full = allocated(&daemon, space);
        let pool_full = pool_allocated(&daemon);
        assert!(
            full >= before + 384 * (1 << 20),
            "{space}: {before} bytes allocated before writing 384 MiB, {full} after"
        );
        for file in 0..3 {
            std::fs::remove_file(mountpoint.join(format!("file{file}"))).expect("rm");
        }
        sync();
        run_ok(command("fstrim").arg(&mountpoint));
        sync();
        let trimmed = allocated(&daemon, space);
        assert!(
            trimmed + 256 * (1 << 20) <= full,
            "{space}: {full} bytes allocated before fstrim, {trimmed} after"
        );
        assert!(
            pool_allocated(&daemon) < pool_full,
            "{space}: the pool has the slabs back"
        );
        assert_same_tree(&kept, &hash_tree(&mountpoint), space);
        mount.unmount();
        fsck_clean(device.device(), &format!("of {space} after fstrim"));
        device.detach();
    }
    daemon.assert_log_clean(&[]);
    daemon.stop();
}

//! A disk that holds something is never written to unless forced: for each
//! kind of content, made by its real tool, `pool create` is refused with
//! what was found and where, no byte of any disk given changes, `disk
//! list` says what the disk holds, and `--force` pools it, wiping what it
//! held so that no tool (blkid) takes the disk for it afterwards.
//!
//! Also here: disks given twice under two paths, and `disk add` and `disk
//! replace` on disks that hold something.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{command, content_fingerprint, run, run_ok, skip_without, sparse_file, Daemon, MIB};

/// The disk a case made: the path terrace is given, and the file behind it.
struct Made {
    path: String,
    backing: PathBuf,
    /// A loop device (LVM needs one), detached after the daemon stops.
    device: Option<common::LoopDevice>,
}

impl Made {
    fn file(path: &Path) -> Made {
        Made {
            path: path.display().to_string(),
            backing: path.to_path_buf(),
            device: None,
        }
    }
}

/// What one kind of content looks like to terrace.
struct Case<'a> {
    test: &'a str,
    /// Tools the case runs.
    tools: &'a [&'a str],
    size: u64,
    /// Words the refusal and `disk list` name it by (the first one is in
    /// the `holds.kind` of `disk list --json`).
    kind: &'a [&'a str],
    label: Option<&'a str>,
}

/// Make the content with `make` on a fresh sparse file, then check that
/// terrace refuses it, changes nothing, lists it, and takes it forced.
fn refused_then_forced(case: Case, make: impl FnOnce(&Path) -> Made) {
    if skip_without(case.test, case.tools) {
        return;
    }
    let mut daemon = Daemon::start();
    let blank = daemon.disk_files("blank", 1, 128 * MIB).remove(0);
    let file = daemon.root.join("disks/held.img");
    sparse_file(&file, case.size);
    let made = make(&file);
    let target = made.path.clone();
    let blank_text = blank.display().to_string();
    let before = (
        content_fingerprint(&blank),
        content_fingerprint(&made.backing),
    );

    let listed = daemon.cli_json(&["disk", "list", &target]);
    let candidate = &listed[0];
    assert_eq!(candidate["status"], "occupied", "{candidate}");
    let holds = candidate["holds"]["kind"].as_str().unwrap_or_default();
    assert!(holds.contains(case.kind[0]), "{candidate}");
    if let Some(label) = case.label {
        assert_eq!(candidate["holds"]["label"], label, "{candidate}");
    }

    let create = ["pool", "create", "p", &blank_text, &target, "--slab", "8M"];
    let answer = daemon.cli(&create);
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    let mut mentions = vec![target.as_str(), "--force", "nothing was changed"];
    mentions.extend(case.kind);
    mentions.extend(case.label);
    for word in mentions {
        assert!(
            answer.stderr.contains(word),
            "the refusal does not say {word:?}\n{}",
            answer.describe()
        );
    }
    let after = (
        content_fingerprint(&blank),
        content_fingerprint(&made.backing),
    );
    assert_eq!(after, before, "a refused pool create changed a disk");
    assert_eq!(daemon.cli_json(&["pool", "list"]), serde_json::json!([]));

    let mut forced = create.to_vec();
    forced.push("--force");
    let pool = daemon.cli_json(&forced);
    assert_eq!(pool["disks"].as_array().map(Vec::len), Some(2), "{pool}");
    // What it held is gone for every tool, not only covered where
    // terrace wrote.
    let seen = run(command("blkid").args(["-p", "-o", "export"]).arg(&target));
    assert_eq!(
        seen.code(),
        Some(2),
        "blkid still finds something on a forced disk\n{}",
        seen.describe()
    );
    daemon.stop();
    if let Some(device) = made.device {
        device.detach();
    }
}

fn tool_on(file: &Path, tool: &str, args: &[&str]) -> Made {
    run_ok(command(tool).args(args).arg(file));
    Made::file(file)
}

#[test]
fn an_ext2_file_system_is_refused() {
    let case = Case {
        test: "an_ext2_file_system_is_refused",
        tools: &["mkfs.ext2", "blkid"],
        size: 128 * MIB,
        kind: &["ext2 file system"],
        label: Some("data"),
    };
    refused_then_forced(case, |f| {
        tool_on(f, "mkfs.ext2", &["-q", "-F", "-L", "data"])
    });
}

#[test]
fn an_ext3_file_system_is_refused() {
    let case = Case {
        test: "an_ext3_file_system_is_refused",
        tools: &["mkfs.ext3", "blkid"],
        size: 128 * MIB,
        kind: &["ext3 file system"],
        label: Some("data"),
    };
    refused_then_forced(case, |f| {
        tool_on(f, "mkfs.ext3", &["-q", "-F", "-L", "data"])
    });
}

#[test]
fn an_ext4_file_system_is_refused() {
    let case = Case {
        test: "an_ext4_file_system_is_refused",
        tools: &["mkfs.ext4", "blkid"],
        size: 128 * MIB,
        kind: &["ext4 file system", "UUID"],
        label: Some("data"),
    };
    refused_then_forced(case, |f| {
        tool_on(f, "mkfs.ext4", &["-q", "-F", "-L", "data"])
    });
}

#[test]
fn an_xfs_file_system_is_refused() {
    let case = Case {
        test: "an_xfs_file_system_is_refused",
        tools: &["mkfs.xfs", "blkid"],
        // mkfs.xfs refuses file systems under 300 MiB.
        size: 512 * MIB,
        kind: &["XFS file system"],
        label: Some("data"),
    };
    refused_then_forced(case, |f| {
        tool_on(f, "mkfs.xfs", &["-q", "-f", "-L", "data"])
    });
}

#[test]
fn a_btrfs_file_system_is_refused() {
    let case = Case {
        test: "a_btrfs_file_system_is_refused",
        tools: &["mkfs.btrfs", "blkid"],
        size: 256 * MIB,
        kind: &["btrfs file system"],
        label: Some("data"),
    };
    refused_then_forced(case, |f| {
        tool_on(f, "mkfs.btrfs", &["-q", "-f", "-L", "data"])
    });
}

#[test]
fn a_fat_file_system_is_refused() {
    let case = Case {
        test: "a_fat_file_system_is_refused",
        tools: &["mkfs.vfat", "blkid"],
        size: 128 * MIB,
        kind: &["FAT"],
        label: Some("DATA"),
    };
    refused_then_forced(case, |f| tool_on(f, "mkfs.vfat", &["-n", "DATA"]));
}

#[test]
fn an_exfat_file_system_is_refused() {
    let case = Case {
        test: "an_exfat_file_system_is_refused",
        tools: &["mkfs.exfat", "blkid"],
        size: 128 * MIB,
        kind: &["exFAT file system"],
        label: None,
    };
    refused_then_forced(case, |f| tool_on(f, "mkfs.exfat", &["-L", "data"]));
}

#[test]
fn an_ntfs_file_system_is_refused() {
    let case = Case {
        test: "an_ntfs_file_system_is_refused",
        tools: &["mkntfs", "blkid"],
        size: 128 * MIB,
        kind: &["NTFS file system"],
        label: None,
    };
    refused_then_forced(case, |f| {
        tool_on(f, "mkntfs", &["-q", "-F", "-f", "-L", "data"])
    });
}

#[test]
fn a_swap_area_is_refused() {
    let case = Case {
        test: "a_swap_area_is_refused",
        tools: &["mkswap", "blkid"],
        size: 128 * MIB,
        kind: &["swap area"],
        label: Some("data"),
    };
    refused_then_forced(case, |f| tool_on(f, "mkswap", &["-L", "data"]));
}

#[test]
fn a_luks_volume_is_refused() {
    let case = Case {
        test: "a_luks_volume_is_refused",
        tools: &["cryptsetup", "blkid"],
        size: 128 * MIB,
        kind: &["LUKS2 encrypted volume"],
        label: Some("data"),
    };
    refused_then_forced(case, |f| {
        let key = f.with_extension("key");
        std::fs::write(&key, b"a key that only this test knows").expect("key file");
        // The cheapest key derivation there is: the test is about the
        // header, not the key.
        run_ok(
            command("cryptsetup")
                .args(["luksFormat", "--batch-mode", "--type", "luks2"])
                .args(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"])
                .args(["--label", "data", "--key-file"])
                .arg(&key)
                .arg(f),
        );
        Made::file(f)
    });
}

/// `pvcreate` with its configuration and locks in a folder of the test's
/// own, looking at `device` alone, without udev: the host's LVM neither
/// learns of the volume nor keeps the device.
fn lvm(folder: &Path, device: &str) -> Command {
    let mut pvcreate = command("pvcreate");
    pvcreate
        .env("LVM_SYSTEM_DIR", folder)
        .args(["--config"])
        .arg(format!(
            "devices {{ filter = [ \"a|^{device}$|\", \"r|.*|\" ] obtain_device_list_from_udev = 0 \
             }} global {{ use_lvmetad = 0 locking_dir = \"{}\" }} activation {{ udev_sync = 0 \
             udev_rules = 0 }}",
            folder.display()
        ))
        .args(["-ff", "-y"])
        .arg(device);
    pvcreate
}

#[test]
fn an_lvm2_physical_volume_is_refused() {
    let case = Case {
        test: "an_lvm2_physical_volume_is_refused",
        tools: &["pvcreate", "losetup", "blkid"],
        size: 128 * MIB,
        kind: &["LVM2 physical volume"],
        label: None,
    };
    refused_then_forced(case, |f| {
        let folder = f.with_extension("lvm");
        std::fs::create_dir_all(&folder).expect("lvm folder");
        let device = common::LoopDevice::attach(f);
        run_ok(&mut lvm(&folder, &device.device));
        Made {
            path: device.device.clone(),
            backing: f.to_path_buf(),
            device: Some(device),
        }
    });
}

#[test]
fn a_gpt_partition_table_is_refused() {
    let case = Case {
        test: "a_gpt_partition_table_is_refused",
        tools: &["sgdisk", "blkid"],
        size: 128 * MIB,
        kind: &["GPT partition table"],
        label: None,
    };
    refused_then_forced(case, |f| tool_on(f, "sgdisk", &["-n", "1:0:0"]));
}

#[test]
fn an_mbr_partition_table_is_refused() {
    let case = Case {
        test: "an_mbr_partition_table_is_refused",
        tools: &["sfdisk", "blkid"],
        size: 128 * MIB,
        kind: &["MBR partition table"],
        label: None,
    };
    refused_then_forced(case, |f| {
        common::run_with(
            command("sfdisk").arg("-q").arg(f),
            Some(b"label: dos\n,,L\n"),
            common::COMMAND_TIMEOUT,
        )
        .check();
        Made::file(f)
    });
}

#[test]
fn a_bcache_device_is_refused() {
    let case = Case {
        test: "a_bcache_device_is_refused",
        tools: &["make-bcache", "blkid"],
        size: 128 * MIB,
        kind: &["bcache device"],
        label: None,
    };
    refused_then_forced(case, |f| tool_on(f, "make-bcache", &["-B"]));
}

/// The md RAID superblocks are written by hand, byte for byte as the
/// kernel's `include/uapi/linux/raid/md_p.h` lays them out: `mdadm
/// --create` needs the kernel's md driver, which this machine lacks (no
/// /proc/mdstat, no md_mod module). `mdadm --examine`, which reads a
/// superblock without the kernel, must then take each for a real one.
mod md {
    /// MD_SB_MAGIC, in the little-endian order of x86.
    const MAGIC: u32 = 0xa92b_4efc;

    fn put32(block: &mut [u8], offset: usize, value: u32) {
        block[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
    }

    fn put64(block: &mut [u8], offset: usize, value: u64) {
        block[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// The kernel's `calc_sb_1_csum` and `calc_sb_csum`: 32-bit words
    /// summed into 64 bits (the checksum field as zero), folded once.
    fn checksum(block: &[u8]) -> u32 {
        let sum: u64 = block
            .chunks(4)
            .map(|word| match word {
                [a, b, c, d] => u64::from(u32::from_le_bytes([*a, *b, *c, *d])),
                [a, b] => u64::from(u16::from_le_bytes([*a, *b])),
                _ => 0,
            })
            .sum();
        ((sum & 0xffff_ffff) + (sum >> 32)) as u32
    }

    /// A version 1.2 superblock (at 4 KiB) of member 0 of a clean 2-disk
    /// RAID1 named `name`, for a device of `device_sectors`.
    pub fn superblock_1_2(device_sectors: u64, name: &str) -> Vec<u8> {
        const MAX_DEV: usize = 2;
        let mut sb = vec![0u8; 256 + 2 * MAX_DEV];
        let data_offset = 2048u64;
        let data_size = device_sectors - data_offset;
        put32(&mut sb, 0, MAGIC);
        put32(&mut sb, 4, 1); // major_version
        put32(&mut sb, 8, 0); // feature_map
        sb[16..32].copy_from_slice(&[0x5e; 16]); // set_uuid
        sb[32..32 + name.len()].copy_from_slice(name.as_bytes()); // set_name
        put64(&mut sb, 64, 1_700_000_000); // ctime
        put32(&mut sb, 72, 1); // level: RAID1
        put64(&mut sb, 80, data_size); // size
        put32(&mut sb, 92, 2); // raid_disks
        put64(&mut sb, 128, data_offset);
        put64(&mut sb, 136, data_size);
        put64(&mut sb, 144, 8); // super_offset: sector 8, 4 KiB
        put32(&mut sb, 160, 0); // dev_number
        sb[168..184].copy_from_slice(&[0xd1; 16]); // device_uuid
        put64(&mut sb, 192, 1_700_000_000); // utime
        put64(&mut sb, 200, 1); // events
        put64(&mut sb, 208, u64::MAX); // resync_offset: in sync
        put32(&mut sb, 220, MAX_DEV as u32);
        sb[256..258].copy_from_slice(&0u16.to_le_bytes()); // dev_roles[0]: slot 0
        sb[258..260].copy_from_slice(&1u16.to_le_bytes()); // dev_roles[1]: slot 1
        let sum = checksum(&sb);
        put32(&mut sb, 216, sum); // sb_csum
        sb
    }

    /// Where a 0.90 superblock goes: 64 KiB before the end rounded down
    /// to 64 KiB (MD_NEW_SIZE_SECTORS).
    pub fn offset_0_90(device_bytes: u64) -> u64 {
        (device_bytes & !0xffff) - 0x10000
    }

    /// A version 0.90 superblock (4 KiB) of member 0 of a clean 2-disk
    /// RAID1, for a device of `device_bytes`.
    pub fn superblock_0_90(device_bytes: u64) -> Vec<u8> {
        let mut sb = vec![0u8; 4096];
        let word = |index: usize| index * 4;
        let size_kib = (offset_0_90(device_bytes) / 1024) as u32;
        put32(&mut sb, word(0), MAGIC);
        put32(&mut sb, word(1), 0); // major_version
        put32(&mut sb, word(2), 90); // minor_version
        put32(&mut sb, word(5), 0x1111_1111); // set_uuid0
        put32(&mut sb, word(6), 1_700_000_000); // ctime
        put32(&mut sb, word(7), 1); // level
        put32(&mut sb, word(8), size_kib); // size
        put32(&mut sb, word(9), 2); // nr_disks
        put32(&mut sb, word(10), 2); // raid_disks
        put32(&mut sb, word(13), 0x2222_2222); // set_uuid1
        put32(&mut sb, word(14), 0x3333_3333); // set_uuid2
        put32(&mut sb, word(15), 0x4444_4444); // set_uuid3
        put32(&mut sb, word(32), 1_700_000_000); // utime
        put32(&mut sb, word(33), 1); // state: clean
        put32(&mut sb, word(34), 2); // active_disks
        put32(&mut sb, word(35), 2); // working_disks
        put32(&mut sb, word(39), 1); // events_lo
                                     // disks[0] and disks[1] (words 128 and 160), this_disk (992):
                                     // number, major, minor, raid_disk, state (active, in sync).
        for (base, number) in [(128, 0), (160, 1), (992, 0)] {
            put32(&mut sb, word(base), number);
            put32(&mut sb, word(base + 1), 7);
            put32(&mut sb, word(base + 2), number);
            put32(&mut sb, word(base + 3), number);
            put32(&mut sb, word(base + 4), 6);
        }
        let sum = checksum(&sb);
        put32(&mut sb, word(38), sum); // sb_csum
        sb
    }
}

fn write_at(file: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let handle = std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .expect("open for writing");
    handle.write_all_at(bytes, offset).expect("write");
}

/// `mdadm --examine` takes `file` for an md member with `version`.
fn examined(file: &Path, version: &str) {
    let answer = run(command("mdadm").arg("--examine").arg(file));
    assert!(
        answer.success() && answer.stdout.contains(version),
        "mdadm does not take the superblock for a real one\n{}",
        answer.describe()
    );
}

#[test]
fn an_md_raid_member_with_metadata_1_2_is_refused() {
    let case = Case {
        test: "an_md_raid_member_with_metadata_1_2_is_refused",
        tools: &["mdadm", "blkid"],
        size: 128 * MIB,
        kind: &["md RAID member (metadata 1.2)"],
        label: Some("host:7"),
    };
    refused_then_forced(case, |f| {
        write_at(f, 4096, &md::superblock_1_2(128 * MIB / 512, "host:7"));
        examined(f, "Version : 1.2");
        Made::file(f)
    });
}

#[test]
fn an_md_raid_member_with_metadata_0_90_is_refused() {
    let size = 128 * MIB + 12345 * 512;
    let case = Case {
        test: "an_md_raid_member_with_metadata_0_90_is_refused",
        tools: &["mdadm", "blkid"],
        size,
        kind: &["md RAID member (metadata 0.90)", "11111111:22222222"],
        label: None,
    };
    refused_then_forced(case, |f| {
        write_at(f, md::offset_0_90(size), &md::superblock_0_90(size));
        examined(f, "Version : 0.90");
        Made::file(f)
    });
}

/// A `zfs-fuse` daemon of the test's own, stopped (by its process id)
/// when dropped.
struct ZfsFuse(std::process::Child);

impl Drop for ZfsFuse {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_zfs_pool_member_is_refused() {
    let pool = format!("tz{}", std::process::id());
    let case = Case {
        test: "a_zfs_pool_member_is_refused",
        tools: &["zfs-fuse", "zpool", "blkid"],
        size: 128 * MIB,
        kind: &["ZFS pool member"],
        label: Some(&pool),
    };
    refused_then_forced(case, |f| {
        let daemon = ZfsFuse(
            command("zfs-fuse")
                .arg("--no-daemon")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start zfs-fuse"),
        );
        // zfs-fuse answers once its socket is up.
        common::wait_for("zfs-fuse", std::time::Duration::from_secs(30), || {
            run(command("zpool").arg("list")).success().then_some(())
        });
        run_ok(command("zpool").args(["create", "-f", &pool]).arg(f));
        run_ok(command("zpool").args(["export", &pool]));
        drop(daemon);
        Made::file(f)
    });
}

/// An ext4 file system on `file`, labelled `data`.
fn ext4(file: &Path) {
    run_ok(
        command("mkfs.ext4")
            .args(["-q", "-F", "-L", "data"])
            .arg(file),
    );
}

/// `disk add` and `disk replace` probe their new disks too: refused,
/// nothing changed, and taken with `--force`.
#[test]
fn disk_add_and_replace_refuse_a_disk_that_holds_something() {
    if skip_without(
        "disk_add_and_replace_refuse_a_disk_that_holds_something",
        &["mkfs.ext4"],
    ) {
        return;
    }
    let daemon = Daemon::start();
    let disks = daemon.disk_files("pool", 2, 128 * MIB);
    daemon.create_pool("p", &disks, "8M");
    let held = daemon.disk_files("held", 2, 128 * MIB);
    let blank = daemon.disk_files("blank", 1, 128 * MIB).remove(0);
    for file in &held {
        ext4(file);
    }
    let (held0, held1) = (held[0].display().to_string(), held[1].display().to_string());
    let blank_text = blank.display().to_string();
    let before: Vec<String> = [&held[0], &held[1], &blank]
        .iter()
        .map(|file| content_fingerprint(file))
        .collect();
    let status_before = daemon.pool_status("p");

    // Every disk of the command is named, and the blank one beside them
    // is not written either.
    let answer = daemon.cli(&["disk", "add", "p", &blank_text, &held0, &held1]);
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    for word in [&held0, &held1, "ext4 file system", "them all", "--force"] {
        assert!(
            answer.stderr.contains(word),
            "{word}\n{}",
            answer.describe()
        );
    }
    let old = disks[1].display().to_string();
    let answer = daemon.cli(&["disk", "replace", "p", &old, &held0]);
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    assert!(
        answer.stderr.contains(&held0) && answer.stderr.contains("ext4"),
        "{}",
        answer.describe()
    );
    let after: Vec<String> = [&held[0], &held[1], &blank]
        .iter()
        .map(|file| content_fingerprint(file))
        .collect();
    assert_eq!(
        after, before,
        "a refused disk add or replace changed a disk"
    );
    let devices = |status: &serde_json::Value| -> Vec<serde_json::Value> {
        let disks = status["disks"].as_array().cloned().unwrap_or_default();
        disks.iter().map(|disk| disk["device"].clone()).collect()
    };
    assert_eq!(devices(&daemon.pool_status("p")), devices(&status_before));

    let pool = daemon.cli_json(&["disk", "add", "p", &held1, "--force"]);
    assert_eq!(pool["disks"].as_array().map(Vec::len), Some(3), "{pool}");
    let job = daemon.cli_json(&["disk", "replace", "p", &old, &held0, "--force"]);
    assert!(job["id"].is_u64(), "{job}");
}

/// The label of a terrace pool that is not open here is refused like any
/// other content (naming the pool), and `--force` takes the disk.
#[test]
fn a_disk_of_a_pool_not_imported_here_is_taken_only_forced() {
    let daemon = Daemon::start();
    let old = daemon.disk_files("old", 1, 128 * MIB);
    daemon.create_pool("gone", &old, "8M");
    daemon.cli_ok(&["pool", "export", "gone"]);
    let blank = daemon.disk_files("blank", 1, 128 * MIB).remove(0);
    let (old_text, blank_text) = (old[0].display().to_string(), blank.display().to_string());
    let before = (content_fingerprint(&old[0]), content_fingerprint(&blank));
    let listed = daemon.cli_json(&["disk", "list", &old_text]);
    assert_eq!(listed[0]["status"], "in-pool", "{listed}");

    let create = [
        "pool",
        "create",
        "new",
        &blank_text,
        &old_text,
        "--slab",
        "8M",
    ];
    let answer = daemon.cli(&create);
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    for word in [
        &old_text,
        "terrace pool gone",
        "not imported here",
        "--force",
    ] {
        assert!(
            answer.stderr.contains(word),
            "{word}\n{}",
            answer.describe()
        );
    }
    let after = (content_fingerprint(&old[0]), content_fingerprint(&blank));
    assert_eq!(after, before, "a refused pool create changed a disk");

    let mut forced = create.to_vec();
    forced.push("--force");
    let pool = daemon.cli_json(&forced);
    assert_eq!(pool["disks"].as_array().map(Vec::len), Some(2), "{pool}");
    // The old pool is gone from its disk: nothing to import.
    daemon.cli_ok(&["pool", "export", "new"]);
    let found = daemon.cli_json(&["pool", "import", &old_text]);
    assert_eq!(found["name"], "new", "{found}");
}

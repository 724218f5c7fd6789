//! Unmodified NBD clients against a running daemon, on a space of every
//! layout (simple, 2- and 3-way mirror, single and dual parity): nbdinfo,
//! qemu-img and qemu-io, nbdcopy, fio's nbd engine. Over the Unix socket
//! and TCP.

mod common;

use common::{
    command, random_bytes, run, run_ok, sha256_file, skip_without, wait_for, Daemon, FuseFile,
    LAYOUTS, MIB,
};
use serde_json::Value;
use std::time::Duration;

fn size_of(space: &Value) -> u64 {
    space["size_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no size_bytes in {space}"))
}

#[test]
fn nbdinfo_sees_every_layout_as_a_writable_disk() {
    if skip_without("nbdinfo", &["nbdinfo"]) {
        return;
    }
    let (mut daemon, spaces) = Daemon::with_every_layout("64M");
    for (layout, space) in LAYOUTS.iter().zip(&spaces) {
        let uri = daemon.uri(layout.name);
        let size = size_of(space);
        assert_eq!(size, 64 * MIB, "{space}");

        let info = run_ok(command("nbdinfo").arg("--json").arg(&uri)).json();
        let export = &info["exports"][0];
        assert_eq!(export["export-name"], layout.name, "{info}");
        assert_eq!(export["export-size"].as_u64(), Some(size), "{info}");
        for flag in [
            "can_flush",
            "can_fua",
            "can_trim",
            "can_zero",
            "can_multi_conn",
        ] {
            assert_eq!(export[flag], true, "{flag} of {}: {info}", layout.name);
        }
        assert_eq!(export["is_read_only"], false, "{info}");
        // Plain files cannot say they spin.
        assert_eq!(export["is_rotational"], false, "{info}");
        let minimum = export["block_size_minimum"].as_u64();
        let preferred = export["block_size_preferred"].as_u64();
        let maximum = export["block_size_maximum"].as_u64();
        assert_eq!(minimum, Some(512), "minimum block size: {info}");
        let preferred = preferred.unwrap_or_else(|| panic!("no preferred block size: {info}"));
        assert!(
            preferred.is_power_of_two() && preferred >= 512,
            "preferred block size {preferred}: {info}"
        );
        assert_eq!(maximum, Some(32 * MIB), "maximum payload: {info}");
        assert!(preferred <= 32 * MIB, "preferred above maximum: {info}");

        for feature in [
            "flush",
            "fua",
            "trim",
            "zero",
            "multi-conn",
            "connect",
            "read",
        ] {
            let answer = run(command("nbdinfo").args(["--can", feature]).arg(&uri));
            assert_eq!(
                answer.code(),
                Some(0),
                "nbdinfo --can {feature} on {}\n{}",
                layout.name,
                answer.describe()
            );
        }
        // Exit 2 means "false"; anything else is an error talking to the server.
        let answer = run(command("nbdinfo").args(["--is", "read-only"]).arg(&uri));
        assert_eq!(
            answer.code(),
            Some(2),
            "a space of a normal pool is writable\n{}",
            answer.describe()
        );

        // The allocation map covers the whole export, contiguously.
        let map = run_ok(command("nbdinfo").args(["--map", "--json"]).arg(&uri)).json();
        let extents = map
            .as_array()
            .unwrap_or_else(|| panic!("map is not a list: {map}"));
        assert!(!extents.is_empty(), "empty map for {}", layout.name);
        let mut next = 0;
        for extent in extents {
            assert_eq!(
                extent["offset"].as_u64(),
                Some(next),
                "gap or overlap in map: {map}"
            );
            next += extent["length"].as_u64().expect("extent length");
        }
        assert_eq!(
            next, size,
            "map of {} covers {next} of {size} bytes: {map}",
            layout.name
        );

        // The same export over TCP.
        let tcp = run_ok(
            command("nbdinfo")
                .arg("--size")
                .arg(daemon.tcp_uri(layout.name)),
        );
        assert_eq!(tcp.stdout.trim(), size.to_string(), "size over TCP");
    }

    // --list shows every space, with its layout in the description.
    let listing = run_ok(
        command("nbdinfo")
            .args(["--list", "--json"])
            .arg(daemon.uri("")),
    )
    .json();
    let exports = listing["exports"]
        .as_array()
        .unwrap_or_else(|| panic!("no exports: {listing}"));
    for layout in &LAYOUTS {
        let found = exports
            .iter()
            .find(|e| e["export-name"] == layout.name)
            .unwrap_or_else(|| panic!("nbdinfo --list lacks {}: {listing}", layout.name));
        let description = found["description"].as_str().unwrap_or_default();
        assert!(
            description.contains(layout.description),
            "description of {} is {description:?}, expected it to name {:?}",
            layout.name,
            layout.description
        );
    }
    assert_eq!(exports.len(), LAYOUTS.len(), "exports: {listing}");

    // An export that does not exist is refused, not served.
    let answer = run(command("nbdinfo").arg(daemon.uri("no-such-space")));
    assert!(
        !answer.success(),
        "nbdinfo connected to a space that does not exist\n{}",
        answer.describe()
    );
    daemon.stop();
}

/// A space on spinning drives tells its NBD clients so (a client picks
/// its I/O scheduling, and a file system its layout, by it); one on SSDs
/// does not. The disks' media, declared nowhere, is what the devices say.
#[test]
fn spaces_on_spinning_drives_say_so_to_nbd_clients() {
    if skip_without("nbdinfo", &["nbdinfo"]) {
        return;
    }
    let mut daemon = Daemon::start();
    for (pool, model, media, spins) in [
        ("spinning", "hdd-7k", "hdd", true),
        ("flash", "ssd-sata", "ssd", false),
    ] {
        let disks: Vec<String> = daemon
            .disk_files(pool, 2, 256 * MIB)
            .iter()
            .map(|file| format!("{},model={model}", file.display()))
            .collect();
        let mut args = vec!["pool", "create", pool];
        args.extend(disks.iter().map(String::as_str));
        args.extend(["--slab", "16M"]);
        let status = daemon.cli_json(&args);
        for disk in status["disks"].as_array().expect("disks") {
            assert_eq!(disk["media"], media, "{pool}: {status}");
        }
        let name = format!("{pool}-space");
        daemon.create_space(pool, &name, &["--layout", "mirror"], "32M");
        let info = run_ok(command("nbdinfo").arg("--json").arg(daemon.uri(&name))).json();
        assert_eq!(info["exports"][0]["is_rotational"], spins, "{name}: {info}");
    }
    daemon.stop();
}

#[test]
fn qemu_writes_compares_and_verifies_patterns_on_every_layout() {
    if skip_without("qemu", &["qemu-img", "qemu-io"]) {
        return;
    }
    let (mut daemon, spaces) = Daemon::with_every_layout("64M");
    for (index, (layout, space)) in LAYOUTS.iter().zip(&spaces).enumerate() {
        let uri = daemon.uri(layout.name);
        let size = size_of(space);
        let info = run_ok(
            command("qemu-img")
                .args(["info", "--output=json"])
                .arg(&uri),
        )
        .json();
        assert_eq!(
            info["virtual-size"].as_u64(),
            Some(size),
            "qemu-img info {uri}: {info}"
        );

        // A random image of the space's size in, then compared byte for byte.
        let reference = daemon.temp().join(format!("{}.ref", layout.name));
        std::fs::write(&reference, random_bytes(index as u64 + 1, size as usize))
            .expect("reference image");
        run_ok(
            command("qemu-img")
                .args(["convert", "-n", "-f", "raw", "-O", "raw"])
                .arg(&reference)
                .arg(&uri),
        );
        let compare = run_ok(
            command("qemu-img")
                .args(["compare", "-f", "raw", "-F", "raw"])
                .arg(&reference)
                .arg(&uri),
        );
        assert!(
            compare.stdout.contains("Images are identical"),
            "{}",
            compare.describe()
        );
        // Over TCP too (a fresh connection sees what the Unix one wrote).
        run_ok(
            command("qemu-img")
                .args(["compare", "-f", "raw", "-F", "raw"])
                .arg(&reference)
                .arg(daemon.tcp_uri(layout.name)),
        );

        let io = run(command("qemu-io").args(["-f", "raw"]).arg(&uri).args([
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "read -P 0xab 0 1M",
            "-c",
            "write -f -P 0xcd 1M 64k",
            "-c",
            "read -P 0xcd 1M 64k",
            "-c",
            "write -z 2M 1M",
            "-c",
            "read -P 0 2M 1M",
            "-c",
            "discard 4M 1M",
            "-c",
            "flush",
            // Unaligned: qemu turns it into a read-modify-write of 512-byte blocks.
            "-c",
            "write -P 0x11 513 1000",
            "-c",
            "read -P 0x11 513 1000",
            "-c",
            "read -P 0xab 0 513",
            "-c",
            "read -P 0xab 1513 2000",
            // The last bytes of the space.
            "-c",
            &format!("write -P 0x77 {} 64k", size - 64 * 1024),
            "-c",
            &format!("read -P 0x77 {} 64k", size - 64 * 1024),
        ]));
        let output = format!("{}{}", io.stdout, io.stderr);
        assert!(
            io.success() && !output.contains("failed") && !output.contains("Pattern verification"),
            "qemu-io on {}\n{}",
            layout.name,
            io.describe()
        );
        // What qemu-io wrote, seen by a new connection; the rest of the
        // reference image is untouched.
        let check = run(command("qemu-io")
            .args(["-f", "raw", "-r"])
            .arg(daemon.tcp_uri(layout.name))
            .args([
                "-c",
                "read -P 0xab 0 513",
                "-c",
                "read -P 0x11 513 1000",
                "-c",
                "read -P 0xcd 1M 64k",
                "-c",
                "read -P 0 2M 1M",
            ]));
        let output = format!("{}{}", check.stdout, check.stderr);
        assert!(
            check.success() && !output.contains("failed"),
            "re-read on {}\n{}",
            layout.name,
            check.describe()
        );
        let reference_data = std::fs::read(&reference).expect("reference");
        let exported = daemon.temp().join(format!("{}.out", layout.name));
        run_ok(
            command("qemu-img")
                .args(["convert", "-f", "raw", "-O", "raw"])
                .arg(&uri)
                .arg(&exported),
        );
        let exported_data = std::fs::read(&exported).expect("exported image");
        assert_eq!(exported_data.len() as u64, size);
        let untouched = (5 * MIB as usize)..(size as usize - 64 * 1024);
        assert!(
            exported_data[untouched.clone()] == reference_data[untouched],
            "{}: bytes beyond what qemu-io wrote changed",
            layout.name
        );
        let _ = std::fs::remove_file(&reference);
        let _ = std::fs::remove_file(&exported);
    }
    daemon.stop();
}

#[test]
fn nbdcopy_round_trips_random_data_through_every_layout() {
    if skip_without("nbdcopy", &["nbdcopy"]) {
        return;
    }
    let (mut daemon, spaces) = Daemon::with_every_layout("32M");
    for (index, (layout, space)) in LAYOUTS.iter().zip(&spaces).enumerate() {
        let size = size_of(space);
        let source = daemon.temp().join(format!("{}.in", layout.name));
        std::fs::write(&source, random_bytes(100 + index as u64, 32 * MIB as usize))
            .expect("source");
        // In over TCP, out over the Unix socket.
        run_ok(
            command("nbdcopy")
                .arg(&source)
                .arg(daemon.tcp_uri(layout.name)),
        );
        let copy = daemon.temp().join(format!("{}.back", layout.name));
        run_ok(command("nbdcopy").arg(daemon.uri(layout.name)).arg(&copy));
        assert_eq!(std::fs::metadata(&copy).expect("copy").len(), size);
        assert_eq!(
            sha256_file(&copy, Some(32 * MIB)),
            sha256_file(&source, None),
            "{}: what nbdcopy read back differs from what it wrote",
            layout.name
        );
        let _ = std::fs::remove_file(&source);
        let _ = std::fs::remove_file(&copy);
    }
    daemon.stop();
}

/// Run fio's nbd engine on `uri` with `options`; require exit 0, no
/// error in any job, and every job to have verified what it wrote.
fn fio(daemon: &Daemon, what: &str, uri: &str, options: &[&str]) {
    let answer = run(command("fio")
        .args([
            "--ioengine=nbd",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
        ])
        .args([
            "--randrepeat=0",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .args(options)
        .arg(format!("--uri={uri}"))
        .current_dir(daemon.temp()));
    let start = answer.stdout.find('{').unwrap_or(0);
    let report: Value = serde_json::from_str(&answer.stdout[start..]).unwrap_or_else(|e| {
        panic!(
            "fio on {what} printed no JSON report ({e})\n{}",
            answer.describe()
        )
    });
    assert!(
        answer.success() && !answer.stderr.contains("verify"),
        "fio on {what}\n{}",
        answer.describe()
    );
    let jobs = report["jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("fio on {what}: no jobs in {report}"));
    assert!(
        !jobs.is_empty(),
        "fio on {what}: no jobs\n{}",
        answer.describe()
    );
    for job in jobs {
        assert_eq!(
            job["error"],
            0,
            "fio on {what}: job {}\n{}",
            job["jobname"],
            answer.describe()
        );
        // Every block written was read back and verified after the writes.
        let reads = job["read"]["total_ios"].as_u64().unwrap_or(0);
        let writes = job["write"]["total_ios"].as_u64().unwrap_or(0);
        assert!(
            writes > 0 && reads >= writes,
            "fio on {what}: {reads} reads, {writes} writes\n{}",
            answer.describe()
        );
    }
}

#[test]
fn fio_random_read_write_verifies_on_every_layout() {
    if skip_without("fio", &["fio"]) {
        return;
    }
    let (mut daemon, _spaces) = Daemon::with_every_layout("32M");
    for layout in &LAYOUTS {
        let options = [
            "--name=verify",
            "--rw=randrw",
            "--bs=4k",
            "--iodepth=32",
            "--size=32M",
        ];
        fio(&daemon, layout.name, &daemon.uri(layout.name), &options);
    }
    daemon.stop();
}

/// Four connections at once on one space, each on its own 8 MiB with
/// request sizes from 4K to 128K: neighbouring jobs share parity rows at
/// the edges of their regions, so read-modify-writes from different
/// connections meet there.
#[test]
fn fio_concurrent_connections_verify_on_every_layout() {
    if skip_without("fio", &["fio"]) {
        return;
    }
    let (mut daemon, _spaces) = Daemon::with_every_layout("32M");
    for layout in &LAYOUTS {
        let options = [
            "--name=concurrent",
            "--rw=randwrite",
            "--bsrange=4k-128k",
            "--iodepth=8",
            "--numjobs=4",
            "--size=8M",
            "--offset_increment=8M",
        ];
        fio(&daemon, layout.name, &daemon.tcp_uri(layout.name), &options);
    }
    daemon.stop();
}

/// A space an NBD client has open is not deleted, nor its pool destroyed
/// or exported, unless forced: the refusal counts the connections and
/// changes nothing (the client reads its data back); forced, the client's
/// reads fail. Connections that close stop counting.
#[test]
fn a_space_a_client_has_open_is_deleted_only_when_forced() {
    use std::io::{Read, Seek, SeekFrom, Write};

    if skip_without(
        "a_space_a_client_has_open_is_deleted_only_when_forced",
        &["nbdfuse", "fusermount3"],
    ) {
        return;
    }
    let daemon = Daemon::start();
    let disks = daemon.disk_files("open", 4, 256 * MIB);
    daemon.create_pool("tank", &disks, "8M");
    daemon.create_space("tank", "vm", &["--layout", "mirror"], "32M");
    let fuse = FuseFile::attach(daemon.temp(), "vm", &daemon.uri("vm"));
    let data = random_bytes(17, MIB as usize);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fuse.file)
        .unwrap();
    file.write_all(&data).unwrap();
    file.sync_all().unwrap();
    // nbdfuse opens several connections.
    let shown = daemon.cli_json(&["space", "show", "vm"]);
    let connections = shown["space"]["nbd_connections"].as_u64().unwrap();
    assert!(connections >= 1, "{shown}");

    for (args, what) in [
        (&["space", "delete", "vm", "--yes"][..], "space vm"),
        (&["pool", "destroy", "tank", "--yes"][..], "pool tank"),
        (&["pool", "export", "tank"][..], "pool tank"),
    ] {
        let refused = daemon.cli(args);
        assert_eq!(refused.code(), Some(1), "{}", refused.describe());
        let open = format!("open by {connections} NBD connection");
        for words in [what, &open, "nothing was changed", "--force"] {
            assert!(refused.stderr.contains(words), "{}", refused.describe());
        }
    }
    let mut read = vec![0; data.len()];
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_exact(&mut read).unwrap();
    assert!(read == data, "the client's data changed");

    daemon.cli_ok(&["space", "delete", "vm", "--yes", "--force"]);
    assert_eq!(daemon.cli_json(&["space", "list"]), serde_json::json!([]));
    // A range the client has not read (nor read ahead) before.
    let mut gone = vec![0; 64 << 10];
    file.seek(SeekFrom::Start(24 * MIB)).unwrap();
    assert!(file.read_exact(&mut gone).is_err(), "a deleted space read");
    drop(file);
    fuse.detach_allowing(&["read: command failed: Input/output error"]);

    // Connections are counted until they close; then no force is needed.
    daemon.create_space("tank", "next", &["--layout", "mirror"], "32M");
    let fuse = FuseFile::attach(daemon.temp(), "next", &daemon.uri("next"));
    let open = |name: &str| {
        let shown = daemon.cli_json(&["space", "show", name]);
        shown["space"]["nbd_connections"].as_u64().unwrap()
    };
    assert!(open("next") >= 1);
    fuse.detach();
    wait_for("the connections to close", Duration::from_secs(30), || {
        (open("next") == 0).then_some(())
    });
    daemon.cli_ok(&["space", "delete", "next", "--yes"]);
    daemon.cli_ok(&["pool", "destroy", "tank", "--yes"]);
}

/// The holes of a half-written space, as qemu-img and nbdcopy see them:
/// `base:allocation` reports what was never written (and what was
/// written with zeroes) as zero holes, before and after a restart; a copy
/// with nbdcopy stores only the written bytes, `qemu-img convert` makes
/// an image near the written size, and both read back as the space.
#[test]
fn clients_see_the_holes_of_a_half_written_space() {
    if skip_without("holes", &["qemu-img", "qemu-io", "nbdcopy"]) {
        return;
    }
    let (mut daemon, spaces) = Daemon::with_every_layout("32M");
    // 4 MiB of data at 8 MiB; 1 MiB at 20 MiB written, then zeroed.
    for layout in LAYOUTS.iter() {
        run_ok(
            command("qemu-io")
                .args(["-f", "raw"])
                .arg(daemon.uri(layout.name))
                .args(["-c", "write -P 0x5a 8M 4M", "-c", "write -P 0x33 20M 1M"])
                .args(["-c", "write -z 20M 1M"]),
        );
    }
    let data_ranges = |daemon: &Daemon, name: &str| -> Vec<(u64, u64)> {
        let map = run_ok(
            command("qemu-img")
                .args(["map", "--output=json", "-f", "raw"])
                .arg(daemon.uri(name)),
        )
        .json();
        map.as_array()
            .unwrap_or_else(|| panic!("qemu-img map: {map}"))
            .iter()
            .filter(|extent| extent["data"].as_bool() == Some(true))
            .map(|extent| {
                let start = extent["start"].as_u64().expect("start");
                (start, start + extent["length"].as_u64().expect("length"))
            })
            .collect()
    };
    for restarted in [false, true] {
        if restarted {
            daemon.stop();
            daemon.restart();
        }
        for layout in LAYOUTS.iter() {
            let data = data_ranges(&daemon, layout.name);
            // Parity zeroes through its write path: those blocks are data.
            let expected = match layout.name.starts_with("parity") {
                true => vec![(8 * MIB, 12 * MIB), (20 * MIB, 21 * MIB)],
                false => vec![(8 * MIB, 12 * MIB)],
            };
            assert_eq!(
                data, expected,
                "{} (restarted: {restarted}): the data qemu-img map sees",
                layout.name
            );
        }
    }
    for (layout, space) in LAYOUTS.iter().zip(&spaces) {
        let size = size_of(space);
        let copy = daemon.temp().join(format!("{}.copy", layout.name));
        run_ok(command("nbdcopy").arg(daemon.uri(layout.name)).arg(&copy));
        let meta = std::fs::metadata(&copy).expect("copy");
        assert_eq!(meta.len(), size);
        let stored = std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
        assert!(
            stored <= 6 * MIB,
            "{}: nbdcopy stored {stored} bytes of a space with 4 MiB of data",
            layout.name
        );
        let image = daemon.temp().join(format!("{}.qcow2", layout.name));
        run_ok(
            command("qemu-img")
                .args(["convert", "-f", "raw", "-O", "qcow2"])
                .arg(daemon.uri(layout.name))
                .arg(&image),
        );
        let image_bytes = std::fs::metadata(&image).expect("image").len();
        assert!(
            image_bytes <= 6 * MIB,
            "{}: qemu-img convert made {image_bytes} bytes of 4 MiB of data",
            layout.name
        );
        for other in [&copy, &image] {
            let compare = run_ok(
                command("qemu-img")
                    .args(["compare", "-f", "raw"])
                    .arg(daemon.uri(layout.name))
                    .arg(other),
            );
            assert!(
                compare.stdout.contains("Images are identical"),
                "{}",
                compare.describe()
            );
        }
        let _ = std::fs::remove_file(&copy);
        let _ = std::fs::remove_file(&image);
    }
    daemon.stop();
}

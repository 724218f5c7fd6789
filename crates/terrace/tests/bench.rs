//! `terrace bench` from the command line: outputs (table, JSON to a file or
//! standard output, SVG), `space:` targets resolved through the daemon,
//! `engine:` targets imported by the command itself,
//! `bench merge`, and errors that name the target and say what to do.
//! Runs are a fraction of a second per point; nothing asserts a rate.

mod common;

use std::path::Path;
use std::process::Command;

use common::nbd::Connection;
use common::{random_bytes, run, run_ok, sparse_file, Daemon, MIB, TERRACE};
use serde_json::Value;

/// What makes a benchmark's points short, for tests.
const SHORT_POINTS: [&str; 5] = ["--no-progress", "--warmup", "0", "--duration", "100ms"];

/// `terrace bench` with short points.
fn bench(args: &[&str]) -> Command {
    let mut command = Command::new(TERRACE);
    command.arg("bench").args(SHORT_POINTS).args(args);
    command
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("report written")).expect("JSON")
}

/// The targets' names, in the report's order.
fn target_names(report: &Value) -> Vec<String> {
    report["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

fn point_keys(report: &Value) -> Vec<(String, String, u64)> {
    report["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| {
            (
                p["target"].as_str().unwrap().to_string(),
                p["profile"].as_str().unwrap().to_string(),
                p["outstanding"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn bench_a_file_and_a_stripe_writes_json_svg_and_table() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    sparse_file(&a, 8 * MIB);
    sparse_file(&b, 8 * MIB);
    let json = dir.path().join("out/report.json");
    let svg = dir.path().join("plots");
    let stripe = format!("raw={},{}", a.display(), b.display());
    let answer = run(
        bench(&["-p", "database", "-p", "seq:50:16K", "--depths", "1,4"])
            .arg("--size")
            .arg("4M")
            .arg("--json-file")
            .arg(&json)
            .arg("--svg")
            .arg(&svg)
            .arg("--table")
            .arg(format!("file={}", a.display()))
            .arg(&stripe),
    )
    .check();
    assert!(
        answer.stdout.contains("outstanding"),
        "{}",
        answer.describe()
    );
    assert!(answer
        .stdout
        .contains("database (random, 67 % read / 33 % write, 8 KiB)"));
    let report = read_json(&json);
    let mut expected = Vec::new();
    for target in ["file", "raw"] {
        for profile in ["database", "sequential:50:16K"] {
            for depth in [1, 4] {
                expected.push((target.to_string(), profile.to_string(), depth));
            }
        }
    }
    assert_eq!(point_keys(&report), expected);
    for target in report["targets"].as_array().unwrap() {
        assert_eq!(target["working_set_bytes"], 4 * MIB);
        assert_eq!(target["prefilled"], true);
    }
    for name in ["database.svg", "sequential-50-16K.svg"] {
        let text = std::fs::read_to_string(svg.join(name)).expect("svg written");
        assert!(text.trim_start().starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    }
}

#[test]
fn global_json_prints_the_report_on_standard_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a.img");
    sparse_file(&file, 4 * MIB);
    let answer = run(Command::new(TERRACE)
        .args(["--json", "bench", "--no-progress", "--warmup", "0"])
        .args(["--duration", "50ms", "-p", "restore", "--depths", "2"])
        .arg(&file))
    .check();
    let report: Value = serde_json::from_str(&answer.stdout).expect("stdout is the JSON report");
    assert_eq!(report["points"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        report["targets"][0]["prefilled"], false,
        "restore only writes"
    );
}

#[test]
fn merge_folds_runs_into_one_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a.img");
    sparse_file(&file, 4 * MIB);
    let mut runs = Vec::new();
    for (index, profile) in ["database", "database", "streaming"].iter().enumerate() {
        let json = dir.path().join(format!("run{index}.json"));
        run(
            bench(&["--prefill", "never", "-p", profile, "--depths", "1,2"])
                .arg("--destroy-data")
                .arg("--json-file")
                .arg(&json)
                .arg(format!("disk={}", file.display())),
        )
        .check();
        runs.push(json);
    }
    let merged = dir.path().join("merged.json");
    run(Command::new(TERRACE)
        .args(["bench", "merge"])
        .args(&runs)
        .arg("--json-file")
        .arg(&merged)
        .arg("--svg")
        .arg(dir.path().join("plots")))
    .check();
    let report = read_json(&merged);
    let keys = point_keys(&report);
    assert_eq!(
        keys.len(),
        4,
        "database twice folds into one series: {keys:?}"
    );
    assert!(dir.path().join("plots/streaming.svg").is_file());
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{}").unwrap();
    let answer = run(Command::new(TERRACE).args(["bench", "merge"]).arg(&bad));
    assert_eq!(answer.code(), Some(2), "{}", answer.describe());
    assert!(
        answer.stderr.contains("not a report"),
        "{}",
        answer.describe()
    );
}

#[test]
fn errors_name_the_target_and_say_what_to_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.img");
    let answer = run(&mut bench(&[&format!("gone={}", missing.display())]));
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    assert!(
        answer.stderr.contains("target gone") && answer.stderr.contains("does the path exist"),
        "{}",
        answer.describe()
    );

    let answer = run(&mut bench(&["-p", "fast", "x.img"]));
    assert_eq!(answer.code(), Some(2), "{}", answer.describe());
    assert!(
        answer.stderr.contains("random:70:8K"),
        "{}",
        answer.describe()
    );

    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let answer = run(&mut bench(&[empty.to_str().unwrap()]));
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    assert!(
        answer.stderr.contains("truncate -s"),
        "{}",
        answer.describe()
    );

    let file = dir.path().join("a.img");
    sparse_file(&file, MIB);
    let answer = run(&mut bench(&["--depths", "0", file.to_str().unwrap()]));
    assert_eq!(answer.code(), Some(2), "{}", answer.describe());
    assert!(
        answer.stderr.contains("outstanding I/Os"),
        "{}",
        answer.describe()
    );

    let answer = run(&mut bench(&[
        "--size",
        "2M",
        &format!("a={}", file.display()),
    ]));
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    assert!(answer.stderr.contains("target a"), "{}", answer.describe());
    assert!(
        answer.stderr.contains("larger than the target"),
        "{}",
        answer.describe()
    );

    let answer = run(Command::new(TERRACE)
        .arg("--control")
        .arg(dir.path().join("no-daemon.sock"))
        .args(["bench", "space:vm"]));
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    assert!(
        answer.stderr.contains("target space:vm") && answer.stderr.contains("terrace daemon"),
        "{}",
        answer.describe()
    );

    let answer = run(&mut bench(&["http://example.com/disk"]));
    assert_eq!(answer.code(), Some(2), "{}", answer.describe());
    assert!(answer.stderr.contains("nbd://"), "{}", answer.describe());
}

#[test]
fn a_space_of_the_daemon_is_measured_by_name() {
    let daemon = Daemon::start();
    let disks: Vec<String> = (0..2)
        .map(|i| {
            let path = daemon.root.join(format!("disks/d{i}.img"));
            sparse_file(&path, 256 * MIB);
            path.display().to_string()
        })
        .collect();
    let mut create = vec!["pool", "create", "tank", "--slab", "16M"];
    create.extend(disks.iter().map(String::as_str));
    daemon.cli_ok(&create);
    daemon.cli_ok(&[
        "space", "create", "tank", "vm", "--layout", "mirror", "--size", "32M",
    ]);
    let json = daemon.root.join("report.json");
    let answer = daemon.cli(&[
        "bench",
        "--no-progress",
        "--warmup",
        "0",
        "--duration",
        "100ms",
        "-p",
        "file-server",
        "--depths",
        "1,8",
        "--size",
        "8M",
        "--json-file",
        json.to_str().unwrap(),
        "space:vm",
        "named=space:vm@tank",
    ]);
    assert!(
        answer.success(),
        "{}\n{}",
        answer.describe(),
        daemon.log_tail()
    );
    let report = read_json(&json);
    assert_eq!(target_names(&report), ["space:vm", "named"]);
    for point in report["points"].as_array().unwrap() {
        assert!(point["ios"].as_u64().unwrap() > 0, "{point}");
        assert!(point["write_ios"].as_u64().unwrap() > 0, "{point}");
    }
    let answer = daemon.cli(&["bench", "space:nothing"]);
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    assert!(
        answer.stderr.contains("target space:nothing"),
        "{}",
        answer.describe()
    );
}

/// An `engine:` target imports the pool on the named disks (or folder) in
/// the command itself: refused while a daemon holds the pool, measured
/// once it is exported, with every write reaching the space, and the pool
/// closed so that the daemon imports it again whole.
#[test]
fn a_space_of_a_pool_on_its_disks_is_measured_in_process() {
    let daemon = Daemon::start();
    let disks = daemon.disk_files("local", 2, 256 * MIB);
    daemon.create_pool("tank", &disks, "16M");
    daemon.create_space("tank", "vm", &["--layout", "mirror"], "32M");
    daemon.create_space("tank", "other", &["--layout", "simple"], "16M");
    // Data beyond the benchmark's working set, to find again after it.
    let kept = random_bytes(11, 1024 * 1024);
    let mut connection = Connection::open(&daemon.nbd_socket, "vm");
    connection.write(16 * MIB, &kept, 0).expect("write");
    connection.flush().expect("flush");
    connection.disconnect();

    let folder = daemon.root.join("disks").display().to_string();
    let target = format!("engine:vm@{folder}");
    let held = run(&mut bench(&["-p", "restore", "--depths", "1", &target]));
    assert!(
        held.code() == Some(1)
            && held.stderr.contains("in use")
            && held.stderr.contains("export the pool"),
        "{}",
        held.describe()
    );

    daemon.cli_ok(&["pool", "export", "tank"]);
    let listed = disks
        .iter()
        .map(|disk| disk.display().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let missing = run(&mut bench(&[
        "--depths",
        "1",
        &format!("engine:nothing@{listed}"),
    ]));
    assert!(
        missing.code() == Some(1) && missing.stderr.contains("other, vm"),
        "{}",
        missing.describe()
    );
    let json = daemon.root.join("local.json");
    let answer = run(&mut bench(&[
        "-p",
        "file-server",
        "--depths",
        "1,8",
        "--size",
        "8M",
        "--json-file",
        json.to_str().unwrap(),
        &target,
        &format!("listed=engine:other@{listed}"),
    ]));
    assert!(answer.success(), "{}", answer.describe());
    let report = read_json(&json);
    assert_eq!(target_names(&report), [target.as_str(), "listed"]);
    for point in report["points"].as_array().unwrap() {
        assert!(point["write_ios"].as_u64().unwrap() > 0, "{point}");
    }

    let pool = daemon.cli_json(&["pool", "import", "--name", "tank", &folder]);
    assert_eq!(pool["state"], "ONLINE", "{pool}");
    let mut connection = Connection::open(&daemon.nbd_socket, "vm");
    assert!(
        connection.read(16 * MIB, kept.len() as u32).expect("read") == kept,
        "data beyond the working set changed"
    );
    connection.disconnect();
}

#[test]
fn paper_builds_the_machine_measures_every_space_and_writes_its_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (disks, ssds) = (dir.path().join("disks"), dir.path().join("ssd"));
    let report = dir.path().join("PAPER.md");
    let mut command = Command::new(TERRACE);
    command.args(["bench", "paper"]).args([
        "--dir",
        disks.to_str().unwrap(),
        "--ssd-dir",
        ssds.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
        "--layouts",
        "simple,parity",
        "--cache",
        "64M",
        "--space-size",
        "64M",
        "--hdd-size",
        "2G",
        "--ssd-size",
        "1G",
        "--depths",
        "1,4",
        "--warmup",
        "0ms",
        "--duration",
        "100ms",
    ]);
    run_ok(&mut command);

    // Every space × profile × depth measured, in the JSON beside the plots.
    let json = read_json(&dir.path().join("paper/paper.json"));
    let keys = point_keys(&json);
    let spaces = ["simple", "parity", "simple-wbc", "parity-wbc"];
    for space in spaces {
        for profile in [
            "file-copy",
            "file-server",
            "database",
            "streaming",
            "restore",
        ] {
            for depth in [1, 4] {
                assert!(
                    keys.contains(&(space.to_string(), profile.to_string(), depth)),
                    "{space} {profile} {depth} missing"
                );
            }
            assert!(dir.path().join(format!("paper/{profile}.svg")).exists());
        }
    }
    assert_eq!(keys.len(), spaces.len() * 5 * 2);

    // The report states its command, where the SSD files were, each
    // space, and the paper's findings beside this run's.
    let text = std::fs::read_to_string(&report).expect("report");
    assert!(text.contains("terrace bench"), "{text}");
    assert!(
        text.contains(&format!("sparse files in {}", ssds.display())),
        "the SSDs' folder is not stated"
    );
    for space in spaces {
        assert!(
            text.contains(&format!("| {space} |")),
            "{space} not in the report"
        );
    }
    assert!(text.contains("## Beside the paper's findings"));
    assert!(text.contains("## With a write-back cache"));

    // The disk files and the daemon's state are gone afterwards (no
    // --keep), wherever they were, and with them the folders made for them.
    for folder in [&disks, &ssds] {
        assert!(!folder.exists(), "{} left behind", folder.display());
    }
}

/// A pool of two files with a 2-way mirror `vm` of 32 MiB.
fn daemon_with_a_mirror() -> Daemon {
    let daemon = Daemon::start();
    let disks = daemon.disk_files("d", 2, 256 * MIB);
    daemon.create_pool("tank", &disks, "16M");
    daemon.create_space("tank", "vm", &["--layout", "mirror"], "32M");
    daemon
}

/// `terrace bench` with short points against the daemon's `space:vm`,
/// with `args` before the target.
fn bench_space(daemon: &Daemon, args: &[&str]) -> common::Run {
    let mut all = vec!["bench"];
    all.extend(SHORT_POINTS);
    all.extend(["--depths", "2", "--size", "8M"]);
    all.extend_from_slice(args);
    all.push("space:vm");
    daemon.cli(&all)
}

/// A space that an NBD client has open is not written over by a benchmark:
/// a run that writes is refused with the reason, changing nothing; one
/// that only reads runs, without prefill; `--destroy-data` runs anyway.
#[test]
fn a_space_open_by_a_client_is_not_written_over_unless_told() {
    let daemon = daemon_with_a_mirror();
    let mut client = Connection::open(&daemon.nbd_socket, "vm");
    let data = random_bytes(7, 8 * MIB as usize);
    client.write(0, &data, 0).expect("client write");
    client.flush().expect("client flush");
    let unchanged = |client: &mut Connection, after: &str| {
        let back = client.read(0, 8 * MIB as u32).expect("client read");
        assert!(back == data, "the client's data changed after {after}");
    };

    for profiles in [
        &["-p", "database"][..],
        &["-p", "streaming", "--prefill", "only"],
    ] {
        let answer = bench_space(&daemon, profiles);
        assert_eq!(answer.code(), Some(1), "{}", answer.describe());
        for needle in [
            "target space:vm",
            "open by 1 NBD connection",
            "nothing was written",
            "--destroy-data",
        ] {
            assert!(answer.stderr.contains(needle), "{}", answer.describe());
        }
        unchanged(&mut client, &format!("a refused {profiles:?}"));
    }

    let json = daemon.root.join("read.json");
    let answer = bench_space(
        &daemon,
        &["-p", "streaming", "--json-file", json.to_str().unwrap()],
    );
    assert!(answer.success(), "{}", answer.describe());
    assert!(
        answer.stderr.contains("no prefill"),
        "{}",
        answer.describe()
    );
    let report = read_json(&json);
    assert_eq!(report["targets"][0]["prefilled"], false);
    assert!(report["points"][0]["ios"].as_u64().unwrap() > 0);
    unchanged(&mut client, "a streaming run");

    let answer = bench_space(
        &daemon,
        &["--read-only", "--json-file", json.to_str().unwrap()],
    );
    assert!(answer.success(), "{}", answer.describe());
    let report = read_json(&json);
    let profiles: Vec<&str> = report["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        profiles,
        ["streaming"],
        "the standard profiles that only read"
    );
    unchanged(&mut client, "a --read-only run");

    let answer = bench_space(
        &daemon,
        &[
            "-p",
            "restore",
            "--destroy-data",
            "--json-file",
            json.to_str().unwrap(),
        ],
    );
    assert!(answer.success(), "{}", answer.describe());
    assert!(read_json(&json)["points"][0]["write_ios"].as_u64().unwrap() > 0);
    client.disconnect();
}

/// The daemon serves a benchmark's connections as the space's sole
/// writer: refused while another client has the space open (so none
/// slips in between the benchmark's look and its first write); the
/// sole writer's own connections do not count against each other.
#[test]
fn the_daemon_refuses_a_sole_writer_while_a_client_is_connected() {
    use common::nbd::{
        connect, go_payload, greeting, info_replies, send_option, FLAG_FIXED_NEWSTYLE, OPT_GO,
    };
    use std::io::Write;
    let daemon = daemon_with_a_mirror();
    let try_open = |export: &str| {
        let mut stream = connect(&daemon.nbd_socket);
        greeting(&mut stream);
        stream
            .write_all(&u32::from(FLAG_FIXED_NEWSTYLE).to_be_bytes())
            .expect("client flags");
        send_option(&mut stream, OPT_GO, &go_payload(export));
        info_replies(&mut stream, OPT_GO).map(|_| stream)
    };
    let first = try_open("sole-writer:vm").expect("a sole writer on an unused space");
    let second = try_open("sole-writer:tank/vm").expect("a second connection of the writer");
    let client = try_open("vm").expect("an ordinary client");
    assert!(
        try_open("sole-writer:vm").is_err(),
        "a sole writer is refused while a client is connected"
    );
    drop((first, second));
    assert!(try_open("sole-writer:vm").is_err());
    drop(client);
    common::wait_for(
        "the client's connection to end",
        std::time::Duration::from_secs(10),
        || try_open("sole-writer:vm").ok(),
    );
}

/// A file with data is refused by a run that writes, and left as it was;
/// a file with only a size (sparse) is measured; `--destroy-data` writes
/// over data.
#[test]
fn a_file_with_data_is_not_written_over_unless_told() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a.img");
    let data = random_bytes(3, 4 * MIB as usize);
    std::fs::write(&file, &data).unwrap();
    let answer = run(bench(&["-p", "database", "--depths", "1"]).arg(&file));
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    assert!(
        answer.stderr.contains("the file holds data") && answer.stderr.contains("--destroy-data"),
        "{}",
        answer.describe()
    );
    assert!(std::fs::read(&file).unwrap() == data, "the file changed");
    run(bench(&["-p", "streaming", "--depths", "1"]).arg(&file)).check();
    assert!(
        std::fs::read(&file).unwrap() == data,
        "a read-only run wrote"
    );
    run(bench(&["-p", "database", "--depths", "1", "--destroy-data"]).arg(&file)).check();
    assert!(
        std::fs::read(&file).unwrap() != data,
        "--destroy-data wrote"
    );

    let fresh = dir.path().join("fresh.img");
    sparse_file(&fresh, 4 * MIB);
    run(bench(&["-p", "database", "--depths", "1"]).arg(&fresh)).check();
}

/// A device holding a file system is refused by name, as `pool create`
/// names it, and nothing on it changes.
#[test]
fn a_device_with_a_file_system_is_named_and_not_written_over() {
    if common::skip_without("a device bench refusal", &["losetup", "mkfs.ext4"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("fs.img");
    sparse_file(&file, 64 * MIB);
    run_ok(
        common::command("mkfs.ext4")
            .args(["-q", "-F", "-L", "benchfs"])
            .arg(&file),
    );
    let before = std::fs::read(&file).unwrap();
    let device = common::LoopDevice::attach(&file);
    let answer = run(bench(&["-p", "database", "--depths", "1"]).arg(&device.device));
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    assert!(
        answer.stderr.contains("ext4 file system")
            && answer.stderr.contains("benchfs")
            && answer.stderr.contains("--destroy-data")
            && answer.stderr.matches(device.device.as_str()).count() == 1,
        "{}",
        answer.describe()
    );
    device.detach();
    assert!(
        std::fs::read(&file).unwrap() == before,
        "the device changed"
    );
}

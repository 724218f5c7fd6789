//! What the command line prints: progress off a terminal as plain lines,
//! `shutdown` in words, JSON that says null (never "") for what is absent,
//! the failures a mirror tolerates, and the benchmark's table on a terminal.

mod common;

use std::process::Command;

use common::{command, run, sparse_file, Daemon, MIB, TERRACE};
use serde_json::Value;

/// The paths of every empty string in `value`.
fn empty_strings(value: &Value, path: &str, found: &mut Vec<String>) {
    match value {
        Value::String(text) if text.is_empty() => found.push(path.to_string()),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                empty_strings(item, &format!("{path}[{index}]"), found);
            }
        }
        Value::Object(fields) => {
            for (name, field) in fields {
                empty_strings(field, &format!("{path}.{name}"), found);
            }
        }
        _ => {}
    }
}

/// A pool of four files with a 2-way and a 3-way mirror and a parity
/// space, and a job evacuating its last disk.
fn daemon_with_spaces_and_a_job() -> (Daemon, u64) {
    let daemon = Daemon::start();
    let disks = daemon.disk_files("d", 5, 256 * MIB);
    daemon.create_pool("tank", &disks, "16M");
    daemon.create_space("tank", "m2", &["--layout", "mirror", "--cache", "0"], "32M");
    daemon.create_space(
        "tank",
        "m3",
        &["--layout", "mirror", "--copies", "3", "--cache", "0"],
        "32M",
    );
    daemon.create_space("tank", "p", &["--layout", "parity", "--cache", "0"], "32M");
    let last = disks[4].to_str().unwrap();
    let job = daemon.cli_json(&["disk", "remove", "tank", last]);
    let id = job["id"].as_u64().expect("a job id");
    (daemon, id)
}

#[test]
fn json_says_null_for_what_is_absent_and_mirrors_their_tolerance() {
    let (daemon, _) = daemon_with_spaces_and_a_job();
    let disks: Vec<String> = (0..5)
        .map(|i| {
            daemon
                .root
                .join(format!("disks/d-{i}.img"))
                .display()
                .to_string()
        })
        .collect();
    let mut disk_list = vec!["disk", "list"];
    disk_list.extend(disks.iter().map(String::as_str));
    let spare = daemon.root.join("disks/spare.img");
    sparse_file(&spare, 256 * MIB);
    disk_list.push(spare.to_str().unwrap());
    for args in [
        &["pool", "status"][..],
        &["space", "list"],
        &["space", "show", "m2"],
        &["space", "show", "p"],
        &disk_list,
        &["job", "list"],
    ] {
        let json = daemon.cli_json(args);
        let mut found = Vec::new();
        empty_strings(&json, "", &mut found);
        assert!(found.is_empty(), "{args:?}: \"\" at {found:?}\n{json:#}");
    }

    for (space, copies) in [("m2", 2), ("m3", 3)] {
        let view = &daemon.cli_json(&["space", "show", space])["space"];
        assert_eq!(view["copies"], copies, "{view}");
        assert_eq!(view["failures_tolerated"], copies - 1, "{view}");
        assert_eq!(view["redundancy"], copies - 1, "{view}");
        assert_eq!(view["survives"], copies - 1, "{view}");
        let text = daemon.cli_ok(&["space", "list"]).stdout;
        let line = text
            .lines()
            .find(|line| line.split_whitespace().next() == Some(space))
            .unwrap_or_else(|| panic!("no line for {space} in:\n{text}"));
        let survives = format!("survives {}", copies - 1);
        assert!(line.contains(&survives), "{space}: {line}");
    }
}

/// `job wait` off a terminal prints plain lines: no carriage return, no
/// escape sequence, each line whole, the last one saying how it ended.
#[test]
fn job_wait_off_a_terminal_prints_plain_lines() {
    let (daemon, id) = daemon_with_spaces_and_a_job();
    let answer = daemon.cli_ok(&["job", "wait", &id.to_string()]);
    let text = &answer.stderr;
    assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty(), "{}", answer.describe());
    let prefix = format!("job {id} evacuate: ");
    for line in &lines {
        assert!(line.starts_with(&prefix), "{line:?} in {text:?}");
    }
    let last = lines.last().unwrap();
    assert!(
        last.starts_with(&format!("{prefix}100% ")) && last.ends_with(", done"),
        "{last:?}"
    );
}

#[test]
fn shutdown_answers_in_words() {
    let mut daemon = Daemon::start();
    let answer = daemon.cli_ok(&["shutdown"]);
    assert_eq!(
        answer.stdout,
        "the daemon is shutting down: it stops serving, closes its pools cleanly and exits\n"
    );
    common::wait_for(
        "the daemon to exit",
        std::time::Duration::from_secs(30),
        || (!daemon.is_running()).then_some(()),
    );
}

/// On a terminal, `terrace bench` prints its table even when it writes
/// JSON or plots as well; through a pipe, only what was asked.
#[test]
fn bench_prints_its_table_on_a_terminal() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a.img");
    sparse_file(&file, 4 * MIB);
    let args = format!(
        "{TERRACE} bench --no-progress --warmup 0 --duration 50ms --depths 1 -p restore \
         --destroy-data --json-file {} {}",
        dir.path().join("report.json").display(),
        file.display()
    );
    let answer = run(command("script").args(["-qec", &args, "/dev/null"])).check();
    assert!(
        answer.stdout.contains("outstanding"),
        "{}",
        answer.describe()
    );
    let answer = run(Command::new("sh").args(["-c", &args])).check();
    assert!(
        !answer.stdout.contains("outstanding"),
        "{}",
        answer.describe()
    );
}

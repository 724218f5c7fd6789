//! `terrace demo --exit`: the whole system on sparse files, in one command.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{run_with, TERRACE};

#[test]
fn demo_writes_loses_a_disk_and_verifies() {
    let dir = tempfile::Builder::new()
        .prefix("terrace-demo-")
        .tempdir()
        .expect("temp dir");
    let answer = run_with(
        Command::new(TERRACE)
            .arg("demo")
            .arg("--dir")
            .arg(dir.path())
            .args(["--data", "32M", "--listen", "127.0.0.1:0", "--exit"]),
        None,
        Duration::from_secs(300),
    )
    .check();
    let out = &answer.stdout;
    assert!(
        out.contains("verified"),
        "the demo did not say it verified the data\n{}",
        answer.describe()
    );
    assert!(
        out.contains("state: DEGRADED"),
        "the demo's pool status is not DEGRADED\n{}",
        answer.describe()
    );
    // The SSDs are journal disks and hold each space's write-back log:
    // two copies for the mirror, three for dual parity.
    for log in [
        "write-back cache: 256M (0% used, 0 dirty, 0 held in memory), log on disks 8, 9 (2 copies",
        "write-back cache: 256M (0% used, 0 dirty, 0 held in memory), log on disks 8, 9, 10 (3 copies",
    ] {
        assert!(out.contains(log), "no {log:?}\n{}", answer.describe());
    }
    for space in ["mirror", "parity"] {
        let lines = out
            .lines()
            .filter(|l| l.contains(&format!("{space}: read back and verified")))
            .count();
        assert_eq!(
            lines,
            2,
            "{space} verified before and after losing a disk\n{}",
            answer.describe()
        );
    }
    // Stopped cleanly: no socket left behind.
    assert!(
        !dir.path().join("control.sock").exists(),
        "control socket left behind"
    );
    assert!(
        !dir.path().join("nbd.sock").exists(),
        "NBD socket left behind"
    );
}

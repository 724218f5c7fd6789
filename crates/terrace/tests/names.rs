//! Names: a space's export name is fixed at its creation and never changes
//! under a client (not when another pool gets a space of the same name, not
//! across a restart, not when a pool with a clashing export is imported);
//! every command that takes a space takes `NAME@POOL`; an ambiguous name
//! says so; `space delete` refuses before it asks.

mod common;

use std::path::PathBuf;

use common::{command, random_bytes, run_ok, skip_without, Daemon, Run, MIB};
use serde_json::Value;
use terrace_export::client::NbdClient;

const SPACE_BYTES: usize = 16 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A daemon with pools `a` and `b`, three disks each.
fn two_pools() -> (Daemon, Vec<PathBuf>, Vec<PathBuf>) {
    let daemon = Daemon::start();
    let a = daemon.disk_files("a", 3, 256 * MIB);
    let b = daemon.disk_files("b", 3, 256 * MIB);
    daemon.create_pool("a", &a, "8M");
    daemon.create_pool("b", &b, "8M");
    (daemon, a, b)
}

/// `space create POOL NAME --layout simple --size 16M [MORE...]`.
fn create(daemon: &Daemon, pool: &str, name: &str, more: &[&str]) -> Run {
    let mut args = vec![
        "--json", "space", "create", pool, name, "--layout", "simple", "--size", "16M",
    ];
    args.extend_from_slice(more);
    daemon.cli(&args)
}

#[track_caller]
fn created(daemon: &Daemon, pool: &str, name: &str, more: &[&str]) -> Value {
    let answer = create(daemon, pool, name, more);
    assert!(answer.success(), "{}", answer.describe());
    answer.json()
}

/// Connect to `export` and write `data` at 0, flushed.
fn fill(daemon: &Daemon, export: &str, data: &[u8]) {
    runtime().block_on(async {
        let client = NbdClient::connect(&daemon.uri(export))
            .await
            .unwrap_or_else(|e| panic!("connect to {export}: {e}"));
        client.write(0, data, true).await.expect("write");
        client.disconnect().await.expect("disconnect");
    });
}

/// What a new connection to `export` reads at 0 (`length` bytes).
fn read_new(daemon: &Daemon, export: &str, length: usize) -> Vec<u8> {
    runtime().block_on(async {
        let client = NbdClient::connect(&daemon.uri(export))
            .await
            .unwrap_or_else(|e| panic!("connect to {export}: {e}"));
        let data = client.read(0, length as u32).await.expect("read");
        client.disconnect().await.expect("disconnect");
        data
    })
}

#[track_caller]
fn show(daemon: &Daemon, name: &str) -> Value {
    daemon.cli_json(&["space", "show", name])
}

#[track_caller]
fn assert_refused(answer: &Run, code: i32, mentions: &[&str]) {
    assert_eq!(answer.code(), Some(code), "{}", answer.describe());
    for mention in mentions {
        assert!(
            answer.stderr.contains(mention),
            "the message does not mention {mention:?}\n{}",
            answer.describe()
        );
    }
}

/// The export names `nbdinfo --list` shows.
fn listed(daemon: &Daemon) -> Vec<String> {
    let listing = run_ok(
        command("nbdinfo")
            .args(["--list", "--json"])
            .arg(daemon.uri("")),
    )
    .json();
    let mut names: Vec<String> = listing["exports"]
        .as_array()
        .unwrap_or_else(|| panic!("no exports in {listing}"))
        .iter()
        .map(|export| {
            export["export-name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn an_export_name_stays_with_its_space_when_another_pool_gets_that_name() {
    if skip_without("export names", &["nbdinfo"]) {
        return;
    }
    let (mut daemon, _, _) = two_pools();
    assert_eq!(created(&daemon, "a", "m2", &[])["export"], "m2");
    let data = random_bytes(1, SPACE_BYTES);
    fill(&daemon, "m2", &data);
    let runtime = runtime();
    let client = runtime
        .block_on(NbdClient::connect(&daemon.uri("m2")))
        .expect("connect to m2");

    // Pool b may not have a space whose export name is m2: refused,
    // nothing created, with how to give another.
    let refused = create(&daemon, "b", "m2", &[]);
    assert_refused(&refused, 1, &["m2", "taken", "pool a", "--export"]);
    assert_eq!(
        daemon.cli_json(&["space", "list", "b"]),
        Value::Array(vec![])
    );
    let invalid = create(&daemon, "b", "m2", &["--export", "no/slash"]);
    assert_refused(&invalid, 2, &["export name"]);
    let b = created(&daemon, "b", "m2", &["--export", "m2-b"]);
    assert_eq!(b["export"], "m2-b", "{b}");
    assert_eq!(b["export_not_served"], Value::Null, "{b}");

    // The client connected before reads what it wrote; so does a new one.
    let before = runtime
        .block_on(client.read(0, SPACE_BYTES as u32))
        .expect("read through the old connection");
    assert!(before == data, "the connection to m2 reads other data");
    assert!(read_new(&daemon, "m2", SPACE_BYTES) == data);
    assert!(read_new(&daemon, "m2-b", SPACE_BYTES) == vec![0; SPACE_BYTES]);
    assert!(read_new(&daemon, "a/m2", SPACE_BYTES) == data);
    runtime.block_on(client.disconnect()).expect("disconnect");
    assert_eq!(listed(&daemon), ["m2", "m2-b"]);

    let exports = |daemon: &Daemon| -> Vec<(String, String, String)> {
        let list = daemon.cli_json(&["space", "list"]);
        let mut found: Vec<(String, String, String)> = list
            .as_array()
            .expect("a list")
            .iter()
            .map(|space| {
                let field = |name: &str| space[name].as_str().unwrap_or_default().to_string();
                (field("pool"), field("name"), field("export"))
            })
            .collect();
        found.sort();
        found
    };
    let expected = vec![
        ("a".to_string(), "m2".to_string(), "m2".to_string()),
        ("b".to_string(), "m2".to_string(), "m2-b".to_string()),
    ];
    assert_eq!(exports(&daemon), expected);
    let text = daemon.cli_ok(&["space", "list"]).stdout;
    assert!(text.contains("m2-b"), "{text}");

    daemon.stop();
    daemon.restart();
    assert_eq!(exports(&daemon), expected, "after a restart");
    assert_eq!(show(&daemon, "m2@b")["space"]["export"], "m2-b");
    assert!(
        read_new(&daemon, "m2", SPACE_BYTES) == data,
        "after a restart"
    );
    assert_eq!(listed(&daemon), ["m2", "m2-b"]);
}

#[test]
fn every_space_command_takes_name_at_pool_and_an_ambiguous_name_says_so() {
    let (daemon, _, _) = two_pools();
    created(&daemon, "a", "m2", &[]);
    created(&daemon, "b", "m2", &["--export", "m2-b"]);

    for command in [
        vec!["space", "show", "m2"],
        vec!["space", "verify", "m2"],
        vec!["space", "resize", "m2", "--size", "32M"],
        vec!["space", "cache", "m2", "32M"],
        vec!["space", "delete", "m2", "--yes"],
    ] {
        let answer = daemon.cli(&command);
        assert_refused(
            &answer,
            2,
            &["space m2 is in pools a and b: use m2@a or m2@b"],
        );
    }

    let detail = show(&daemon, "m2@b");
    assert_eq!(detail["space"]["pool"], "b", "{detail}");
    assert_eq!(detail["space"]["export"], "m2-b", "{detail}");
    let text = daemon.cli_ok(&["space", "show", "m2@a"]).stdout;
    assert!(
        text.contains("(pool a)") && text.contains("export m2"),
        "{text}"
    );
    let verified = daemon.cli_json(&["space", "verify", "m2@b"]);
    assert_eq!(verified["space"], "m2", "{verified}");
    assert_eq!(verified["mismatched_rows"], 0, "{verified}");
    let resized = daemon.cli_json(&["space", "resize", "m2@b", "--size", "32M"]);
    assert_eq!(resized["size_bytes"], 32 * MIB, "{resized}");
    let cached = daemon.cli_json(&["space", "cache", "m2@b", "32M"]);
    assert_eq!(cached["cache"]["bytes"], 32 * MIB, "{cached}");
    assert_eq!(show(&daemon, "m2@a")["space"]["size_bytes"], 16 * MIB);
    assert_eq!(show(&daemon, "m2@a")["space"]["cache"], Value::Null);

    // A pool named both ways must be the same pool.
    let both = daemon.cli(&["space", "show", "m2@b", "--pool", "a"]);
    assert_refused(&both, 2, &["m2@b", "--pool"]);
    let nowhere = daemon.cli(&["space", "show", "m2@c"]);
    assert_refused(&nowhere, 1, &["no pool named c"]);

    daemon.cli_ok(&["space", "delete", "m2@b", "--yes"]);
    assert_eq!(
        daemon.cli_json(&["space", "list", "b"]),
        Value::Array(vec![])
    );
    // The name is no longer ambiguous.
    assert_eq!(show(&daemon, "m2")["space"]["pool"], "a");
}

/// No question asked: nothing on standard input, and the prompt not shown.
#[track_caller]
fn refused_without_prompt(answer: &Run, code: i32, mentions: &[&str]) {
    assert_refused(answer, code, mentions);
    assert!(
        !answer.stdout.contains("to confirm") && !answer.stderr.contains("not confirmed"),
        "asked before refusing\n{}",
        answer.describe()
    );
}

#[test]
fn space_delete_refuses_before_it_asks() {
    let (daemon, _, _) = two_pools();
    created(&daemon, "a", "m2", &[]);
    created(&daemon, "b", "m2", &["--export", "m2-b"]);

    let missing = daemon.cli(&["space", "delete", "nosuch"]);
    refused_without_prompt(&missing, 1, &["no space named nosuch"]);
    let ambiguous = daemon.cli(&["space", "delete", "m2"]);
    refused_without_prompt(&ambiguous, 2, &["m2@a or m2@b"]);

    let runtime = runtime();
    let client = runtime
        .block_on(NbdClient::connect(&daemon.uri("m2")))
        .expect("connect to m2");
    let busy = daemon.cli(&["space", "delete", "m2@a"]);
    refused_without_prompt(&busy, 1, &["open by 1 NBD connection", "--force"]);
    runtime.block_on(client.disconnect()).expect("disconnect");
    drop(client);

    // Not confirmed: asked, nothing deleted.
    let wrong = daemon.cli_input(&["space", "delete", "m2@a"], "m3\n");
    assert_refused(&wrong, 1, &["not confirmed"]);
    assert!(
        wrong.stdout.contains("Delete space m2 of pool a?"),
        "{}",
        wrong.describe()
    );
    // Confirmed by the space's name.
    let deleted = daemon.cli_input(&["space", "delete", "m2@a"], "m2\n");
    assert!(deleted.success(), "{}", deleted.describe());
    assert_eq!(
        daemon.cli_json(&["space", "list", "a"]),
        Value::Array(vec![])
    );
    assert_eq!(show(&daemon, "m2")["space"]["pool"], "b");
}

#[test]
fn an_imported_pool_does_not_take_over_an_export_name_already_served() {
    let (mut daemon, a, _) = two_pools();
    created(&daemon, "a", "m2", &[]);
    let data_a = random_bytes(2, SPACE_BYTES);
    fill(&daemon, "m2", &data_a);
    daemon.cli_ok(&["pool", "export", "a"]);
    // With pool a away, pool b may have m2.
    assert_eq!(created(&daemon, "b", "m2", &[])["export"], "m2");
    let data_b = random_bytes(3, SPACE_BYTES);
    fill(&daemon, "m2", &data_b);

    let paths: Vec<String> = a.iter().map(|p| p.display().to_string()).collect();
    let mut import = vec!["--json", "pool", "import"];
    import.extend(paths.iter().map(String::as_str));
    let imported = daemon.cli_ok(&import).json();
    let space = &imported["spaces"][0];
    assert_eq!(space["export"], "m2", "{imported}");
    let note = space["export_not_served"].as_str().unwrap_or_default();
    assert!(
        note.contains("not served") && note.contains("pool b") && note.contains("a/m2"),
        "{imported}"
    );

    let check = |daemon: &Daemon, when: &str| {
        assert!(read_new(daemon, "m2", SPACE_BYTES) == data_b, "m2 {when}");
        assert!(
            read_new(daemon, "a/m2", SPACE_BYTES) == data_a,
            "a/m2 {when}"
        );
        assert!(
            read_new(daemon, "b/m2", SPACE_BYTES) == data_b,
            "b/m2 {when}"
        );
        let status = daemon.cli_ok(&["pool", "status", "a"]).stdout;
        assert!(
            status.contains("m2 (not served)") && status.contains("a/m2"),
            "{when}: {status}"
        );
        let detail = daemon.cli_ok(&["space", "show", "m2@a"]).stdout;
        assert!(detail.contains("is not served"), "{when}: {detail}");
        assert_eq!(
            show(daemon, "m2@b")["space"]["export_not_served"],
            Value::Null,
            "{when}"
        );
    };
    check(&daemon, "after the import");
    daemon.stop();
    daemon.restart();
    check(&daemon, "after a restart");
}

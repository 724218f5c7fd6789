//! Real NBD clients against the server: libnbd's nbdinfo and nbdcopy,
//! qemu-io and qemu-img, fio's nbd engine. Each test starts its own server
//! on an ephemeral port (or a Unix socket) and skips with a note if its
//! tool is missing. Tool runs have time limits: a hang fails the test.

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use terrace_export::Server;
use tokio::sync::watch;

const LIMIT: Duration = Duration::from_secs(30);
const MIB: usize = 1 << 20;

/// The raw value of `"key": value` in nbdinfo's JSON (good enough for the
/// flat fields asserted here).
fn json_value(json: &str, key: &str) -> Option<String> {
    let start = json.find(&format!("\"{key}\": "))? + key.len() + 4;
    let rest = &json[start..];
    let end = match rest.strip_prefix('"') {
        Some(quoted) => quoted.find('"')? + 2,
        None => rest.find([',', '\n']).unwrap_or(rest.len()),
    };
    Some(rest[..end].trim().to_string())
}

/// A server with a writable "disk" of `size` bytes and a read-only
/// "archive".
async fn serve(size: usize, mode: Mode) -> (TestServer, Arc<MemoryBackend>, Arc<MemoryBackend>) {
    let disk = Arc::new(MemoryBackend::new(size));
    let archive = Arc::new(MemoryBackend::read_only(MIB));
    let catalog = MemoryCatalog::new(vec![("disk", disk.clone()), ("archive", archive.clone())]);
    (
        TestServer::start(catalog, mode.options()).await,
        disk,
        archive,
    )
}

async fn nbdinfo_json_reports_size_block_sizes_and_capabilities(mode: Mode) {
    if !have_tool("nbdinfo").await {
        return;
    }
    let (server, _, _) = serve(4 * MIB, mode).await;
    let output = run_tool("nbdinfo", &["--json", &server.uri("disk")], LIMIT).await;
    let json = text(&output);
    assert!(output.status.success(), "{json}");
    let expect = [
        ("export-size", "4194304"),
        ("block_size_minimum", "512"),
        ("block_size_preferred", "4096"),
        ("block_size_maximum", "33554432"),
        ("is_read_only", "false"),
        ("is_rotational", "false"),
        ("can_multi_conn", "true"),
        ("can_fua", "true"),
        ("can_flush", "true"),
        ("can_trim", "true"),
        ("can_zero", "true"),
        ("can_fast_zero", "true"),
        ("can_cache", "true"),
        ("can_df", "false"),
        ("structured", "true"),
        ("protocol", "\"newstyle-fixed\""),
        ("description", "\"memory, 4194304 bytes\""),
    ];
    for (key, value) in expect {
        assert_eq!(
            json_value(&json, key).as_deref(),
            Some(value),
            "{key} in {json}"
        );
    }
    assert!(json.contains("\"base:allocation\""), "{json}");
    server.stop().await;
}

async fn nbdinfo_list_shows_every_export(mode: Mode) {
    if !have_tool("nbdinfo").await {
        return;
    }
    let (server, _, _) = serve(4 * MIB, mode).await;
    let output = run_tool("nbdinfo", &["--list", "--json", &server.uri("")], LIMIT).await;
    let json = text(&output);
    assert!(output.status.success(), "{json}");
    assert!(json.contains("\"export-name\": \"disk\""), "{json}");
    assert!(json.contains("\"export-name\": \"archive\""), "{json}");
    assert!(
        json.contains("\"description\": \"memory, 1048576 bytes\""),
        "{json}"
    );
    assert!(json.contains("\"is_read_only\": true"), "{json}");
    server.stop().await;
}

async fn nbdinfo_map_follows_block_status(mode: Mode) {
    if !have_tool("nbdinfo").await {
        return;
    }
    let (server, disk, _) = serve(4 * MIB, mode).await;
    disk.fill(0, &[1; 8192]);
    disk.fill(MIB as u64, &[2; 4096]);
    let output = run_tool("nbdinfo", &["--map", &server.uri("disk")], LIMIT).await;
    assert!(output.status.success(), "{}", text(&output));
    let map: Vec<(u64, u64, u32)> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (
                fields[0].parse().unwrap(),
                fields[1].parse().unwrap(),
                fields[2].parse().unwrap(),
            )
        })
        .collect();
    let mib = MIB as u64;
    assert_eq!(
        map,
        vec![
            (0, 8192, 0),
            (8192, mib - 8192, 3),
            (mib, 4096, 0),
            (mib + 4096, 3 * mib - 4096, 3)
        ],
    );
    server.stop().await;
}

async fn nbdinfo_can_and_is_match_the_transmission_flags(mode: Mode) {
    if !have_tool("nbdinfo").await {
        return;
    }
    let (server, _, _) = serve(MIB, mode).await;
    // nbdinfo exits 0 for true, 2 for false.
    let cases = [
        ("disk", "--can", "flush", 0),
        ("disk", "--can", "fua", 0),
        ("disk", "--can", "trim", 0),
        ("disk", "--can", "zero", 0),
        ("disk", "--can", "fast-zero", 0),
        ("disk", "--can", "cache", 0),
        ("disk", "--can", "multi-conn", 0),
        ("disk", "--can", "structured-reply", 0),
        ("disk", "--can", "write", 0),
        ("disk", "--can", "df", 2),
        ("disk", "--is", "read-only", 2),
        ("disk", "--is", "rotational", 2),
        ("archive", "--is", "read-only", 0),
        ("archive", "--can", "write", 2),
        ("archive", "--can", "trim", 2),
        ("archive", "--can", "flush", 0),
    ];
    for (export, verb, property, expected) in cases {
        let output = run_tool("nbdinfo", &[verb, property, &server.uri(export)], LIMIT).await;
        assert_eq!(
            output.status.code(),
            Some(expected),
            "{export} {verb} {property}: {}",
            text(&output)
        );
    }
    server.stop().await;
}

async fn nbdinfo_over_a_unix_socket(mode: Mode) {
    if !have_tool("nbdinfo").await {
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("nbd.sock");
    let disk = Arc::new(MemoryBackend::new(2 * MIB));
    let server = Server::new(MemoryCatalog::new(vec![("disk", disk)]), mode.options());
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let (stop, shutdown) = watch::channel(false);
    let task = tokio::spawn(async move { server.serve_unix(listener, shutdown).await });

    let uri = format!("nbd+unix:///disk?socket={}", path.display());
    let output = run_tool("nbdinfo", &["--json", &uri], LIMIT).await;
    let json = text(&output);
    assert!(output.status.success(), "{json}");
    assert_eq!(
        json_value(&json, "export-size").as_deref(),
        Some("2097152"),
        "{json}"
    );

    stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

async fn qemu_io_writes_reads_zeroes_discards_and_flushes(mode: Mode) {
    if !have_tool("qemu-io").await {
        return;
    }
    let (server, disk, _) = serve(4 * MIB, mode).await;
    let commands = [
        "write -P 0xab 0 1M",
        "read -P 0xab 0 1M",
        "write -P 0x11 1M 64k",
        "write -z 1M 64k",
        "read -P 0 1M 64k",
        "write -f -P 0xcd 2M 4k",
        "read -P 0xcd 2M 4k",
        "write -P 0x22 3M 64k",
        "discard 3M 64k",
        "flush",
        "read -P 0xab 512 1536",
    ];
    let mut args = vec!["-f", "raw"];
    for command in &commands {
        args.extend(["-c", command]);
    }
    let uri = server.uri("disk");
    args.push(&uri);
    let output = run_tool("qemu-io", &args, LIMIT).await;
    let log = text(&output);
    assert!(output.status.success(), "{log}");
    let lower = log.to_lowercase();
    assert!(!lower.contains("fail") && !lower.contains("error"), "{log}");
    assert_eq!(log.matches("wrote ").count(), 5, "{log}");
    assert_eq!(log.matches("read ").count(), 4, "{log}");

    assert_eq!(disk.contents(0, MIB), vec![0xab; MIB]);
    assert_eq!(disk.contents(MIB as u64, 64 << 10), vec![0; 64 << 10]);
    assert_eq!(disk.contents(2 * MIB as u64, 4096), vec![0xcd; 4096]);
    let calls = disk.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.op == Op::Write && c.fua && c.offset == 2 * MIB as u64),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.op == Op::WriteZeroes && c.offset == MIB as u64),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.op == Op::Trim && c.offset == 3 * MIB as u64),
        "{calls:?}"
    );
    assert!(disk.count(Op::Flush) >= 1);
    server.stop().await;
}

async fn qemu_img_info_sees_the_size(mode: Mode) {
    if !have_tool("qemu-img").await {
        return;
    }
    let (server, _, _) = serve(4 * MIB, mode).await;
    let output = run_tool(
        "qemu-img",
        &["info", "--output=json", &server.uri("disk")],
        LIMIT,
    )
    .await;
    let json = text(&output);
    assert!(output.status.success(), "{json}");
    assert_eq!(
        json_value(&json, "virtual-size").as_deref(),
        Some("4194304"),
        "{json}"
    );
    server.stop().await;
}

async fn nbdcopy_round_trips_random_data(mode: Mode) {
    if !have_tool("nbdcopy").await {
        return;
    }
    let size = 8 * MIB;
    let (server, disk, _) = serve(size, mode).await;
    let directory = tempfile::tempdir().unwrap();
    let source = directory.path().join("source.img");
    let copy = directory.path().join("copy.img");
    let data = pseudo_random(size, 7);
    std::fs::write(&source, &data).unwrap();
    std::fs::write(&copy, []).unwrap();

    let (source_path, copy_path) = (source.to_str().unwrap(), copy.to_str().unwrap());
    let output = run_tool("nbdcopy", &[source_path, &server.uri("disk")], LIMIT).await;
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        disk.contents(0, size) == data,
        "the export does not hold the copied bytes"
    );
    let output = run_tool("nbdcopy", &[&server.uri("disk"), copy_path], LIMIT).await;
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        std::fs::read(&copy).unwrap() == data,
        "the copy back differs"
    );
    if have_tool("sha256sum").await {
        let output = run_tool("sha256sum", &[source_path, copy_path], LIMIT).await;
        let sums: Vec<String> = String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|line| line.split_whitespace().next().unwrap().to_string())
            .collect();
        assert_eq!(sums.len(), 2);
        assert_eq!(sums[0], sums[1]);
    }
    server.stop().await;
}

async fn fio_random_read_write_with_verification(mode: Mode) {
    if !have_tool("fio").await {
        return;
    }
    // Every operation takes a little while, as a disk's would, so that
    // requests the server runs at once overlap whatever the scheduling.
    let disk = Arc::new(MemoryBackend::build(
        16 * MIB,
        false,
        |_, _| Duration::from_micros(300),
        |_| None,
    ));
    let catalog = MemoryCatalog::new(vec![("disk", disk.clone())]);
    let server = TestServer::start(catalog, mode.options()).await;
    let uri = format!("--uri={}", server.uri("disk"));
    let args = [
        "--name=nbd-randrw",
        "--ioengine=nbd",
        uri.as_str(),
        "--rw=randrw",
        "--bs=4k",
        "--iodepth=32",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--size=16M",
    ];
    let output = run_tool("fio", &args, Duration::from_secs(50)).await;
    let log = text(&output);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("err= 0"), "{log}");
    assert!(
        !log.to_lowercase().contains("verify: bad") && !log.contains("crc32c: verify failed"),
        "{log}"
    );
    assert!(disk.count(Op::Write) > 100 && disk.count(Op::Read) > 100);
    assert!(
        disk.most_running() > 1,
        "fio's queue depth reached the backend"
    );
    server.stop().await;
}

in_both_modes!(
    nbdinfo_json_reports_size_block_sizes_and_capabilities,
    nbdinfo_list_shows_every_export,
    nbdinfo_map_follows_block_status,
    nbdinfo_can_and_is_match_the_transmission_flags,
    nbdinfo_over_a_unix_socket,
    qemu_io_writes_reads_zeroes_discards_and_flushes,
    qemu_img_info_sees_the_size,
    nbdcopy_round_trips_random_data,
    fio_random_read_write_with_verification,
);

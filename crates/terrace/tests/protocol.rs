//! The daemon's NBD server against clients that misbehave, over the Unix
//! socket with raw bytes: it refuses what is wrong, answers errors with the
//! protocol's error values, and keeps serving everyone else.

mod common;

use std::io::Write;
use std::time::Duration;

use common::nbd::*;
use common::{random_bytes, Daemon, GIB, MIB};

const SPACE_BYTES: u64 = 64 * MIB;

fn daemon_with_space() -> Daemon {
    let daemon = Daemon::start();
    let disks = daemon.disk_files("proto", 4, GIB);
    daemon.create_pool("proto", &disks, "16M");
    daemon.create_space(
        "proto",
        "vol",
        &["--layout", "parity", "--redundancy", "1"],
        "64M",
    );
    daemon.create_space("proto", "other", &["--layout", "mirror"], "32M");
    daemon
}

/// The daemon still runs, and a well-behaved client can write and read
/// (on a connection opened before the abuse, and on a new one).
#[track_caller]
fn still_serving(daemon: &mut Daemon, bystander: &mut Connection, when: &str) {
    assert!(
        daemon.is_running(),
        "the daemon died {when}\n{}",
        daemon.log_tail()
    );
    let data = random_bytes(when.len() as u64, 64 * 1024);
    bystander
        .write(8 * MIB, &data, 0)
        .unwrap_or_else(|e| panic!("bystander write {when}: error {e}"));
    let read = bystander
        .read(8 * MIB, 64 * 1024)
        .unwrap_or_else(|e| panic!("bystander read {when}: error {e}"));
    assert!(read == data, "bystander read back other data {when}");
    let mut fresh = Connection::open(&daemon.nbd_socket, "vol");
    let read = fresh
        .read(8 * MIB, 64 * 1024)
        .unwrap_or_else(|e| panic!("new client read {when}: error {e}"));
    assert!(read == data, "a new client read other data {when}");
    fresh.disconnect();
    daemon.cli_ok(&["status"]);
}

#[test]
fn handshake_advertises_the_space() {
    let mut daemon = daemon_with_space();
    let connection = Connection::open(&daemon.nbd_socket, "vol");
    let info = connection.info;
    assert_eq!(info.size, SPACE_BYTES);
    let wanted = TRANSMIT_HAS_FLAGS
        | TRANSMIT_SEND_FLUSH
        | TRANSMIT_SEND_FUA
        | TRANSMIT_SEND_TRIM
        | TRANSMIT_SEND_WRITE_ZEROES
        | TRANSMIT_CAN_MULTI_CONN;
    assert_eq!(
        info.flags & wanted,
        wanted,
        "transmission flags {:#x}",
        info.flags
    );
    assert_eq!(
        info.flags & TRANSMIT_READ_ONLY,
        0,
        "read-only flag set: {:#x}",
        info.flags
    );
    let (minimum, preferred, maximum) = info.block_sizes.expect("NBD_INFO_BLOCK_SIZE sent");
    assert_eq!(minimum, 512);
    assert!(
        preferred.is_power_of_two() && preferred >= minimum && preferred <= maximum,
        "preferred {preferred}"
    );
    assert_eq!(maximum, 32 << 20);
    connection.disconnect();

    // NBD_OPT_LIST names both spaces.
    let mut stream = connect(&daemon.nbd_socket);
    greeting(&mut stream);
    stream
        .write_all(&u32::from(FLAG_FIXED_NEWSTYLE).to_be_bytes())
        .unwrap();
    send_option(&mut stream, OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let reply = option_reply(&mut stream);
        assert_eq!(reply.option, OPT_LIST);
        match reply.reply {
            REP_SERVER => {
                let length = u32::from_be_bytes(reply.data[0..4].try_into().unwrap()) as usize;
                names.push(String::from_utf8_lossy(&reply.data[4..4 + length]).into_owned());
            }
            REP_ACK => break,
            other => panic!("NBD_OPT_LIST reply {other:#x}"),
        }
    }
    names.sort();
    assert_eq!(names, ["other", "vol"]);
    send_option(&mut stream, OPT_ABORT, &[]);
    drop(stream);
    daemon.stop();
}

#[test]
fn bad_handshakes_are_closed_and_others_still_served() {
    let mut daemon = daemon_with_space();
    let mut bystander = Connection::open(&daemon.nbd_socket, "vol");

    // Garbage instead of a handshake: an HTTP request.
    let mut stream = connect(&daemon.nbd_socket);
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let received = wait_closed(&mut stream).unwrap_or_else(|e| panic!("garbage handshake: {e}"));
    assert!(
        received <= 18 + 124,
        "the server answered garbage with {received} bytes"
    );
    still_serving(&mut daemon, &mut bystander, "after a garbage handshake");

    // Unknown client flags.
    let mut stream = connect(&daemon.nbd_socket);
    greeting(&mut stream);
    stream.write_all(&0xffff_ffffu32.to_be_bytes()).unwrap();
    wait_closed(&mut stream).unwrap_or_else(|e| panic!("unknown client flags: {e}"));
    still_serving(&mut daemon, &mut bystander, "after unknown client flags");

    // Right flags, then an option with the wrong magic.
    let mut stream = connect(&daemon.nbd_socket);
    greeting(&mut stream);
    stream
        .write_all(&u32::from(FLAG_FIXED_NEWSTYLE).to_be_bytes())
        .unwrap();
    stream
        .write_all(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    wait_closed(&mut stream).unwrap_or_else(|e| panic!("bad option magic: {e}"));
    still_serving(&mut daemon, &mut bystander, "after a bad option magic");

    // An option claiming 4 GiB of data: refused or closed, never buffered.
    let mut stream = connect(&daemon.nbd_socket);
    greeting(&mut stream);
    stream
        .write_all(&u32::from(FLAG_FIXED_NEWSTYLE).to_be_bytes())
        .unwrap();
    let mut header = Vec::new();
    header.extend_from_slice(&IHAVEOPT.to_be_bytes());
    header.extend_from_slice(&OPT_GO.to_be_bytes());
    header.extend_from_slice(&u32::MAX.to_be_bytes());
    stream.write_all(&header).unwrap();
    let _ = stream.write_all(&[0u8; 4096]);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = wait_closed(&mut stream);
    still_serving(&mut daemon, &mut bystander, "after a 4 GiB option");

    // Disconnect in the middle of the greeting and of an option.
    let stream = connect(&daemon.nbd_socket);
    drop(stream);
    let mut stream = connect(&daemon.nbd_socket);
    greeting(&mut stream);
    stream
        .write_all(&u32::from(FLAG_FIXED_NEWSTYLE).to_be_bytes())
        .unwrap();
    stream.write_all(&IHAVEOPT.to_be_bytes()[..5]).unwrap();
    drop(stream);
    still_serving(
        &mut daemon,
        &mut bystander,
        "after disconnects in the handshake",
    );

    bystander.disconnect();
    daemon.stop();
}

#[test]
fn unknown_options_and_exports_are_refused_then_go_works() {
    let mut daemon = daemon_with_space();
    let mut stream = connect(&daemon.nbd_socket);
    let flags = greeting(&mut stream);
    stream
        .write_all(&u32::from(FLAG_FIXED_NEWSTYLE | (flags & FLAG_NO_ZEROES)).to_be_bytes())
        .unwrap();

    send_option(&mut stream, 0x4242, b"whatever");
    let reply = option_reply(&mut stream);
    assert_eq!(
        (reply.option, reply.reply),
        (0x4242, REP_ERR_UNSUP),
        "unknown option"
    );

    send_option(&mut stream, OPT_INFO, &go_payload("no-such-space"));
    let refused = info_replies(&mut stream, OPT_INFO);
    assert_eq!(
        refused.err(),
        Some(REP_ERR_UNKNOWN),
        "NBD_OPT_INFO on an unknown export"
    );
    send_option(&mut stream, OPT_GO, &go_payload("no-such-space"));
    let refused = info_replies(&mut stream, OPT_GO);
    assert_eq!(
        refused.err(),
        Some(REP_ERR_UNKNOWN),
        "NBD_OPT_GO on an unknown export"
    );

    send_option(&mut stream, OPT_INFO, &go_payload("vol"));
    let info = info_replies(&mut stream, OPT_INFO).expect("NBD_OPT_INFO vol");
    assert_eq!(info.size, SPACE_BYTES);

    // Still in the handshake: NBD_OPT_GO works after all of that.
    let mut connection = Connection::go(stream, "vol");
    assert_eq!(connection.info.size, SPACE_BYTES);
    let data = random_bytes(3, 4096);
    connection.write(0, &data, 0).expect("write after GO");
    assert!(connection.read(0, 4096).expect("read after GO") == data);
    connection.disconnect();
    daemon.stop();
}

#[test]
fn bad_requests_get_error_values_and_the_connection_goes_on() {
    let mut daemon = daemon_with_space();
    let mut connection = Connection::open(&daemon.nbd_socket, "vol");
    let size = connection.info.size;
    let data = random_bytes(5, 8192);
    connection
        .write(size - 8192, &data, 0)
        .expect("write the last 8 KiB");

    // Reads beyond the end: EINVAL, and no payload follows.
    assert_eq!(
        connection.read(size - 4096, 8192),
        Err(EINVAL),
        "read across the end"
    );
    assert_eq!(connection.read(size, 512), Err(EINVAL), "read at the end");
    assert_eq!(
        connection.read(u64::MAX - 511, 512),
        Err(EINVAL),
        "read whose end overflows"
    );
    assert!(
        connection
            .read(size - 8192, 8192)
            .expect("read after errors")
            == data
    );

    // Writes beyond the end: ENOSPC; the payload is consumed, not taken as
    // requests, and nothing in range changes.
    assert_eq!(
        connection.write(size - 4096, &[0x55; 8192], 0),
        Err(ENOSPC),
        "write across the end"
    );
    assert_eq!(
        connection.write(size + 4096, &[0x55; 4096], 0),
        Err(ENOSPC),
        "write past the end"
    );
    assert!(
        connection
            .read(size - 8192, 8192)
            .expect("read after write errors")
            == data
    );

    // Write zeroes beyond the end: ENOSPC; trim beyond the end: EINVAL.
    assert_eq!(
        connection.command(CMD_WRITE_ZEROES, size - 4096, 8192),
        Err(ENOSPC),
        "write zeroes across the end"
    );
    assert_eq!(
        connection.command(CMD_TRIM, size - 4096, 8192),
        Err(EINVAL),
        "trim across the end"
    );

    // Unknown command: EINVAL.
    assert_eq!(
        connection.command(0x55, 0, 4096),
        Err(EINVAL),
        "unknown command"
    );
    assert!(
        connection
            .read(size - 8192, 8192)
            .expect("read after an unknown command")
            == data
    );

    // Many requests in flight: every one answered, by cookie.
    let mut cookies = std::collections::BTreeSet::new();
    for index in 0..64u64 {
        cookies.insert(connection.send(CMD_READ, 0, index * 65536, 65536, &[]));
    }
    for _ in 0..64 {
        match connection.outcome() {
            Outcome::Reply { error: 0, cookie } => {
                assert!(
                    cookies.remove(&cookie),
                    "reply for unknown or repeated cookie {cookie}"
                );
                read_exact(&mut connection.stream, 65536).expect("read payload");
            }
            other => panic!("pipelined read: {other:?}"),
        }
    }
    connection.flush().expect("flush");
    connection.disconnect();
    daemon.stop();
}

#[test]
fn oversized_requests_are_refused_and_others_still_served() {
    let mut daemon = daemon_with_space();
    let mut bystander = Connection::open(&daemon.nbd_socket, "other");
    // Bystander of the same space as the abuse, too.
    let mut neighbour = Connection::open(&daemon.nbd_socket, "vol");

    // A write larger than the advertised 32 MiB maximum payload.
    let mut connection = Connection::open(&daemon.nbd_socket, "vol");
    let maximum = connection.info.block_sizes.expect("block sizes").2;
    let length = maximum + 4096;
    let cookie = connection.send(CMD_WRITE, 0, 0, length, &[]);
    let payload = vec![0x33u8; length as usize];
    connection
        .stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = connection.stream.write_all(&payload); // the server may close instead of reading it
    match connection.outcome() {
        Outcome::Closed => {}
        Outcome::Reply { error, cookie: got } => {
            assert_eq!(got, cookie);
            assert_ne!(
                error, 0,
                "a write of {length} bytes (maximum {maximum}) succeeded"
            );
            // Still open: it must have skipped the payload, not parsed it.
            if let Ok(cookie) = connection.try_send(CMD_READ, 0, 0, 4096, &[]) {
                match connection.outcome() {
                    Outcome::Closed => {}
                    Outcome::Reply { error, cookie: got } => {
                        assert_eq!((error, got), (0, cookie), "read after an oversized write");
                    }
                }
            }
        }
    }
    drop(connection);
    still_serving(&mut daemon, &mut neighbour, "after an oversized write");

    // A read larger than the maximum payload.
    let mut connection = Connection::open(&daemon.nbd_socket, "vol");
    let cookie = connection.send(CMD_READ, 0, 0, 64 << 20, &[]);
    match connection.outcome() {
        Outcome::Closed => {}
        Outcome::Reply { error, cookie: got } => {
            assert_eq!(got, cookie);
            assert_ne!(error, 0, "a read of 64 MiB (maximum {maximum}) succeeded");
        }
    }
    drop(connection);
    still_serving(&mut daemon, &mut neighbour, "after an oversized read");
    bystander.read(0, 4096).expect("bystander of another space");

    // A truncated request header, then disconnect.
    let mut connection = Connection::open(&daemon.nbd_socket, "vol");
    connection
        .stream
        .write_all(&REQUEST_MAGIC.to_be_bytes())
        .unwrap();
    connection.stream.write_all(&[0, 0, 0, 1, 0, 0]).unwrap();
    drop(connection);
    still_serving(&mut daemon, &mut neighbour, "after a truncated request");

    // Disconnect in the middle of a write payload.
    let mut connection = Connection::open(&daemon.nbd_socket, "vol");
    connection.send(CMD_WRITE, 0, 16 * MIB, MIB as u32, &[]);
    connection.stream.write_all(&vec![0x44u8; 100_000]).unwrap();
    drop(connection);
    still_serving(
        &mut daemon,
        &mut neighbour,
        "after a disconnect mid-payload",
    );

    // Many connections at once, all dropped without a goodbye.
    let many: Vec<Connection> = (0..32)
        .map(|_| Connection::open(&daemon.nbd_socket, "vol"))
        .collect();
    drop(many);
    still_serving(
        &mut daemon,
        &mut neighbour,
        "after 32 abandoned connections",
    );

    bystander.disconnect();
    neighbour.disconnect();
    daemon.stop();
}

#[test]
fn a_pool_imported_read_only_serves_read_only_exports() {
    let mut daemon = daemon_with_space();
    let mut connection = Connection::open(&daemon.nbd_socket, "vol");
    let data = random_bytes(21, 65536);
    connection.write(MIB, &data, 0).expect("write");
    connection.flush().expect("flush");
    connection.disconnect();

    daemon.cli_ok(&["pool", "export", "proto"]);
    let folder = daemon.root.join("disks").display().to_string();
    let pool = daemon.cli_json(&["pool", "import", "--name", "proto", "--read-only", &folder]);
    assert_eq!(pool["state"], "READ-ONLY", "{pool}");

    let mut connection = Connection::open(&daemon.nbd_socket, "vol");
    assert_ne!(
        connection.info.flags & TRANSMIT_READ_ONLY,
        0,
        "read-only flag not set: {:#x}",
        connection.info.flags
    );
    assert!(connection.read(MIB, 65536).expect("read") == data);
    assert_eq!(
        connection.write(MIB, &[0u8; 4096], 0),
        Err(EPERM),
        "write to a read-only export"
    );
    assert_eq!(
        connection.command(CMD_TRIM, MIB, 4096),
        Err(EPERM),
        "trim on a read-only export"
    );
    assert!(
        connection
            .read(MIB, 65536)
            .expect("read after refused writes")
            == data
    );
    connection.disconnect();
    daemon.stop();
}

/// NBD_CMD_TRIM and NBD_CMD_WRITE_ZEROES carry no payload: the advertised
/// maximum payload (32 MiB) does not bound them, and the daemon takes them
/// at any length up to the export's size — 512 MiB, then the whole export
/// — on single parity (its write-back log holding some of the data) and
/// on a mirror. Zeroed ranges read back as zeroes, the rest as written;
/// a mirror's trimmed whole rows too.
#[test]
fn trims_and_zeroing_of_any_length_up_to_the_export_size_are_taken() {
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("large", 4, 2 * GIB);
    daemon.create_pool("large", &disks, "64M");
    let parity = ["--layout", "parity", "--redundancy", "1"];
    daemon.create_space("large", "parity", &parity, "1G");
    daemon.create_space("large", "mirror", &["--layout", "mirror"], "1G");
    for export in ["parity", "mirror"] {
        let mut connection = Connection::open(&daemon.nbd_socket, export);
        let size = connection.info.size;
        assert_eq!(size, GIB);
        let maximum = connection.info.block_sizes.expect("block sizes").2;
        assert!(u64::from(maximum) < 512 * MIB);
        // Marks at the edges of the ranges zeroed below, and beyond them.
        let marks = [
            0,
            100 * MIB,
            256 * MIB - 4096,
            256 * MIB,
            768 * MIB,
            size - 4096,
        ];
        let write_marks = |connection: &mut Connection| {
            for (index, &offset) in marks.iter().enumerate() {
                let data = random_bytes(index as u64 + 1, 4096);
                connection.write(offset, &data, 0).expect("write a mark");
            }
        };
        let check_marks =
            |connection: &mut Connection, zeroed: &dyn Fn(u64) -> bool, when: &str| {
                for (index, &offset) in marks.iter().enumerate() {
                    let read = connection.read(offset, 4096).expect("read a mark");
                    let wanted = if zeroed(offset) {
                        vec![0u8; 4096]
                    } else {
                        random_bytes(index as u64 + 1, 4096)
                    };
                    assert!(read == wanted, "{export}: mark at {offset} {when}");
                }
            };
        write_marks(&mut connection);
        let half = (512 * MIB) as u32;
        assert_eq!(
            connection.command(CMD_WRITE_ZEROES, 256 * MIB, half),
            Ok(()),
            "{export}: write zeroes of 512 MiB"
        );
        let inside = |offset: u64| (256 * MIB..768 * MIB).contains(&offset);
        check_marks(&mut connection, &inside, "after zeroing 512 MiB");
        assert_eq!(
            connection.command(CMD_TRIM, 256 * MIB, half),
            Ok(()),
            "{export}: trim of 512 MiB"
        );
        check_marks(&mut connection, &inside, "after trimming 512 MiB");
        assert_eq!(
            connection.command(CMD_WRITE_ZEROES, 0, size as u32),
            Ok(()),
            "{export}: write zeroes of the whole export"
        );
        check_marks(&mut connection, &|_| true, "after zeroing it whole");
        write_marks(&mut connection);
        assert_eq!(
            connection.command(CMD_TRIM, 0, size as u32),
            Ok(()),
            "{export}: trim of the whole export"
        );
        if export == "mirror" {
            // A trim of whole rows of a space without a log reads back as
            // zeroes (a log keeps what it holds: trims are advisory).
            check_marks(&mut connection, &|_| true, "after trimming it whole");
        }
        connection.flush().expect("flush");
        connection.disconnect();
    }
    daemon.assert_log_clean(&[]);
    daemon.stop();
}

//! Reading ahead of a sequential stream, and of a range a client hints at
//! (`NBD_CMD_CACHE`), over NBD: the reads come back right, and a write,
//! zeroing or trim of a range already read ahead, on the stream's own
//! connection or another, is what later reads return.

mod common;

use common::nbd::*;
use common::{random_bytes, Daemon, GIB, MIB};

const STEP: u64 = 64 << 10;

/// Read `[from, to)` as a stream of 64 KiB reads and check it against
/// `model`.
#[track_caller]
fn stream(connection: &mut Connection, model: &[u8], from: u64, to: u64, what: &str) {
    for offset in (from..to).step_by(STEP as usize) {
        let read = connection
            .read(offset, STEP as u32)
            .unwrap_or_else(|e| panic!("{what}: read at {offset}: error {e}"));
        let want = &model[offset as usize..(offset + STEP) as usize];
        assert!(read == want, "{what}: other data at {offset}");
    }
}

/// Write `data` at `offset` on `connection`, and into `model`.
#[track_caller]
fn change(connection: &mut Connection, model: &mut [u8], offset: u64, data: Vec<u8>) {
    connection.write(offset, &data, 0).unwrap();
    model[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
}

#[test]
fn changes_on_any_connection_reach_a_stream_read_ahead() {
    let daemon = Daemon::start();
    let disks = daemon.disk_files("ahead", 4, GIB);
    daemon.create_pool("ahead", &disks, "16M");
    for (space, layout) in [
        ("simple", &["--layout", "simple"][..]),
        ("mirror", &["--layout", "mirror"][..]),
        ("parity", &["--layout", "parity", "--cache", "0"][..]),
    ] {
        daemon.create_space("ahead", space, layout, "64M");
        let mut reader = Connection::open(&daemon.nbd_socket, space);
        let mut writer = Connection::open(&daemon.nbd_socket, space);
        let mut model = random_bytes(space.len() as u64, 16 * MIB as usize);
        for (i, piece) in model.chunks(MIB as usize).enumerate() {
            writer.write(i as u64 * MIB, piece, 0).unwrap();
        }
        // Far enough that the stream is read ahead by megabytes.
        stream(&mut reader, &model, 0, 2 * MIB, space);
        // Inside the chunks read ahead, by the other connection and by the
        // stream's own, block-aligned or not.
        change(
            &mut writer,
            &mut model,
            3 * MIB + 4096,
            random_bytes(1, 8192),
        );
        change(
            &mut reader,
            &mut model,
            4 * MIB + 100,
            random_bytes(2, 5000),
        );
        writer
            .command(CMD_WRITE_ZEROES, 5 * MIB, 256 << 10)
            .unwrap();
        model[(5 * MIB) as usize..(5 * MIB + (256 << 10)) as usize].fill(0);
        // Whole rows of a space on sparse files, trimmed: holes, zeroes.
        writer.command(CMD_TRIM, 6 * MIB, 1 << 20).unwrap();
        model[(6 * MIB) as usize..(7 * MIB) as usize].fill(0);
        stream(&mut reader, &model, 2 * MIB, 12 * MIB, space);
        // A hinted range (NBD_CMD_CACHE), then changed inside before and
        // after it is read.
        writer.command(CMD_CACHE, 13 * MIB, 2 << 20).unwrap();
        change(
            &mut writer,
            &mut model,
            13 * MIB + 8192,
            random_bytes(3, 4096),
        );
        stream(&mut reader, &model, 13 * MIB, 14 * MIB, space);
        change(
            &mut writer,
            &mut model,
            14 * MIB + 65536,
            random_bytes(4, 4096),
        );
        stream(&mut reader, &model, 14 * MIB, 15 * MIB, space);
        // And a stream over the ranges written before any read-ahead.
        let mut again = Connection::open(&daemon.nbd_socket, space);
        stream(&mut again, &model, 0, 16 * MIB, space);
        again.disconnect();
        reader.disconnect();
        writer.disconnect();
    }
}

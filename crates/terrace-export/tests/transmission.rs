//! Transmission conformance over a raw socket: every command in simple and
//! structured mode, errors at the edge, pipelining and reordering, the
//! in-flight bound, disconnects, shutdown.

#[macro_use]
mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use terrace_export::{ConnectionError, Errno, Server, ServerOptions};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::watch;

const SIZE: usize = 1 << 20;

fn assert_ok(reply: &Reply) {
    assert_eq!(reply.error(), 0, "{reply:?}");
}

/// Connects with structured replies and `base:allocation`; returns the
/// client and the context id the server assigned.
async fn open_structured(server: &TestServer, name: &str) -> (RawClient<TcpStream>, u32) {
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    assert_eq!(
        client.option(OPT_STRUCTURED_REPLY, &[]).await[0].reply_type,
        REP_ACK
    );
    let replies = client
        .option(
            OPT_SET_META_CONTEXT,
            &meta_query(name, &["base:allocation"]),
        )
        .await;
    assert_eq!(replies.len(), 2);
    let context = u32::from_be_bytes(replies[0].data[..4].try_into().unwrap());
    client.go(name, &[INFO_BLOCK_SIZE]).await.unwrap();
    (client, context)
}

async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn simple_replies_round_trip_every_command(mode: Mode) {
    let (server, disk) = TestServer::with_disk(SIZE, mode).await;
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    let pattern = pseudo_random(8192, 1);

    assert_ok(&c.call(CMD_WRITE, 0, 4096, 8192, &pattern).await);
    assert_eq!(disk.contents(4096, 8192), pattern);
    assert_eq!(
        c.call(CMD_READ, 0, 4096, 8192, &[]).await.read_data(4096),
        pattern
    );
    // Unaligned requests are served as they are.
    assert_eq!(
        c.call(CMD_READ, 0, 4097, 3, &[]).await.read_data(4097),
        &pattern[1..4]
    );

    assert_ok(&c.call(CMD_WRITE, CMD_FLAG_FUA, 100_000, 3, b"fua").await);
    assert_eq!(disk.contents(100_000, 3), b"fua");
    let fua_write = |call: &Call| call.op == Op::Write && call.fua && call.offset == 100_000;
    assert!(disk.calls().iter().any(fua_write));

    assert_ok(&c.call(CMD_FLUSH, 0, 0, 0, &[]).await);
    assert_eq!(disk.count(Op::Flush), 1);
    assert_ok(&c.call(CMD_TRIM, 0, 4096, 4096, &[]).await);
    assert_eq!(disk.contents(4096, 4096), vec![0; 4096]);

    assert_ok(
        &c.call(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 8192, 4096, &[])
            .await,
    );
    assert_eq!(disk.contents(8192, 4096), vec![0; 4096]);
    let fast = CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA;
    assert_ok(&c.call(CMD_WRITE_ZEROES, fast, 0, 512, &[]).await);
    let zeroes: Vec<Call> = disk
        .calls()
        .into_iter()
        .filter(|call| call.op == Op::WriteZeroes)
        .collect();
    let arguments = |call: &Call| (call.may_trim, call.fast, call.fua);
    assert_eq!(arguments(&zeroes[0]), (false, false, false));
    assert_eq!(arguments(&zeroes[1]), (true, true, true));

    assert_ok(&c.call(CMD_CACHE, 0, 0, 65536, &[]).await);
    assert_eq!(disk.count(Op::Cache), 1);

    c.send_request(CMD_DISC, 0, 1, 0, 0, &[]).await;
    assert!(c.closed().await);
    server.stop().await;
}

async fn zero_length_requests_succeed_without_reaching_the_backend(mode: Mode) {
    let (server, disk) = TestServer::with_disk(SIZE, mode).await;
    let (mut simple, _) = RawClient::open(server.addr, "disk", false).await;
    let empty = Reply::Simple {
        error: 0,
        cookie: 0xc0ffee,
        data: vec![],
    };
    assert_eq!(simple.call(CMD_READ, 0, 0, 0, &[]).await, empty);
    let (mut structured, _) = RawClient::open(server.addr, "disk", true).await;
    let (flags, kind, payload) = structured
        .call(CMD_READ, 0, SIZE as u64, 0, &[])
        .await
        .chunk();
    assert_eq!(
        (flags, kind, payload.len()),
        (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0)
    );
    for c in [&mut simple, &mut structured] {
        for kind in [CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES, CMD_CACHE] {
            assert_ok(&c.call(kind, 0, 4096, 0, &[]).await);
        }
    }
    assert!(disk.calls().is_empty(), "{:?}", disk.calls());
    server.stop().await;
}

async fn structured_replies_carry_reads_and_errors_as_final_chunks(mode: Mode) {
    let (server, disk) = TestServer::with_disk(SIZE, mode).await;
    let (mut c, _) = open_structured(&server, "disk").await;
    let pattern = pseudo_random(4096, 2);
    assert_ok(&c.call(CMD_WRITE, 0, 4096, 4096, &pattern).await);
    assert_eq!(
        c.call(CMD_READ, 0, 4096, 4096, &[]).await.read_data(4096),
        pattern
    );

    // Errors come as a final error chunk with a message.
    let (flags, kind, payload) = c.call(CMD_READ, 0, SIZE as u64, 1, &[]).await.chunk();
    assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR));
    assert_eq!(u32::from_be_bytes(payload[..4].try_into().unwrap()), EINVAL);
    let message_length = u16::from_be_bytes([payload[4], payload[5]]) as usize;
    assert_eq!(payload.len(), 6 + message_length);
    assert!(message_length > 0);

    for flags in [0, CMD_FLAG_FUA] {
        assert_ok(&c.call(CMD_FLUSH, flags, 0, 0, &[]).await);
        assert_ok(&c.call(CMD_TRIM, flags, 0, 512, &[]).await);
        assert_ok(&c.call(CMD_WRITE_ZEROES, flags, 512, 512, &[]).await);
        assert_ok(&c.call(CMD_CACHE, flags, 0, 4096, &[]).await);
    }
    assert_eq!(disk.count(Op::Flush), 2);
    assert_eq!(disk.count(Op::Trim), 2);
    server.stop().await;
}

async fn block_status_reports_allocation_under_the_negotiated_context(mode: Mode) {
    let (server, disk) = TestServer::with_disk(SIZE, mode).await;
    let (mut c, context) = open_structured(&server, "disk").await;
    disk.fill(4096, &[9; 4096]);

    // Granule 1 holds data, the rest is holes reading as zeroes.
    let (flags, kind, payload) = c.call(CMD_BLOCK_STATUS, 0, 0, 16384, &[]).await.chunk();
    assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS));
    let expected = vec![(4096, 3), (4096, 0), (8192, 3)];
    assert_eq!(block_status_payload(&payload), (context, expected));

    // REQ_ONE: exactly one extent, no longer than the request.
    let (_, kind, payload) = c
        .call(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 2048, &[])
        .await
        .chunk();
    assert_eq!(kind, REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(block_status_payload(&payload), (context, vec![(2048, 3)]));

    let past_the_end = c
        .call(CMD_BLOCK_STATUS, 0, SIZE as u64 - 512, 1024, &[])
        .await;
    assert_eq!(past_the_end.error(), EINVAL);
    server.stop().await;
}

async fn block_status_needs_a_negotiated_context(mode: Mode) {
    let disk = Arc::new(MemoryBackend::new(SIZE));
    let other = Arc::new(MemoryBackend::new(SIZE));
    let catalog = MemoryCatalog::new(vec![("disk", disk.clone()), ("other", other.clone())]);
    let server = TestServer::start(catalog, mode.options()).await;
    let (mut simple, _) = RawClient::open(server.addr, "disk", false).await;
    assert_eq!(
        simple.call(CMD_BLOCK_STATUS, 0, 0, 4096, &[]).await.error(),
        EINVAL
    );
    let (mut structured, _) = RawClient::open(server.addr, "disk", true).await;
    assert_eq!(
        structured
            .call(CMD_BLOCK_STATUS, 0, 0, 4096, &[])
            .await
            .error(),
        EINVAL
    );

    // A context selected for another export does not carry over.
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    client.option(OPT_STRUCTURED_REPLY, &[]).await;
    let replies = client
        .option(
            OPT_SET_META_CONTEXT,
            &meta_query("disk", &["base:allocation"]),
        )
        .await;
    assert_eq!(replies.len(), 2);
    client.go("other", &[]).await.unwrap();
    assert_eq!(
        client.call(CMD_BLOCK_STATUS, 0, 0, 4096, &[]).await.error(),
        EINVAL
    );
    assert_eq!(
        disk.count(Op::BlockStatus) + other.count(Op::BlockStatus),
        0
    );
    server.stop().await;
}

async fn invalid_requests_get_the_spec_errors_and_the_connection_stays_usable(mode: Mode) {
    let (server, disk) = TestServer::with_disk(SIZE, mode).await;
    for structured in [false, true] {
        let (mut c, _) = RawClient::open(server.addr, "disk", structured).await;
        let end = SIZE as u64;
        assert_eq!(c.call(CMD_READ, 0, end - 1, 2, &[]).await.error(), EINVAL);
        assert_eq!(c.call(CMD_READ, 0, u64::MAX, 2, &[]).await.error(), EINVAL);
        assert_eq!(
            c.call(CMD_WRITE, 0, end - 1, 2, b"xy").await.error(),
            ENOSPC
        );
        assert_eq!(
            c.call(CMD_WRITE_ZEROES, 0, end, 1, &[]).await.error(),
            ENOSPC
        );
        assert_eq!(c.call(CMD_TRIM, 0, end, 1, &[]).await.error(), EINVAL);
        assert_eq!(c.call(CMD_CACHE, 0, end, 1, &[]).await.error(), EINVAL);
        assert_eq!(c.call(42, 0, 0, 1, &[]).await.error(), EINVAL);
        assert_eq!(
            c.call(CMD_READ, CMD_FLAG_DF, 0, 1, &[]).await.error(),
            EINVAL
        );
        assert_eq!(
            c.call(CMD_WRITE_ZEROES, CMD_FLAG_REQ_ONE, 0, 1, &[])
                .await
                .error(),
            EINVAL
        );
        assert_eq!(c.call(CMD_WRITE, 0x100, 0, 2, b"no").await.error(), EINVAL);
        // The refused write's payload was consumed: the stream is in step.
        disk.fill(0, b"ok");
        match c.call(CMD_READ, 0, 0, 2, &[]).await {
            Reply::Simple { error: 0, data, .. } => assert_eq!(data, b"ok"),
            Reply::Chunk {
                kind: REPLY_TYPE_OFFSET_DATA,
                payload,
                ..
            } => assert_eq!(&payload[8..], b"ok"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        disk.count(Op::Write) + disk.count(Op::Trim) + disk.count(Op::WriteZeroes),
        0
    );
    server.stop().await;
}

async fn oversized_writes_are_discarded_and_absurd_ones_disconnect(mode: Mode) {
    let disk = Arc::new(MemoryBackend::new(SIZE));
    let options = ServerOptions {
        max_payload_bytes: 64 << 10,
        ..mode.options()
    };
    let server = TestServer::start(MemoryCatalog::new(vec![("disk", disk.clone())]), options).await;
    let (mut c, info) = RawClient::open(server.addr, "disk", false).await;
    assert_eq!(info.block_sizes, Some((512, 4096, 64 << 10)));

    assert_eq!(
        c.call(CMD_WRITE, 0, 0, 128 << 10, &vec![0xee; 128 << 10])
            .await
            .error(),
        EINVAL
    );
    assert_eq!(disk.count(Op::Write), 0);
    assert_eq!(c.call(CMD_READ, 0, 0, 128 << 10, &[]).await.error(), EINVAL);
    match c.call(CMD_READ, 0, 0, 64 << 10, &[]).await {
        Reply::Simple { error: 0, data, .. } => assert_eq!(data, vec![0; 64 << 10]),
        other => panic!("{other:?}"),
    }
    let (mut structured, _) = RawClient::open(server.addr, "disk", true).await;
    assert_eq!(
        structured
            .call(CMD_READ, 0, 0, 128 << 10, &[])
            .await
            .error(),
        EOVERFLOW
    );

    // 1 GiB announced: the server hangs up rather than read it.
    c.send_request(CMD_WRITE, 0, 9, 0, 1 << 30, &[]).await;
    assert!(c.closed().await);
    server.stop().await;
}

async fn read_only_exports_refuse_writes_with_eperm(mode: Mode) {
    let archive = Arc::new(MemoryBackend::read_only(SIZE));
    archive.fill(0, b"kept");
    let server = TestServer::start(
        MemoryCatalog::new(vec![("archive", archive.clone())]),
        mode.options(),
    )
    .await;
    let (mut c, info) = RawClient::open(server.addr, "archive", false).await;
    assert_ne!(info.flags & FLAG_READ_ONLY, 0);
    assert_eq!(c.call(CMD_WRITE, 0, 0, 4, b"lost").await.error(), EPERM);
    assert_eq!(c.call(CMD_TRIM, 0, 0, 4, &[]).await.error(), EPERM);
    assert_eq!(c.call(CMD_WRITE_ZEROES, 0, 0, 4, &[]).await.error(), EPERM);
    assert_eq!(archive.contents(0, 4), b"kept");
    match c.call(CMD_READ, 0, 0, 4, &[]).await {
        Reply::Simple { error: 0, data, .. } => assert_eq!(data, b"kept"),
        other => panic!("{other:?}"),
    }
    assert_ok(&c.call(CMD_FLUSH, 0, 0, 0, &[]).await);
    server.stop().await;
}

async fn backend_errors_reach_the_client_in_both_modes(mode: Mode) {
    let disk = Arc::new(MemoryBackend::build(
        SIZE,
        false,
        |_, _| Duration::ZERO,
        |call| match (call.op, call.offset) {
            (Op::Read, 8192) | (Op::Write, 8192) => Some(Errno::Io),
            (Op::WriteZeroes, _) if call.fast => Some(Errno::NotSupported),
            _ => None,
        },
    ));
    let server = TestServer::start(
        MemoryCatalog::new(vec![("disk", disk.clone())]),
        mode.options(),
    )
    .await;
    for structured in [false, true] {
        let (mut c, _) = RawClient::open(server.addr, "disk", structured).await;
        let reply = c.call(CMD_READ, 0, 8192, 4096, &[]).await;
        assert_eq!(reply.error(), EIO);
        if let Reply::Simple { data, .. } = &reply {
            assert!(data.is_empty(), "no payload after a failed simple read");
        }
        assert_eq!(c.call(CMD_WRITE, 0, 8192, 2, b"xx").await.error(), EIO);
        assert_eq!(
            c.call(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 4096, &[])
                .await
                .error(),
            ENOTSUP
        );
        assert_ok(&c.call(CMD_WRITE_ZEROES, 0, 0, 4096, &[]).await);
        assert_ok(&c.call(CMD_READ, 0, 0, 4096, &[]).await);
    }
    server.stop().await;
}

async fn a_bad_request_magic_disconnects_and_the_server_carries_on(mode: Mode) {
    let (server, _disk) = TestServer::with_disk(SIZE, mode).await;
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    let mut bad = request(CMD_READ, 0, 1, 0, 512, &[]);
    bad[0] ^= 0xff;
    c.stream.write_all(&bad).await.unwrap();
    assert!(c.closed().await);
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    assert_ok(&c.call(CMD_READ, 0, 0, 512, &[]).await);
    server.stop().await;
}

/// Any byte stream a test client can use.
trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}

/// A served connection: the client end, the connection's outcome, and the
/// switch that shuts the server down.
type Served = (
    RawClient<Box<dyn Duplex>>,
    tokio::task::JoinHandle<Result<(), ConnectionError>>,
    watch::Sender<bool>,
);

/// Serves one connection without a listener, and returns the client end and
/// the connection's outcome: in async mode `serve_connection` over an
/// in-memory pipe, in threaded mode `serve_socket` over a Unix socket pair.
fn serve_pipe(disk: &Arc<MemoryBackend>, mode: Mode) -> Served {
    let server = Server::new(
        MemoryCatalog::new(vec![("disk", disk.clone())]),
        mode.options(),
    );
    let (stop, shutdown) = watch::channel(false);
    let (client, task): (Box<dyn Duplex>, _) = match mode {
        Mode::Async => {
            let (client, end) = tokio::io::duplex(64 << 10);
            let task = tokio::spawn(async move { server.serve_connection(end, shutdown).await });
            (Box::new(client), task)
        }
        Mode::Threaded => {
            let (client, end) = UnixStream::pair().unwrap();
            let task = tokio::spawn(async move { server.serve_socket(end, shutdown).await });
            (Box::new(client), task)
        }
    };
    (RawClient::new(client), task, stop)
}

async fn outcome(
    task: tokio::task::JoinHandle<Result<(), ConnectionError>>,
) -> Result<(), ConnectionError> {
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the connection did not end")
        .unwrap()
}

async fn serve_connection_reports_how_a_connection_ended(mode: Mode) {
    let disk = Arc::new(MemoryBackend::new(SIZE));

    // Clean: NBD_CMD_DISC.
    let (mut c, task, _stop) = serve_pipe(&disk, mode);
    c.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    c.go("disk", &[]).await.unwrap();
    assert_ok(&c.call(CMD_WRITE, 0, 0, 3, b"abc").await);
    c.send_request(CMD_DISC, 0, 2, 0, 0, &[]).await;
    outcome(task).await.unwrap();

    // A truncated request header, then the client goes away.
    let (mut c, task, _stop) = serve_pipe(&disk, mode);
    c.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    c.go("disk", &[]).await.unwrap();
    c.stream
        .write_all(&request(CMD_READ, 0, 1, 0, 512, &[])[..10])
        .await
        .unwrap();
    drop(c);
    assert!(matches!(
        outcome(task).await,
        Err(ConnectionError::Truncated)
    ));

    // Gone in the middle of a write payload: nothing reaches the backend.
    let (mut c, task, _stop) = serve_pipe(&disk, mode);
    c.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    c.go("disk", &[]).await.unwrap();
    c.stream
        .write_all(&request(
            CMD_WRITE,
            0,
            1,
            4096,
            1 << 20,
            &vec![0x55; 100 << 10],
        ))
        .await
        .unwrap();
    drop(c);
    assert!(matches!(
        outcome(task).await,
        Err(ConnectionError::Truncated)
    ));
    assert_eq!(disk.count(Op::Write), 1);
    assert_eq!(disk.contents(4096, 4096), vec![0; 4096]);

    // Unknown client flags and a bad request magic are reported as such.
    let (mut c, task, _stop) = serve_pipe(&disk, mode);
    c.handshake(0x80).await;
    assert!(matches!(
        outcome(task).await,
        Err(ConnectionError::ClientFlags(0x80))
    ));
    let (mut c, task, _stop) = serve_pipe(&disk, mode);
    c.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    c.go("disk", &[]).await.unwrap();
    c.stream.write_all(&[0u8; 28]).await.unwrap();
    assert!(matches!(
        outcome(task).await,
        Err(ConnectionError::RequestMagic(0))
    ));

    // Every session let go of the backend: only this test holds it.
    assert_eq!(Arc::strong_count(&disk), 1);
}

async fn clients_vanishing_mid_request_cost_nothing(mode: Mode) {
    let disk = Arc::new(MemoryBackend::build(
        SIZE,
        false,
        |_, _| Duration::from_millis(100),
        |_| None,
    ));
    let server = TestServer::start(
        MemoryCatalog::new(vec![("disk", disk.clone())]),
        mode.options(),
    )
    .await;
    for round in 0..8u64 {
        let (mut c, _) = RawClient::open(server.addr, "disk", round % 2 == 0).await;
        // Slow requests in flight, then a truncated write payload, then gone.
        c.send_request(CMD_READ, 0, 1, 0, 4096, &[]).await;
        c.send_request(CMD_WRITE, 0, 2, 8192, 4096, &[1; 4096])
            .await;
        c.send_request(CMD_WRITE, 0, 3, 0, 1 << 20, &[2; 1000])
            .await;
        drop(c);
    }
    // In-flight operations finish, connections end, sessions are released:
    // only the test and the catalog hold the backend.
    wait_until("the backend is idle and released", || {
        disk.running() == 0 && Arc::strong_count(&disk) == 2
    })
    .await;
    assert_eq!(
        disk.contents(0, 4096),
        vec![0; 4096],
        "the truncated write never reached the backend"
    );
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    assert_ok(&c.call(CMD_READ, 0, 0, 4096, &[]).await);
    server.stop().await;
}

/// Whether replies came back in another order than the requests were sent.
fn reordered(order: &[u64]) -> bool {
    order.windows(2).any(|pair| pair[0] > pair[1])
}

/// Sends all `requests` in one go, then reads `count` replies, in the order
/// they arrive.
async fn burst(
    c: &mut RawClient<TcpStream>,
    requests: Vec<Vec<u8>>,
    read_length: usize,
) -> Vec<Reply> {
    let count = requests.len();
    c.stream.write_all(&requests.concat()).await.unwrap();
    let mut replies = Vec::with_capacity(count);
    for _ in 0..count {
        replies.push(c.read_reply(|_| read_length).await);
    }
    replies
}

async fn pipelined_requests_are_answered_out_of_order_by_cookie(mode: Mode) {
    // Every fourth block is slow, so later requests overtake it.
    let slow = |_: Op, offset: u64| match (offset / 4096) % 4 {
        0 => Duration::from_millis(100),
        _ => Duration::ZERO,
    };
    let disk = Arc::new(MemoryBackend::build(SIZE, false, slow, |_| None));
    let catalog = MemoryCatalog::new(vec![("disk", disk.clone())]);
    let server = TestServer::start(catalog, mode.options()).await;
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    let block = |cookie: u64| pseudo_random(4096, 100 + cookie);

    let writes =
        (0..64).map(|cookie| request(CMD_WRITE, 0, cookie, cookie * 4096, 4096, &block(cookie)));
    let replies = burst(&mut c, writes.collect(), 0).await;
    replies.iter().for_each(assert_ok);
    let order: Vec<u64> = replies.iter().map(Reply::cookie).collect();
    assert_eq!(
        order.iter().copied().collect::<HashSet<_>>(),
        (0..64).collect::<HashSet<_>>()
    );
    assert!(
        reordered(&order),
        "write replies came back in request order: {order:?}"
    );

    // Block 63 - cookie, so that data and cookie cannot match by accident.
    let reads = (0..64).map(|cookie| request(CMD_READ, 0, cookie, (63 - cookie) * 4096, 4096, &[]));
    let replies = burst(&mut c, reads.collect(), 4096).await;
    let order: Vec<u64> = replies.iter().map(Reply::cookie).collect();
    for reply in replies {
        let cookie = reply.cookie();
        assert_eq!(reply.read_data(0), block(63 - cookie), "cookie {cookie}");
    }
    assert!(
        reordered(&order),
        "read replies came back in request order: {order:?}"
    );
    assert!(disk.most_running() > 1);
    server.stop().await;
}

async fn the_in_flight_bound_holds(mode: Mode) {
    let disk = Arc::new(MemoryBackend::gated(SIZE, Op::Write));
    let options = ServerOptions {
        max_in_flight_per_connection: 4,
        ..mode.options()
    };
    let server = TestServer::start(MemoryCatalog::new(vec![("disk", disk.clone())]), options).await;
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    let writes: Vec<Vec<u8>> = (0..32)
        .map(|cookie| {
            request(
                CMD_WRITE,
                0,
                cookie,
                cookie * 512,
                512,
                &[cookie as u8; 512],
            )
        })
        .collect();
    c.stream.write_all(&writes.concat()).await.unwrap();
    // 32 requests wait in the socket; only 4 may be in progress.
    wait_until("4 writes are in progress", || disk.running() == 4).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(disk.running(), 4);
    disk.release(32);
    for _ in 0..32 {
        assert_ok(&c.read_reply(|_| 0).await);
    }
    assert_eq!(disk.most_running(), 4);
    server.stop().await;
}

async fn disc_after_in_flight_writes_applies_them_first(mode: Mode) {
    let disk = Arc::new(MemoryBackend::build(
        SIZE,
        false,
        |_, _| Duration::from_millis(200),
        |_| None,
    ));
    let server = TestServer::start(
        MemoryCatalog::new(vec![("disk", disk.clone())]),
        mode.options(),
    )
    .await;
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    let mut burst = Vec::new();
    for cookie in 0..16u64 {
        burst.extend(request(
            CMD_WRITE,
            0,
            cookie,
            cookie * 4096,
            4096,
            &[cookie as u8 + 1; 4096],
        ));
    }
    burst.extend(request(CMD_DISC, 0, 99, 0, 0, &[]));
    c.stream.write_all(&burst).await.unwrap();
    for _ in 0..16 {
        assert_ok(&c.read_reply(|_| 0).await);
    }
    assert!(c.closed().await);
    for cookie in 0..16u64 {
        assert_eq!(
            disk.contents(cookie * 4096, 4096),
            vec![cookie as u8 + 1; 4096]
        );
    }
    server.stop().await;
}

async fn shutdown_finishes_in_flight_requests_and_refuses_new_ones(mode: Mode) {
    let disk = Arc::new(MemoryBackend::gated(SIZE, Op::Write));
    let server = TestServer::start(
        MemoryCatalog::new(vec![("disk", disk.clone())]),
        mode.options(),
    )
    .await;
    let (mut c, _) = RawClient::open(server.addr, "disk", true).await;
    c.send_request(CMD_WRITE, 0, 1, 0, 4, b"last").await;
    wait_until("the write is in progress", || disk.running() == 1).await;
    server.request_shutdown();
    // The write is held, so every reply until its release is to a read:
    // served while the server has not yet seen the shutdown, refused with
    // NBD_ESHUTDOWN once it has.
    let mut attempts = 0;
    loop {
        let reply = c.call(CMD_READ, 0, 0, 4, &[]).await;
        if reply.error() == ESHUTDOWN {
            break;
        }
        assert_eq!(reply.read_data(0), vec![0; 4]);
        attempts += 1;
        assert!(attempts < 500, "the server never noticed the shutdown");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !c.closed_within(Duration::from_millis(100)).await,
        "closed with a write in flight"
    );
    disk.release(1);
    let reply = c.read_reply(|_| 0).await;
    assert_eq!((reply.cookie(), reply.error()), (1, 0));
    assert!(c.closed().await);
    assert_eq!(disk.contents(0, 4), b"last");
    server.stop().await;
}

async fn shutdown_drops_connections_still_busy_after_the_grace_period(mode: Mode) {
    let stuck = |op: Op, _| {
        if op == Op::Read {
            Duration::from_secs(60)
        } else {
            Duration::ZERO
        }
    };
    let disk = Arc::new(MemoryBackend::build(SIZE, false, stuck, |_| None));
    let options = ServerOptions {
        shutdown_grace: Duration::from_millis(300),
        ..mode.options()
    };
    let server = TestServer::start(MemoryCatalog::new(vec![("disk", disk.clone())]), options).await;
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    c.send_request(CMD_READ, 0, 1, 0, 4096, &[]).await;
    wait_until("the read is in progress", || disk.running() == 1).await;
    let started = Instant::now();
    server.stop_within(Duration::from_secs(5)).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(c.closed().await);
    // The stuck backend operation was dropped, and with it every reference.
    wait_until("the backend is released", || {
        disk.running() == 0 && Arc::strong_count(&disk) == 1
    })
    .await;
}

/// Writes of a stream reach the backend in the order they were sent even
/// when they run on the offload runtime's threads (an engine recognises a
/// stream, and gathers it into whole rows, by that order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_stream_writes_reach_the_backend_in_order() {
    let disk = Arc::new(MemoryBackend::new(SIZE));
    let catalog = MemoryCatalog::new(vec![("disk", disk.clone())]);
    let server = TestServer::start_offloaded(catalog, Mode::Async.options()).await;
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    let piece = 64 << 10;
    let count = (SIZE / piece) as u64;
    for round in 0..4 {
        let writes = (0..count).map(|i| {
            let data = pseudo_random(piece, round * 100 + i);
            request(CMD_WRITE, 0, i, i * piece as u64, piece as u32, &data)
        });
        let replies = burst(&mut c, writes.collect(), 0).await;
        replies.iter().for_each(assert_ok);
    }
    let offsets: Vec<u64> = disk
        .calls()
        .iter()
        .filter(|call| call.op == Op::Write)
        .map(|call| call.offset)
        .collect();
    let sent: Vec<u64> = (0..4)
        .flat_map(|_| (0..count).map(|i| i * piece as u64))
        .collect();
    assert_eq!(offsets, sent);
    server.stop().await;
}

/// Large writes (whose payloads the server may read straight from the
/// socket) mixed with small writes and reads, sent in one burst and again
/// trickled in odd-sized pieces that split headers and payloads: every
/// request is answered and every byte lands where it was sent; then large
/// and small reads in one burst bring every byte back.
async fn large_and_small_requests_mixed_land_intact(mode: Mode) {
    let (server, disk) = TestServer::with_disk(SIZE, mode).await;
    let (mut c, _) = RawClient::open(server.addr, "disk", false).await;
    // (offset, length): 64 KiB, 4 KiB, 40 KiB, 20 KiB, 128 KiB, 8 KiB, 17 KiB.
    let writes: [(u64, usize); 7] = [
        (0, 64 << 10),
        (64 << 10, 4 << 10),
        (68 << 10, 40 << 10),
        (108 << 10, 20 << 10),
        (128 << 10, 128 << 10),
        (256 << 10, 8 << 10),
        (264 << 10, 17 << 10),
    ];
    for round in 0..2u64 {
        let mut requests = Vec::new();
        let mut expected = Vec::new();
        for (i, &(offset, length)) in writes.iter().enumerate() {
            let data = pseudo_random(length, round * 10 + i as u64);
            requests.push(request(
                CMD_WRITE,
                0,
                i as u64,
                offset,
                length as u32,
                &data,
            ));
            // A read after each write, of a block the write did not touch.
            requests.push(request(CMD_READ, 0, 100 + i as u64, 512 << 10, 4096, &[]));
            expected.push((offset, data));
        }
        let count = requests.len();
        let bytes = requests.concat();
        if round == 0 {
            c.stream.write_all(&bytes).await.unwrap();
        } else {
            for piece in bytes.chunks(2209) {
                c.stream.write_all(piece).await.unwrap();
                c.stream.flush().await.unwrap();
                tokio::task::yield_now().await;
            }
        }
        for _ in 0..count {
            assert_ok(
                &c.read_reply(|cookie| if cookie >= 100 { 4096 } else { 0 })
                    .await,
            );
        }
        for (offset, data) in &expected {
            assert_eq!(
                disk.contents(*offset, data.len()),
                *data,
                "round {round} at {offset}"
            );
        }
        // Read it all back in one burst: replies with large and small read
        // data side by side, each with its own bytes.
        let reads: Vec<Vec<u8>> = writes
            .iter()
            .enumerate()
            .map(|(i, &(offset, length))| {
                request(CMD_READ, 0, i as u64, offset, length as u32, &[])
            })
            .collect();
        c.stream.write_all(&reads.concat()).await.unwrap();
        for _ in 0..writes.len() {
            let reply = c.read_reply(|cookie| writes[cookie as usize].1).await;
            assert_ok(&reply);
            let cookie = reply.cookie() as usize;
            assert_eq!(
                reply.read_data(0),
                expected[cookie].1,
                "round {round}, read {cookie}"
            );
        }
        // Many replies without data (the write buffer gathers them), then
        // one with much: every reply arrives whole and the read brings its
        // bytes. (Whether they meet in one writer pass depends on timing;
        // the order itself is pinned by the unit test of `write_batch`.)
        let mut mixed: Vec<Vec<u8>> = (0..80u64)
            .map(|i| request(CMD_WRITE, 0, i, (512 << 10) + i * 4096, 4096, &[7; 4096]))
            .collect();
        mixed.push(request(CMD_READ, 0, 1000, 0, 64 << 10, &[]));
        c.stream.write_all(&mixed.concat()).await.unwrap();
        for _ in 0..mixed.len() {
            let reply = c
                .read_reply(|cookie| if cookie == 1000 { 64 << 10 } else { 0 })
                .await;
            assert_ok(&reply);
            if reply.cookie() == 1000 {
                assert_eq!(reply.read_data(0), expected[0].1, "round {round}");
            }
        }
    }
    server.stop().await;
}

/// Trims and write-zeroes carry no payload: the maximum payload (32 MiB
/// here) does not bound them, and one of the whole export, larger than
/// that, reaches the backend whole and in one call.
async fn trims_and_zeroing_beyond_the_maximum_payload_reach_the_backend_whole(mode: Mode) {
    const LARGE: usize = 48 << 20;
    let (server, disk) = TestServer::with_disk(LARGE, mode).await;
    let (mut c, _) = RawClient::open(server.addr, "disk", true).await;
    let pattern = pseudo_random(4096, 3);
    for (command, flags) in [(CMD_TRIM, 0), (CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE)] {
        for offset in [0, LARGE as u64 - 4096] {
            assert_ok(&c.call(CMD_WRITE, 0, offset, 4096, &pattern).await);
        }
        assert_ok(&c.call(command, flags, 0, LARGE as u32, &[]).await);
        for offset in [0, LARGE - 4096] {
            assert_eq!(disk.contents(offset as u64, 4096), vec![0; 4096]);
        }
    }
    let whole = |op| {
        let calls = disk.calls();
        calls
            .iter()
            .filter(|call| call.op == op)
            .map(|call| (call.offset, call.length))
            .collect::<Vec<_>>()
    };
    assert_eq!(whole(Op::Trim), vec![(0, LARGE as u64)]);
    assert_eq!(whole(Op::WriteZeroes), vec![(0, LARGE as u64)]);
    server.stop().await;
}

in_both_modes!(
    simple_replies_round_trip_every_command,
    zero_length_requests_succeed_without_reaching_the_backend,
    structured_replies_carry_reads_and_errors_as_final_chunks,
    block_status_reports_allocation_under_the_negotiated_context,
    block_status_needs_a_negotiated_context,
    invalid_requests_get_the_spec_errors_and_the_connection_stays_usable,
    oversized_writes_are_discarded_and_absurd_ones_disconnect,
    read_only_exports_refuse_writes_with_eperm,
    backend_errors_reach_the_client_in_both_modes,
    a_bad_request_magic_disconnects_and_the_server_carries_on,
    serve_connection_reports_how_a_connection_ended,
    clients_vanishing_mid_request_cost_nothing,
    pipelined_requests_are_answered_out_of_order_by_cookie,
    the_in_flight_bound_holds,
    disc_after_in_flight_writes_applies_them_first,
    shutdown_finishes_in_flight_requests_and_refuses_new_ones,
    shutdown_drops_connections_still_busy_after_the_grace_period,
    large_and_small_requests_mixed_land_intact,
    trims_and_zeroing_beyond_the_maximum_payload_reach_the_backend_whole,
);

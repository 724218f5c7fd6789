//! Handshake conformance over a raw socket: greeting, client flags, option
//! haggling, the legacy `NBD_OPT_EXPORT_NAME` path.

mod common;

use std::sync::Arc;

use common::*;
use terrace_export::ServerOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SIZE: usize = 1 << 20;

/// A server with a writable "disk" and a read-only "archive".
async fn two_exports() -> (TestServer, Arc<MemoryBackend>, Arc<MemoryBackend>) {
    let disk = Arc::new(MemoryBackend::new(SIZE));
    let archive = Arc::new(MemoryBackend::read_only(SIZE / 2));
    let catalog = MemoryCatalog::new(vec![("disk", disk.clone()), ("archive", archive.clone())]);
    (
        TestServer::start(catalog, ServerOptions::default()).await,
        disk,
        archive,
    )
}

/// After GO: one read works and returns what the backend holds.
async fn read_works(client: &mut RawClient<tokio::net::TcpStream>, backend: &MemoryBackend) {
    backend.fill(0, b"hello");
    match client.call(CMD_READ, 0, 0, 5, &[]).await {
        Reply::Simple { error: 0, data, .. } => assert_eq!(data, b"hello"),
        other => panic!("unexpected reply {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greeting_offers_fixed_newstyle_and_no_zeroes() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    assert_eq!(client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await, 0b11);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_client_flags_close_the_connection() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | 0x4).await;
    assert!(client.closed().await);
    // The server is unaffected.
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE).await;
    assert!(client.go("disk", &[]).await.is_ok());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_options_are_refused_and_negotiation_continues() {
    let (server, disk, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    let replies = client.option(0x4242, b"whatever data").await;
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].reply_type, REP_ERR_UNSUP);
    assert_eq!(
        client.option(OPT_EXTENDED_HEADERS, &[]).await[0].reply_type,
        REP_ERR_UNSUP
    );
    assert_eq!(
        client.option(OPT_STARTTLS, &[]).await[0].reply_type,
        REP_ERR_POLICY
    );
    client.go("disk", &[]).await.unwrap();
    read_works(&mut client, &disk).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_names_every_export_with_its_description() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    let replies = client.option(OPT_LIST, &[]).await;
    assert_eq!(replies.len(), 3);
    let mut listed = Vec::new();
    for reply in &replies[..2] {
        assert_eq!(reply.reply_type, REP_SERVER);
        let length = u32::from_be_bytes(reply.data[..4].try_into().unwrap()) as usize;
        let name = String::from_utf8(reply.data[4..4 + length].to_vec()).unwrap();
        let description = String::from_utf8(reply.data[4 + length..].to_vec()).unwrap();
        listed.push((name, description));
    }
    assert_eq!(
        listed,
        vec![
            ("disk".to_string(), format!("memory, {SIZE} bytes")),
            ("archive".to_string(), format!("memory, {} bytes", SIZE / 2))
        ]
    );
    assert_eq!(replies[2].reply_type, REP_ACK);
    // With data: invalid, and the connection carries on.
    assert_eq!(
        client.option(OPT_LIST, b"x").await[0].reply_type,
        REP_ERR_INVALID
    );
    assert_eq!(client.option(OPT_LIST, &[]).await.len(), 3);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_reports_export_block_sizes_name_and_description() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    let info = client
        .info_or_go(
            OPT_INFO,
            "disk",
            &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
        )
        .await
        .unwrap();
    assert_eq!(info.size, SIZE as u64);
    let expected = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_FAST_ZERO
        | FLAG_SEND_CACHE
        | FLAG_CAN_MULTI_CONN;
    assert_eq!(info.flags, expected);
    assert_eq!(info.block_sizes, Some((512, 4096, 32 << 20)));
    assert_eq!(info.name.as_deref(), Some("disk"));
    assert_eq!(info.description, Some(format!("memory, {SIZE} bytes")));

    // Block sizes come even unasked; name and description only when asked.
    let info = client.info_or_go(OPT_INFO, "archive", &[]).await.unwrap();
    assert_eq!(info.size, SIZE as u64 / 2);
    assert_eq!(info.flags & FLAG_READ_ONLY, FLAG_READ_ONLY);
    assert_eq!(
        info.flags & (FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_ROTATIONAL | FLAG_SEND_DF),
        0
    );
    assert!(info.block_sizes.is_some() && info.name.is_none() && info.description.is_none());

    // A name length that runs past the data is invalid, not fatal.
    let mut bad = export_query("disk", &[]);
    bad[3] = 200;
    assert_eq!(
        client.option(OPT_INFO, &bad).await[0].reply_type,
        REP_ERR_INVALID
    );
    // INFO does not start transmission: ABORT is still an option.
    assert_eq!(client.option(OPT_ABORT, &[]).await[0].reply_type, REP_ACK);
    assert!(client.closed().await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_to_an_unknown_export_fails_then_a_known_one_works() {
    let (server, disk, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    let replies = client
        .option(OPT_GO, &export_query("nope", &[INFO_BLOCK_SIZE]))
        .await;
    assert_eq!(replies.len(), 1, "no NBD_REP_INFO before the error");
    assert_eq!(replies[0].reply_type, REP_ERR_UNKNOWN);
    let info = client.go("disk", &[]).await.unwrap();
    assert_eq!(info.size, SIZE as u64);
    read_works(&mut client, &disk).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_empty_name_is_the_default_export() {
    let (server, disk, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    let info = client.go("", &[INFO_NAME]).await.unwrap();
    assert_eq!(info.size, SIZE as u64);
    read_works(&mut client, &disk).await;
    server.stop().await;
}

/// `NBD_OPT_EXPORT_NAME`: size and flags, then 124 zeroes unless the client
/// set `NBD_FLAG_C_NO_ZEROES`; a request right after proves the byte count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_name_legacy_path_with_and_without_zeroes() {
    let (server, disk, _) = two_exports().await;
    for no_zeroes in [true, false] {
        let mut client = RawClient::connect(server.addr).await;
        client
            .handshake(C_FIXED_NEWSTYLE | if no_zeroes { C_NO_ZEROES } else { 0 })
            .await;
        client.send_option(OPT_EXPORT_NAME, b"disk").await;
        assert_eq!(client.stream.read_u64().await.unwrap(), SIZE as u64);
        let flags = client.stream.read_u16().await.unwrap();
        assert_eq!(
            flags & (FLAG_HAS_FLAGS | FLAG_CAN_MULTI_CONN),
            FLAG_HAS_FLAGS | FLAG_CAN_MULTI_CONN
        );
        if !no_zeroes {
            let mut zeroes = [1u8; 124];
            client.stream.read_exact(&mut zeroes).await.unwrap();
            assert_eq!(zeroes, [0u8; 124]);
        }
        read_works(&mut client, &disk).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_name_for_an_unknown_export_disconnects() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    client.send_option(OPT_EXPORT_NAME, b"nope").await;
    assert!(client.closed().await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_replies_take_no_data_and_are_negotiated_once() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    assert_eq!(
        client.option(OPT_STRUCTURED_REPLY, b"x").await[0].reply_type,
        REP_ERR_INVALID
    );
    assert_eq!(
        client.option(OPT_STRUCTURED_REPLY, &[]).await[0].reply_type,
        REP_ACK
    );
    assert_eq!(
        client.option(OPT_STRUCTURED_REPLY, &[]).await[0].reply_type,
        REP_ERR_INVALID
    );
    server.stop().await;
}

fn context_names(replies: &[OptionReply]) -> Vec<(u32, String)> {
    replies
        .iter()
        .filter(|reply| reply.reply_type == REP_META_CONTEXT)
        .map(|reply| {
            let id = u32::from_be_bytes(reply.data[..4].try_into().unwrap());
            (id, String::from_utf8(reply.data[4..].to_vec()).unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_contexts_list_and_set_base_allocation_only() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    // SET needs structured replies first.
    let replies = client
        .option(
            OPT_SET_META_CONTEXT,
            &meta_query("disk", &["base:allocation"]),
        )
        .await;
    assert_eq!(replies.last().unwrap().reply_type, REP_ERR_INVALID);
    assert_eq!(
        client.option(OPT_STRUCTURED_REPLY, &[]).await[0].reply_type,
        REP_ACK
    );

    let base = vec![(0, "base:allocation".to_string())];
    for queries in [
        &[][..],
        &["base:"][..],
        &["base:allocation"][..],
        &["x-other:a", "base:"][..],
    ] {
        let replies = client
            .option(OPT_LIST_META_CONTEXT, &meta_query("disk", queries))
            .await;
        assert_eq!(replies.last().unwrap().reply_type, REP_ACK, "{queries:?}");
        assert_eq!(context_names(&replies), base, "{queries:?}");
    }
    let replies = client
        .option(
            OPT_LIST_META_CONTEXT,
            &meta_query("disk", &["qemu:dirty-bitmap:x"]),
        )
        .await;
    assert_eq!((replies.len(), replies[0].reply_type), (1, REP_ACK));

    // SET ignores the wildcard and selects the real name, with an id.
    let replies = client
        .option(OPT_SET_META_CONTEXT, &meta_query("disk", &["base:"]))
        .await;
    assert_eq!((replies.len(), replies[0].reply_type), (1, REP_ACK));
    let replies = client
        .option(
            OPT_SET_META_CONTEXT,
            &meta_query("disk", &["base:allocation"]),
        )
        .await;
    let selected = context_names(&replies);
    assert_eq!(selected.len(), 1);
    assert_eq!(selected[0].1, "base:allocation");
    assert_ne!(selected[0].0, 0);
    assert_eq!(replies.last().unwrap().reply_type, REP_ACK);

    let replies = client
        .option(
            OPT_SET_META_CONTEXT,
            &meta_query("nope", &["base:allocation"]),
        )
        .await;
    assert_eq!(replies.last().unwrap().reply_type, REP_ERR_UNKNOWN);
    let mut bad = meta_query("disk", &["base:allocation"]);
    bad.truncate(bad.len() - 3);
    let replies = client.option(OPT_LIST_META_CONTEXT, &bad).await;
    assert_eq!(replies.last().unwrap().reply_type, REP_ERR_INVALID);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_options_are_refused_or_disconnected() {
    let (server, disk, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    // 100 KiB of data: read, dropped, refused; negotiation continues.
    let replies = client
        .option(OPT_LIST_META_CONTEXT, &vec![7u8; 100 << 10])
        .await;
    assert_eq!(replies[0].reply_type, REP_ERR_TOO_BIG);
    client.go("disk", &[]).await.unwrap();
    read_works(&mut client, &disk).await;

    // 1 GiB announced: not worth reading.
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    let mut header = IHAVEOPT.to_vec();
    header.extend_from_slice(&OPT_GO.to_be_bytes());
    header.extend_from_slice(&(1u32 << 30).to_be_bytes());
    client.stream.write_all(&header).await.unwrap();
    assert!(client.closed().await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_option_magic_disconnects() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    client
        .stream
        .write_all(b"IHAVEOPX\0\0\0\x03\0\0\0\0")
        .await
        .unwrap();
    assert!(client.closed().await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_negotiating_connections() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    assert_eq!(client.option(OPT_LIST, &[]).await.len(), 3);
    // A peer that never even sends its client flags.
    let mut silent = RawClient::connect(server.addr).await;
    let mut greeting = [0u8; 18];
    silent.stream.read_exact(&mut greeting).await.unwrap();
    // Idle negotiating clients do not hold up shutdown (the grace period
    // is 30 s; this must take far less).
    let limit = std::time::Duration::from_secs(5);
    server.stop_within(limit).await.unwrap();
    assert!(client.closed().await);
    assert!(silent.closed().await);
}

/// An option that arrives once shutdown has begun is answered with
/// `NBD_REP_ERR_SHUTDOWN` (here the client is mid-option when shutdown
/// comes, so the server reads the option before it closes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_during_shutdown_get_err_shutdown() {
    let (server, _, _) = two_exports().await;
    let mut client = RawClient::connect(server.addr).await;
    client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
    // Half an option: the server is now reading it and will not be
    // interrupted by shutdown.
    client.stream.write_all(&IHAVEOPT[..4]).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    server.request_shutdown();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    client.stream.write_all(&IHAVEOPT[4..]).await.unwrap();
    client
        .stream
        .write_all(&OPT_LIST.to_be_bytes())
        .await
        .unwrap();
    client.stream.write_all(&0u32.to_be_bytes()).await.unwrap();
    let reply = client.read_option_reply().await;
    assert_eq!(reply.reply_type, REP_ERR_SHUTDOWN);
    assert!(client.closed().await);
    server.stop().await;
}

//! A small NBD client: fixed newstyle handshake with NBD_OPT_GO, simple
//! replies, many requests in flight on one connection.
//!
//! ```text
//!  caller ──request──▶ writer (one at a time) ──▶ socket
//!  caller ◀──oneshot── reader task (matches replies by cookie) ◀── socket
//! ```
//!
//! Used by `terrace demo` to write and verify through the protocol, and by
//! the benchmark's load generator. URIs: `nbd://host[:port]/export` and
//! `nbd+unix:///export?socket=/path`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::protocol::{
    IHAVEOPT, NBDMAGIC as NBD_MAGIC, NBD_CMD_DISC as CMD_DISC, NBD_CMD_FLAG_FUA as CMD_FLAG_FUA,
    NBD_CMD_FLUSH as CMD_FLUSH, NBD_CMD_READ as CMD_READ, NBD_CMD_TRIM as CMD_TRIM,
    NBD_CMD_WRITE as CMD_WRITE, NBD_CMD_WRITE_ZEROES as CMD_WRITE_ZEROES,
    NBD_FLAG_FIXED_NEWSTYLE as FLAG_FIXED_NEWSTYLE, NBD_FLAG_NO_ZEROES as FLAG_NO_ZEROES,
    NBD_INFO_BLOCK_SIZE as INFO_BLOCK_SIZE, NBD_INFO_EXPORT as INFO_EXPORT,
    NBD_OPTION_REPLY_MAGIC as OPTION_REPLY_MAGIC, NBD_OPT_GO as OPT_GO, NBD_REP_ACK as REP_ACK,
    NBD_REP_INFO as REP_INFO, NBD_REQUEST_MAGIC as REQUEST_MAGIC,
    NBD_SIMPLE_REPLY_MAGIC as SIMPLE_REPLY_MAGIC,
};

/// Largest option reply accepted during the handshake: 64 KiB is far more
/// than any INFO reply and bounds a misbehaving server.
const OPTION_REPLY_MAX_BYTES: u32 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("bad NBD URI {0:?}: use nbd://host[:port]/export or nbd+unix:///export?socket=PATH")]
    Uri(String),
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("handshake: {0}")]
    Handshake(String),
    #[error("the server answered error {errno}")]
    Server { errno: u32 },
    #[error("the connection closed with requests in flight")]
    Closed,
}

type Stream = Box<dyn AsyncWrite + Send + Unpin>;

struct Waiter {
    length: u32,
    reply: oneshot::Sender<Result<Vec<u8>, NbdError>>,
}

pub struct NbdClient {
    writer: tokio::sync::Mutex<Stream>,
    waiting: Arc<Mutex<HashMap<u64, Waiter>>>,
    next_cookie: AtomicU64,
    pub size_bytes: u64,
    pub transmission_flags: u16,
    pub block_sizes: Option<(u32, u32, u32)>,
}

enum Target {
    Tcp(String),
    Unix(String),
}

fn parse_uri(uri: &str) -> Result<(Target, String), NbdError> {
    let bad = || NbdError::Uri(uri.to_string());
    if let Some(rest) = uri.strip_prefix("nbd+unix://") {
        let (path, query) = rest.split_once('?').ok_or_else(bad)?;
        let export = path.trim_start_matches('/').to_string();
        let socket = query.strip_prefix("socket=").ok_or_else(bad)?;
        return Ok((Target::Unix(socket.to_string()), export));
    }
    let rest = uri.strip_prefix("nbd://").ok_or_else(bad)?;
    let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
    let address = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:10809")
    };
    Ok((Target::Tcp(address), export.to_string()))
}

impl NbdClient {
    pub async fn connect(uri: &str) -> Result<NbdClient, NbdError> {
        let (target, export) = parse_uri(uri)?;
        match target {
            Target::Tcp(address) => {
                let stream = tokio::net::TcpStream::connect(address).await?;
                stream.set_nodelay(true)?;
                let (reader, writer) = stream.into_split();
                Self::handshake(Box::new(reader), Box::new(writer), &export).await
            }
            Target::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await?;
                let (reader, writer) = stream.into_split();
                Self::handshake(Box::new(reader), Box::new(writer), &export).await
            }
        }
    }

    async fn handshake(
        mut reader: Box<dyn AsyncRead + Send + Unpin>,
        mut writer: Stream,
        export: &str,
    ) -> Result<NbdClient, NbdError> {
        let Negotiated {
            size_bytes,
            flags,
            block_sizes,
        } = negotiate(reader.as_mut(), writer.as_mut(), export).await?;
        let waiting: Arc<Mutex<HashMap<u64, Waiter>>> = Arc::default();
        tokio::spawn(read_replies(reader, waiting.clone()));
        Ok(NbdClient {
            writer: tokio::sync::Mutex::new(writer),
            waiting,
            next_cookie: AtomicU64::new(1),
            size_bytes,
            transmission_flags: flags,
            block_sizes,
        })
    }

    async fn request(
        &self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        reply_bytes: u32,
    ) -> Result<Vec<u8>, NbdError> {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                cookie,
                Waiter {
                    length: reply_bytes,
                    reply: sender,
                },
            );
        let mut header = [0u8; 28];
        header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        header[4..6].copy_from_slice(&flags.to_be_bytes());
        header[6..8].copy_from_slice(&command.to_be_bytes());
        header[8..16].copy_from_slice(&cookie.to_be_bytes());
        header[16..24].copy_from_slice(&offset.to_be_bytes());
        header[24..28].copy_from_slice(&length.to_be_bytes());
        {
            let mut writer = self.writer.lock().await;
            writer.write_all(&header).await?;
            if !payload.is_empty() {
                writer.write_all(payload).await?;
            }
            writer.flush().await?;
        }
        receiver.await.map_err(|_| NbdError::Closed)?
    }

    pub async fn read(&self, offset: u64, length: u32) -> Result<Vec<u8>, NbdError> {
        self.request(CMD_READ, 0, offset, length, &[], length).await
    }

    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), NbdError> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.request(CMD_WRITE, flags, offset, data.len() as u32, data, 0)
            .await
            .map(drop)
    }

    pub async fn flush(&self) -> Result<(), NbdError> {
        self.request(CMD_FLUSH, 0, 0, 0, &[], 0).await.map(drop)
    }

    pub async fn trim(&self, offset: u64, length: u32) -> Result<(), NbdError> {
        self.request(CMD_TRIM, 0, offset, length, &[], 0)
            .await
            .map(drop)
    }

    pub async fn write_zeroes(&self, offset: u64, length: u32) -> Result<(), NbdError> {
        self.request(CMD_WRITE_ZEROES, 0, offset, length, &[], 0)
            .await
            .map(drop)
    }

    /// Say goodbye (NBD_CMD_DISC); the server finishes what is in flight.
    pub async fn disconnect(&self) -> Result<(), NbdError> {
        let mut header = [0u8; 28];
        header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        header[6..8].copy_from_slice(&CMD_DISC.to_be_bytes());
        let mut writer = self.writer.lock().await;
        writer.write_all(&header).await?;
        writer.flush().await?;
        writer.shutdown().await.ok();
        Ok(())
    }
}

/// What fixed newstyle negotiation with NBD_OPT_GO learnt of an export.
#[derive(Debug, Clone, Copy)]
pub struct Negotiated {
    pub size_bytes: u64,
    pub flags: u16,
    /// (minimum, preferred, maximum), if the server sent them.
    pub block_sizes: Option<(u32, u32, u32)>,
}

/// Fixed newstyle negotiation with NBD_OPT_GO (asking for block sizes), up
/// to the start of transmission; for any client of this crate's servers
/// and its peers.
pub async fn negotiate(
    reader: &mut (dyn AsyncRead + Send + Unpin),
    writer: &mut (dyn AsyncWrite + Send + Unpin),
    export: &str,
) -> Result<Negotiated, NbdError> {
    if reader.read_u64().await? != NBD_MAGIC || reader.read_u64().await? != IHAVEOPT {
        return Err(NbdError::Handshake(
            "not a fixed newstyle NBD server".into(),
        ));
    }
    let server_flags = reader.read_u16().await?;
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(NbdError::Handshake("server lacks fixed newstyle".into()));
    }
    writer
        .write_u32(u32::from(
            FLAG_FIXED_NEWSTYLE | (server_flags & FLAG_NO_ZEROES),
        ))
        .await?;
    let mut option = Vec::new();
    option.extend_from_slice(&(export.len() as u32).to_be_bytes());
    option.extend_from_slice(export.as_bytes());
    option.extend_from_slice(&1u16.to_be_bytes());
    option.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    writer.write_u64(IHAVEOPT).await?;
    writer.write_u32(OPT_GO).await?;
    writer.write_u32(option.len() as u32).await?;
    writer.write_all(&option).await?;
    writer.flush().await?;
    let (mut size_bytes, mut flags, mut block_sizes) = (0, 0, None);
    loop {
        let (reply, data) = read_option_reply(reader).await?;
        match reply {
            REP_ACK => break,
            REP_INFO
                if data.len() >= 12 && u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT =>
            {
                size_bytes = u64::from_be_bytes(data[2..10].try_into().unwrap_or_default());
                flags = u16::from_be_bytes([data[10], data[11]]);
            }
            REP_INFO
                if data.len() >= 14
                    && u16::from_be_bytes([data[0], data[1]]) == INFO_BLOCK_SIZE =>
            {
                let word =
                    |at: usize| u32::from_be_bytes(data[at..at + 4].try_into().unwrap_or_default());
                block_sizes = Some((word(2), word(6), word(10)));
            }
            REP_INFO => {}
            error if error & 0x8000_0000 != 0 => {
                let message = String::from_utf8_lossy(&data).into_owned();
                return Err(NbdError::Handshake(format!(
                    "export {export:?} refused: {message} (reply {error:#x})"
                )));
            }
            other => {
                return Err(NbdError::Handshake(format!(
                    "unexpected option reply {other}"
                )))
            }
        }
    }
    Ok(Negotiated {
        size_bytes,
        flags,
        block_sizes,
    })
}

async fn read_option_reply(
    reader: &mut (dyn AsyncRead + Send + Unpin),
) -> Result<(u32, Vec<u8>), NbdError> {
    if reader.read_u64().await? != OPTION_REPLY_MAGIC {
        return Err(NbdError::Handshake("bad option reply magic".into()));
    }
    let _option = reader.read_u32().await?;
    let reply = reader.read_u32().await?;
    let length = reader.read_u32().await?;
    if length > OPTION_REPLY_MAX_BYTES {
        return Err(NbdError::Handshake(format!(
            "option reply of {length} bytes"
        )));
    }
    let mut data = vec![0u8; length as usize];
    reader.read_exact(&mut data).await?;
    Ok((reply, data))
}

/// Match replies to waiting requests until the connection ends; then fail
/// whatever still waits.
async fn read_replies(
    mut reader: Box<dyn AsyncRead + Send + Unpin>,
    waiting: Arc<Mutex<HashMap<u64, Waiter>>>,
) {
    loop {
        let mut header = [0u8; 16];
        if reader.read_exact(&mut header).await.is_err() {
            break;
        }
        let magic = u32::from_be_bytes(header[0..4].try_into().unwrap_or_default());
        let errno = u32::from_be_bytes(header[4..8].try_into().unwrap_or_default());
        let cookie = u64::from_be_bytes(header[8..16].try_into().unwrap_or_default());
        let waiter = waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&cookie);
        let Some(waiter) = waiter else { break };
        if magic != SIMPLE_REPLY_MAGIC {
            let _ = waiter
                .reply
                .send(Err(NbdError::Handshake("unexpected reply magic".into())));
            break;
        }
        if errno != 0 {
            let _ = waiter.reply.send(Err(NbdError::Server { errno }));
            continue;
        }
        let mut data = vec![0u8; waiter.length as usize];
        if reader.read_exact(&mut data).await.is_err() {
            let _ = waiter.reply.send(Err(NbdError::Closed));
            break;
        }
        let _ = waiter.reply.send(Ok(data));
    }
    waiting.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

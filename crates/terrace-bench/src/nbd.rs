//! The generator's own NBD client: pipelined, batched, buffered.
//!
//! A general client (`terrace_export::client`) writes each request with
//! its own system call and reads each reply header and payload with two
//! more; at tens of thousands of requests per second on one connection
//! those calls are the generator's whole cost, and the generator must not
//! be the bottleneck. Here:
//!
//! ```text
//!   read()/write() ──append header (+ payload)──▶ out buffer ──┐
//!        │           register cookie → waiter                  │ wake
//!        ▼                                                     ▼
//!   oneshot ◀── reader task ◀── 1 MiB buffer ◀── socket ◀── writer task:
//!               (many replies per read call)                one write call
//!                                                           for every request
//!                                                           appended since
//! ```
//!
//! On the generator's single-threaded runtime every request issued in one
//! poll of the generator lands in the buffer before the writer task runs,
//! so they leave in one system call; the reader parses as many replies as
//! one read returned. The buffer holds at most what is in flight, which
//! the generator bounds (outstanding I/Os × request size).
//!
//! Only what the generator needs: fixed newstyle handshake with NBD_OPT_GO
//! (asking for block sizes), simple replies, read, write, flush, disconnect.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use terrace_export::client::{negotiate, NbdError};
use terrace_export::protocol::{
    NBD_CMD_DISC, NBD_CMD_FLUSH, NBD_CMD_READ, NBD_CMD_WRITE, NBD_REQUEST_MAGIC,
    NBD_SIMPLE_REPLY_MAGIC,
};
use terrace_io::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;

/// Reply buffer: 1 MiB holds hundreds of small replies, so one read call
/// serves many completions; larger payloads bypass it.
const READ_BUFFER_BYTES: usize = 1 << 20;
const REQUEST_HEADER_BYTES: usize = 28;

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;
type Reply = Result<Bytes, NbdError>;

struct Waiter {
    reply_bytes: u32,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct State {
    /// Requests not yet handed to the socket.
    out: Vec<u8>,
    waiting: HashMap<u64, Waiter>,
    next_cookie: u64,
    /// The connection failed or was closed: no new requests.
    closed: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake_writer: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fail everything that waits and refuse what comes.
    fn close(&self) {
        let waiting = {
            let mut state = self.lock();
            state.closed = true;
            std::mem::take(&mut state.waiting)
        };
        for (_, waiter) in waiting {
            let _ = waiter.reply.send(Err(NbdError::Closed));
        }
    }
}

/// One NBD connection with any number of requests in flight.
pub struct PipelinedNbd {
    shared: Arc<Shared>,
    pub size_bytes: u64,
    /// (minimum, preferred, maximum) as the server advertised them.
    pub block_sizes: Option<(u32, u32, u32)>,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for PipelinedNbd {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// `nbd://host[:port]/export` or `nbd+unix:///export?socket=PATH`.
fn parse_uri(uri: &str) -> Result<(Option<String>, Option<String>, String), NbdError> {
    let bad = || NbdError::Uri(uri.to_string());
    if let Some(rest) = uri.strip_prefix("nbd+unix://") {
        let (path, query) = rest.split_once('?').ok_or_else(bad)?;
        let socket = query.strip_prefix("socket=").ok_or_else(bad)?;
        let export = path.trim_start_matches('/').to_string();
        return Ok((None, Some(socket.to_string()), export));
    }
    let rest = uri.strip_prefix("nbd://").ok_or_else(bad)?;
    let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
    let address = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:10809")
    };
    Ok((Some(address), None, export.to_string()))
}

impl PipelinedNbd {
    /// Connect, negotiate, and start the reader and writer tasks on the
    /// current runtime.
    pub async fn connect(uri: &str) -> Result<PipelinedNbd, NbdError> {
        let (mut reader, mut writer): (Reader, Writer) = match parse_uri(uri)? {
            (Some(address), _, _) => {
                let stream = tokio::net::TcpStream::connect(address).await?;
                stream.set_nodelay(true)?;
                let (reader, writer) = stream.into_split();
                (Box::new(reader), Box::new(writer))
            }
            (None, socket, _) => {
                let path = socket.unwrap_or_default();
                let (reader, writer) = tokio::net::UnixStream::connect(path).await?.into_split();
                (Box::new(reader), Box::new(writer))
            }
        };
        let export = parse_uri(uri)?.2;
        let (size_bytes, block_sizes) = handshake(&mut reader, &mut writer, &export).await?;
        let shared = Arc::new(Shared::default());
        let tasks = [
            tokio::spawn(read_replies(shared.clone(), reader)),
            tokio::spawn(write_requests(shared.clone(), writer)),
        ];
        Ok(PipelinedNbd {
            shared,
            size_bytes,
            block_sizes,
            tasks,
        })
    }

    /// Queue one request; `None` for the reply when none is expected.
    fn submit(
        &self,
        command: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        reply_bytes: Option<u32>,
    ) -> Result<Option<oneshot::Receiver<Reply>>, NbdError> {
        let mut state = self.shared.lock();
        if state.closed {
            return Err(NbdError::Closed);
        }
        let cookie = state.next_cookie;
        state.next_cookie += 1;
        let out = &mut state.out;
        out.reserve(REQUEST_HEADER_BYTES + payload.len());
        out.extend_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&command.to_be_bytes());
        out.extend_from_slice(&cookie.to_be_bytes());
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(payload);
        let receiver = reply_bytes.map(|reply_bytes| {
            let (sender, receiver) = oneshot::channel();
            let waiter = Waiter {
                reply_bytes,
                reply: sender,
            };
            state.waiting.insert(cookie, waiter);
            receiver
        });
        drop(state);
        self.shared.wake_writer.notify_one();
        Ok(receiver)
    }

    fn answer(
        &self,
        command: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        reply_bytes: u32,
    ) -> impl Future<Output = Reply> + Send + 'static {
        let submitted = self.submit(command, offset, length, payload, Some(reply_bytes));
        async move {
            match submitted? {
                Some(receiver) => receiver.await.map_err(|_| NbdError::Closed)?,
                None => Err(NbdError::Closed),
            }
        }
    }

    pub fn read(&self, offset: u64, length: u32) -> impl Future<Output = Reply> + Send + 'static {
        self.answer(NBD_CMD_READ, offset, length, &[], length)
    }

    pub fn write(
        &self,
        offset: u64,
        data: &[u8],
    ) -> impl Future<Output = Result<(), NbdError>> + Send + 'static {
        let reply = self.answer(NBD_CMD_WRITE, offset, data.len() as u32, data, 0);
        async move { reply.await.map(drop) }
    }

    pub fn flush(&self) -> impl Future<Output = Result<(), NbdError>> + Send + 'static {
        let reply = self.answer(NBD_CMD_FLUSH, 0, 0, &[], 0);
        async move { reply.await.map(drop) }
    }

    /// Say goodbye (NBD_CMD_DISC) once what is queued has been sent.
    pub async fn disconnect(&self) -> Result<(), NbdError> {
        self.submit(NBD_CMD_DISC, 0, 0, &[], None)?;
        // The writer sends the queue in order; wait until it has taken it.
        while !self.shared.lock().out.is_empty() {
            tokio::task::yield_now().await;
        }
        self.shared.close();
        Ok(())
    }
}

/// Send whatever was queued since the last write, in one call.
async fn write_requests(shared: Arc<Shared>, mut writer: Writer) {
    let mut sending = Vec::new();
    loop {
        shared.wake_writer.notified().await;
        std::mem::swap(&mut shared.lock().out, &mut sending);
        if sending.is_empty() {
            continue;
        }
        if writer.write_all(&sending).await.is_err() || writer.flush().await.is_err() {
            shared.close();
            return;
        }
        sending.clear();
    }
}

/// Match replies to waiters until the connection ends.
async fn read_replies(shared: Arc<Shared>, reader: Reader) {
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let mut header = [0u8; 16];
    while reader.read_exact(&mut header).await.is_ok() {
        let word =
            |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().unwrap_or_default());
        let (magic, errno) = (word(0), word(4));
        let cookie = u64::from_be_bytes(header[8..16].try_into().unwrap_or_default());
        let Some(waiter) = shared.lock().waiting.remove(&cookie) else {
            break;
        };
        if magic != NBD_SIMPLE_REPLY_MAGIC {
            let _ = waiter.reply.send(Err(NbdError::Handshake(format!(
                "reply magic {magic:#x} is not a simple reply"
            ))));
            break;
        }
        if errno != 0 {
            let _ = waiter.reply.send(Err(NbdError::Server { errno }));
            continue;
        }
        let mut data = vec![0u8; waiter.reply_bytes as usize];
        if reader.read_exact(&mut data).await.is_err() {
            let _ = waiter.reply.send(Err(NbdError::Closed));
            break;
        }
        let _ = waiter.reply.send(Ok(Bytes::from(data)));
    }
    shared.close();
}

/// Fixed newstyle negotiation with NBD_OPT_GO; returns the export's size
/// and block sizes.
async fn handshake(
    reader: &mut Reader,
    writer: &mut Writer,
    export: &str,
) -> Result<(u64, Option<(u32, u32, u32)>), NbdError> {
    let negotiated = negotiate(reader.as_mut(), writer.as_mut(), export).await?;
    if negotiated.size_bytes == 0 {
        return Err(NbdError::Handshake(
            "the server did not say the export's size".into(),
        ));
    }
    Ok((negotiated.size_bytes, negotiated.block_sizes))
}

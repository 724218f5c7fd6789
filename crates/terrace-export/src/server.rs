//! Listening, connections and shutdown.
//!
//! ```text
//!   serve_tcp / serve_unix ── accept ──▶ connection task ──▶ handshake ──▶ transmission
//!          │                               (one per client,                 async: reader, writer,
//!          │                                in a JoinSet)                    request tasks; or
//!          │                                                                 threaded: a few OS
//!          │                                                                 threads of its own
//!          └── shutdown: stop accepting, wait for every connection task
//! ```
//!
//! [`ServerOptions::threads_per_connection`] chooses the transmission mode
//! for sockets (see `threaded.rs` for why threads are faster); streams that
//! are not sockets ([`Server::serve_connection`]) always use async mode.
//!
//! Shutdown is a `watch` channel turning `true`. The accept loop stops and
//! drops its listener; each connection notices on its own: between options
//! the handshake closes, and in transmission the connection answers new
//! requests with `NBD_ESHUTDOWN` until its in-flight requests are done, then
//! closes (proto.md "Terminating the transmission phase"). A connection that
//! is still busy [`ServerOptions::shutdown_grace`] after shutdown began (a
//! backend that hangs, a client that stopped reading) is dropped, which
//! aborts its tasks (in threaded mode: drops its backend operations and
//! shuts its socket, which ends its threads), so shutdown always finishes.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::error::ConnectionError;
use crate::requests::{Session, WRITE_DISCARD_MAX_BYTES};
use crate::threaded::{BlockingSocket, THREADS_PER_CONNECTION_MAX};
use crate::workers::{Detached, Workers};
use crate::{handshake, threaded, transmission, Catalog};

/// Socket read buffer per connection: requests are 28 bytes, so one read
/// takes in a whole pipeline of them; write payloads larger than this
/// bypass it and go straight into their own buffer.
pub(crate) const READ_BUFFER_BYTES: usize = 128 << 10;

/// Socket write buffer per connection: gathers many small replies into one
/// system call; replies carrying `DIRECT_PAYLOAD_MIN` bytes of read data or
/// more are written past it (async mode).
const WRITE_BUFFER_BYTES: usize = 128 << 10;

/// Pause after an accept error that is not about one failed connection
/// (e.g. out of file descriptors): long enough not to spin, short enough
/// that service resumes promptly once connections close.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Consecutive such errors after which the listener is considered broken
/// and the serve call returns the error: a minute of failing without a
/// single success ([`ACCEPT_RETRY_PAUSE`] × 600).
const ACCEPT_FAILURES_MAX: u32 = 600;

/// Upper bound on `max_in_flight_per_connection`: far beyond any client's
/// queue depth (the Linux client uses 128 per connection), and small enough
/// for the semaphore's count.
const MAX_IN_FLIGHT_CEILING: usize = 1 << 16;

/// Lower bound on `max_payload_bytes`: the spec requires the maximum
/// payload to be at least the preferred block size, which is at least 512;
/// 4096 keeps every common preferred size valid.
const MIN_PAYLOAD_FLOOR: u32 = 4096;

/// Tuning of a [`Server`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerOptions {
    /// Requests one connection may have in progress (read and not yet
    /// answered); the reader stops reading while this many are. Together
    /// with `max_payload_bytes` it bounds the memory a client can pin:
    /// 128 × 32 MiB in the worst case by default. Clamped to 1..=65536.
    pub max_in_flight_per_connection: usize,
    /// Largest `NBD_CMD_READ`/`NBD_CMD_WRITE` payload served, and the
    /// maximum advertised with `NBD_INFO_BLOCK_SIZE` (lowered further if the
    /// backend's maximum is smaller). Default 32 MiB, the spec's portable
    /// limit. Clamped to 4 KiB..=64 MiB.
    pub max_payload_bytes: u32,
    /// How long connections may take to finish after shutdown begins
    /// before they are dropped. Default 30 s.
    pub shutdown_grace: Duration,
    /// Threads that serve connections, each with its own single-threaded
    /// runtime (see `workers.rs`); 0 serves them on the caller's runtime.
    /// Clamped to at most 256.
    pub connection_threads: usize,
    /// Threads that serve each connection on a socket once its handshake
    /// is done, each taking one whole request at a time (see
    /// `threaded.rs`); 0 serves transmission with tasks instead (async
    /// mode). The in-flight limit of such a connection is the smaller of
    /// this and `max_in_flight_per_connection`. Clamped to at most 64.
    pub threads_per_connection: usize,
}

impl Default for ServerOptions {
    fn default() -> ServerOptions {
        ServerOptions {
            max_in_flight_per_connection: 128,
            max_payload_bytes: 32 << 20,
            shutdown_grace: Duration::from_secs(30),
            connection_threads: 0,
            threads_per_connection: 0,
        }
    }
}

impl ServerOptions {
    fn clamped(self) -> ServerOptions {
        ServerOptions {
            max_in_flight_per_connection: self
                .max_in_flight_per_connection
                .clamp(1, MAX_IN_FLIGHT_CEILING),
            max_payload_bytes: self
                .max_payload_bytes
                .clamp(MIN_PAYLOAD_FLOOR, WRITE_DISCARD_MAX_BYTES),
            shutdown_grace: self.shutdown_grace,
            connection_threads: self.connection_threads.min(CONNECTION_THREADS_MAX),
            threads_per_connection: self.threads_per_connection.min(THREADS_PER_CONNECTION_MAX),
        }
    }
}

/// Upper bound on connection threads: more than any machine's cores.
const CONNECTION_THREADS_MAX: usize = 256;

/// An NBD server for the exports of one [`Catalog`]. Cheap to clone; clones
/// serve the same catalog.
#[derive(Clone)]
pub struct Server {
    catalog: Arc<dyn Catalog>,
    options: ServerOptions,
    offload: Option<tokio::runtime::Handle>,
    thread_start: Option<fn()>,
}

impl Server {
    pub fn new(catalog: Arc<dyn Catalog>, options: ServerOptions) -> Server {
        Server {
            catalog,
            options: options.clamped(),
            offload: None,
            thread_start: None,
        }
    }

    /// Run `hook` on each connection thread (see
    /// [`ServerOptions::connection_threads`]) as it starts, before it serves
    /// anything: for settings that belong to the thread, such as handing
    /// its device submissions off to other threads.
    pub fn on_connection_thread_start(mut self, hook: fn()) -> Server {
        self.thread_start = Some(hook);
        self
    }

    pub(crate) fn connection_thread_start(&self) -> Option<fn()> {
        self.thread_start
    }

    /// Run requests of 256 KiB and more on `runtime` (a multi-thread
    /// runtime), where their copying can use every core; useful with
    /// [`ServerOptions::connection_threads`], which keeps each connection
    /// on one thread.
    pub fn with_offload(mut self, runtime: tokio::runtime::Handle) -> Server {
        self.offload = Some(runtime);
        self
    }

    /// The options in effect (after clamping).
    pub fn options(&self) -> ServerOptions {
        self.options
    }

    /// Accepts TCP connections (with `TCP_NODELAY`, as the spec asks) until
    /// `shutdown` turns true; then stops accepting, lets every connection
    /// finish its in-flight requests (new ones get `NBD_ESHUTDOWN`), closes
    /// them, and returns. Returns an error only if the listener keeps
    /// failing; connections already open then carry on until shutdown.
    pub async fn serve_tcp(
        &self,
        listener: TcpListener,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        self.serve(listener, shutdown).await
    }

    /// [`Server::serve_tcp`] for a Unix domain socket.
    pub async fn serve_unix(
        &self,
        listener: UnixListener,
        shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        self.serve(listener, shutdown).await
    }

    /// Serves one connection, handshake to close, on any byte stream (tests,
    /// custom transports), in async mode. Returns `Ok` when the client ended
    /// the session (`NBD_OPT_ABORT`, `NBD_CMD_DISC`, or closing between
    /// messages) or shutdown closed it cleanly.
    pub async fn serve_connection<S>(
        &self,
        stream: S,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), ConnectionError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let work = async {
            let Some((session, stream)) = self.negotiate(stream, &shutdown).await? else {
                return Ok(());
            };
            transmission::transmit(
                stream.reader,
                stream.writer,
                session,
                self.options.max_in_flight_per_connection,
                shutdown.clone(),
                self.offload.clone(),
            )
            .await
        };
        self.within_grace(work, shutdown.clone()).await
    }

    /// [`Server::serve_connection`] for a TCP or Unix socket, in the
    /// transmission mode [`ServerOptions::threads_per_connection`] selects;
    /// in threaded mode it returns only after the connection's threads
    /// have ended. This is what [`Server::serve_tcp`] and
    /// [`Server::serve_unix`] run for each accepted connection.
    pub async fn serve_socket<S: Socket>(
        &self,
        stream: S,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), ConnectionError> {
        let threads = self
            .options
            .threads_per_connection
            .min(self.options.max_in_flight_per_connection);
        if threads == 0 {
            return self.serve_connection(stream, shutdown).await;
        }
        let negotiated = self.negotiate(stream, &shutdown);
        let Some((session, stream)) = self.within_grace(negotiated, shutdown.clone()).await? else {
            return Ok(());
        };
        let (stream, leftover) = stream.into_parts();
        let socket = stream.into_blocking()?;
        let limits = (
            self.options.max_in_flight_per_connection,
            self.options.shutdown_grace,
        );
        threaded::transmit(socket, &leftover, session, threads, limits, shutdown).await
    }

    /// The handshake; `Some` when transmission is to begin. A connection
    /// that ends here has been closed politely.
    async fn negotiate<S>(
        &self,
        stream: S,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<Option<(Session, Negotiated<S>)>, ConnectionError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(stream);
        let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, read_half);
        let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, write_half);
        let catalog = self.catalog.as_ref();
        let mut watcher = shutdown.clone();
        let session = handshake::negotiate(
            &mut reader,
            &mut writer,
            catalog,
            &self.options,
            &mut watcher,
        )
        .await?;
        match session {
            Some(session) => Ok(Some((session, Negotiated { reader, writer }))),
            None => {
                // Flushes anything pending (the ACK to NBD_OPT_ABORT) and
                // closes our direction; the client may already be gone.
                let _ = writer.shutdown().await;
                Ok(None)
            }
        }
    }

    /// Runs `work`; once shutdown begins, gives it
    /// [`ServerOptions::shutdown_grace`] to finish before dropping it.
    async fn within_grace<T>(
        &self,
        work: impl Future<Output = Result<T, ConnectionError>>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<T, ConnectionError> {
        tokio::pin!(work);
        tokio::select! {
            result = &mut work => result,
            _ = shutdown_requested(&mut shutdown) => {
                let grace = self.options.shutdown_grace;
                tokio::time::timeout(grace, work).await.unwrap_or(Err(ConnectionError::ShutdownTimeout(grace)))
            }
        }
    }

    async fn serve<L: Acceptor>(
        &self,
        listener: L,
        mut shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        let mut connections = JoinSet::new();
        let mut workers = match self.options.connection_threads {
            0 => None,
            count => Some(Workers::start(self, count, &shutdown)?),
        };
        let mut failures = 0;
        let outcome = loop {
            let accepted = tokio::select! {
                biased;
                _ = shutdown_requested(&mut shutdown) => break Ok(()),
                accepted = listener.next_stream() => accepted,
            };
            while connections.try_join_next().is_some() {}
            match accepted {
                Ok(stream) => {
                    failures = 0;
                    if let Some(workers) = workers.as_mut() {
                        if let Ok(detached) = L::detach(stream) {
                            workers.dispatch(detached).await;
                        }
                        continue;
                    }
                    let (server, stop) = (self.clone(), shutdown.clone());
                    // The outcome of one connection concerns only that
                    // client; the server carries on either way.
                    connections.spawn(async move { server.serve_socket(stream, stop).await });
                }
                Err(error) if is_per_connection(&error) => {}
                Err(error) => {
                    failures += 1;
                    if failures >= ACCEPT_FAILURES_MAX {
                        break Err(error);
                    }
                    tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                }
            }
        };
        drop(listener);
        if let Some(workers) = workers {
            workers.finish().await;
        }
        if outcome.is_ok() {
            while connections.join_next().await.is_some() {}
        } else {
            connections.detach_all();
        }
        outcome
    }
}

/// Accept errors that concern only the connection being accepted.
fn is_per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// Resolves once shutdown is requested. If the sender is dropped without
/// requesting it, nobody can request it any more: never resolves.
pub(crate) async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    if shutdown.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A stream as the handshake left it: buffered both ways.
struct Negotiated<S> {
    reader: BufReader<ReadHalf<S>>,
    writer: BufWriter<WriteHalf<S>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Negotiated<S> {
    /// The stream again, and the bytes the handshake read beyond its last
    /// option (requests a client pipelined after `NBD_OPT_GO`). Nothing is
    /// left to write: the handshake flushes after every option.
    fn into_parts(self) -> (S, Vec<u8>) {
        debug_assert!(self.writer.buffer().is_empty());
        let leftover = self.reader.buffer().to_vec();
        let stream = self.reader.into_inner().unsplit(self.writer.into_inner());
        (stream, leftover)
    }
}

/// A socket that [`Server::serve_socket`] can hand over to threads: a tokio
/// [`TcpStream`] or [`UnixStream`].
pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send + 'static + sealed::IntoBlocking {}

mod sealed {
    use super::*;

    /// Release from the runtime, for threaded transmission.
    pub trait IntoBlocking {
        fn into_blocking(self) -> io::Result<BlockingSocket>;
    }
}

impl Socket for TcpStream {}

impl sealed::IntoBlocking for TcpStream {
    fn into_blocking(self) -> io::Result<BlockingSocket> {
        self.into_std().map(BlockingSocket::Tcp)
    }
}

impl Socket for UnixStream {}

impl sealed::IntoBlocking for UnixStream {
    fn into_blocking(self) -> io::Result<BlockingSocket> {
        self.into_std().map(BlockingSocket::Unix)
    }
}

/// A listening socket, as the accept loop needs it.
trait Acceptor: Send + Sync {
    type Stream: Socket;
    fn next_stream(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
    /// Release an accepted stream from this runtime, for a connection thread.
    fn detach(stream: Self::Stream) -> io::Result<Detached>;
}

impl Acceptor for TcpListener {
    type Stream = TcpStream;

    async fn next_stream(&self) -> io::Result<TcpStream> {
        let (stream, _) = self.accept().await?;
        // Replies are often smaller than a segment; Nagle would hold them
        // back waiting for the client's ACK. Failing to set the option
        // costs only latency, so the connection is served anyway.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    fn detach(stream: TcpStream) -> io::Result<Detached> {
        stream.into_std().map(Detached::Tcp)
    }
}

impl Acceptor for UnixListener {
    type Stream = UnixStream;

    async fn next_stream(&self) -> io::Result<UnixStream> {
        let (stream, _) = self.accept().await?;
        Ok(stream)
    }

    fn detach(stream: UnixStream) -> io::Result<Detached> {
        stream.into_std().map(Detached::Unix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_clamped_to_workable_values() {
        let wild = ServerOptions {
            max_in_flight_per_connection: 0,
            max_payload_bytes: u32::MAX,
            shutdown_grace: Duration::ZERO,
            connection_threads: 100_000,
            threads_per_connection: 100_000,
        };
        let clamped = wild.clamped();
        assert_eq!(clamped.max_in_flight_per_connection, 1);
        assert_eq!(clamped.max_payload_bytes, WRITE_DISCARD_MAX_BYTES);
        assert_eq!(clamped.connection_threads, CONNECTION_THREADS_MAX);
        assert_eq!(clamped.threads_per_connection, THREADS_PER_CONNECTION_MAX);
        assert_eq!(
            ServerOptions {
                max_payload_bytes: 1,
                ..wild
            }
            .clamped()
            .max_payload_bytes,
            MIN_PAYLOAD_FLOOR
        );
        assert_eq!(ServerOptions::default().clamped(), ServerOptions::default());
    }
}

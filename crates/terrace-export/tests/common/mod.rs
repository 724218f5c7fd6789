//! Test support: an in-memory backend and catalog, a server on an
//! ephemeral port, a raw NBD client that speaks the wire format byte by
//! byte (its constants are written out here independently of the crate's
//! `protocol` module, so a wrong constant there cannot hide), and a runner
//! for external NBD tools.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use terrace_export::{Backend, BlockSizes, Catalog, Errno, Extent, Server, ServerOptions};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------
// Backend.

/// Granularity of the memory backend's allocation map: a granule that
/// holds only zeroes is reported as a hole.
pub const GRANULE: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    WriteZeroes,
    Trim,
    Flush,
    Cache,
    BlockStatus,
}

/// One backend call, as the server made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub op: Op,
    pub offset: u64,
    pub length: u64,
    pub fua: bool,
    pub may_trim: bool,
    pub fast: bool,
}

type DelayFn = dyn Fn(Op, u64) -> Duration + Send + Sync;
type FailFn = dyn Fn(&Call) -> Option<Errno> + Send + Sync;

struct State {
    data: Mutex<Vec<u8>>,
    calls: Mutex<Vec<Call>>,
    running: AtomicUsize,
    most_running: AtomicUsize,
    delay: Box<DelayFn>,
    fail: Box<FailFn>,
    /// Operations of this kind wait for a permit before they run.
    gate: Option<(Op, tokio::sync::Semaphore)>,
}

/// A `Vec<u8>` behind a mutex, with optional per-operation delays and
/// failures, a log of calls, and a count of operations running at once.
pub struct MemoryBackend {
    state: Arc<State>,
    read_only: bool,
    description: String,
}

impl MemoryBackend {
    pub fn new(size: usize) -> MemoryBackend {
        MemoryBackend::build(size, false, |_, _| Duration::ZERO, |_| None)
    }

    pub fn read_only(size: usize) -> MemoryBackend {
        MemoryBackend::build(size, true, |_, _| Duration::ZERO, |_| None)
    }

    pub fn build(
        size: usize,
        read_only: bool,
        delay: impl Fn(Op, u64) -> Duration + Send + Sync + 'static,
        fail: impl Fn(&Call) -> Option<Errno> + Send + Sync + 'static,
    ) -> MemoryBackend {
        MemoryBackend {
            state: Arc::new(State {
                data: Mutex::new(vec![0; size]),
                calls: Mutex::new(Vec::new()),
                running: AtomicUsize::new(0),
                most_running: AtomicUsize::new(0),
                delay: Box::new(delay),
                fail: Box::new(fail),
                gate: None,
            }),
            read_only,
            description: format!("memory, {size} bytes"),
        }
    }

    /// A backend whose `op` operations each wait for [`MemoryBackend::release`].
    pub fn gated(size: usize, op: Op) -> MemoryBackend {
        let mut backend = MemoryBackend::new(size);
        let state = Arc::get_mut(&mut backend.state).unwrap();
        state.gate = Some((op, tokio::sync::Semaphore::new(0)));
        backend
    }

    /// Lets `count` more gated operations through.
    pub fn release(&self, count: usize) {
        if let Some((_, gate)) = &self.state.gate {
            gate.add_permits(count);
        }
    }

    pub fn contents(&self, offset: u64, length: usize) -> Vec<u8> {
        let data = self.state.data.lock().unwrap();
        data[offset as usize..offset as usize + length].to_vec()
    }

    pub fn fill(&self, offset: u64, bytes: &[u8]) {
        let mut data = self.state.data.lock().unwrap();
        data[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.calls.lock().unwrap().clone()
    }

    pub fn count(&self, op: Op) -> usize {
        self.calls().iter().filter(|call| call.op == op).count()
    }

    /// Most operations that were running at the same time.
    pub fn most_running(&self) -> usize {
        self.state.most_running.load(Ordering::SeqCst)
    }

    /// Operations running now (started, not finished or dropped).
    pub fn running(&self) -> usize {
        self.state.running.load(Ordering::SeqCst)
    }

    fn run<T: Send + 'static>(
        &self,
        call: Call,
        work: impl FnOnce(&mut Vec<u8>) -> T + Send + 'static,
    ) -> BoxFuture<'static, Result<T, Errno>> {
        let state = self.state.clone();
        async move {
            state.calls.lock().unwrap().push(call);
            let _running = Running::new(&state);
            if let Some((op, gate)) = &state.gate {
                if *op == call.op {
                    gate.acquire().await.unwrap().forget();
                }
            }
            let delay = (state.delay)(call.op, call.offset);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if let Some(errno) = (state.fail)(&call) {
                return Err(errno);
            }
            let mut data = state.data.lock().unwrap();
            Ok(work(&mut data))
        }
        .boxed()
    }
}

/// Counts an operation as running while alive (dropped futures included).
struct Running<'a>(&'a State);

impl<'a> Running<'a> {
    fn new(state: &'a State) -> Running<'a> {
        let now = state.running.fetch_add(1, Ordering::SeqCst) + 1;
        state.most_running.fetch_max(now, Ordering::SeqCst);
        Running(state)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

fn call(op: Op, offset: u64, length: u64) -> Call {
    Call {
        op,
        offset,
        length,
        fua: false,
        may_trim: false,
        fast: false,
    }
}

impl Backend for MemoryBackend {
    fn size_bytes(&self) -> u64 {
        self.state.data.lock().unwrap().len() as u64
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum: 512,
            preferred: 4096,
            maximum: 32 << 20,
        }
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn read(&self, offset: u64, length: u32) -> BoxFuture<'static, Result<Bytes, Errno>> {
        self.run(call(Op::Read, offset, u64::from(length)), move |data| {
            Bytes::copy_from_slice(&data[offset as usize..offset as usize + length as usize])
        })
    }

    fn write(&self, offset: u64, bytes: Bytes, fua: bool) -> BoxFuture<'static, Result<(), Errno>> {
        let call = Call {
            fua,
            ..call(Op::Write, offset, bytes.len() as u64)
        };
        self.run(call, move |data| {
            data[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes)
        })
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        may_trim: bool,
        fast: bool,
    ) -> BoxFuture<'static, Result<(), Errno>> {
        let call = Call {
            fua,
            may_trim,
            fast,
            ..call(Op::WriteZeroes, offset, length)
        };
        self.run(call, move |data| {
            data[offset as usize..(offset + length) as usize].fill(0)
        })
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<'static, Result<(), Errno>> {
        let call = Call {
            fua,
            ..call(Op::Trim, offset, length)
        };
        self.run(call, move |data| {
            data[offset as usize..(offset + length) as usize].fill(0)
        })
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), Errno>> {
        self.run(call(Op::Flush, 0, 0), |_| ())
    }

    fn cache(&self, offset: u64, length: u64) -> BoxFuture<'static, Result<(), Errno>> {
        self.run(call(Op::Cache, offset, length), |_| ())
    }

    fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> BoxFuture<'static, Result<Vec<Extent>, Errno>> {
        self.run(call(Op::BlockStatus, offset, length), move |data| {
            allocation_map(data, offset, length)
        })
    }
}

/// Extents from `offset` covering at least `length` bytes (or up to the
/// end): granules holding only zeroes are holes that read as zeroes.
fn allocation_map(data: &[u8], offset: u64, length: u64) -> Vec<Extent> {
    let size = data.len() as u64;
    let end = (offset + length).min(size);
    let mut extents: Vec<Extent> = Vec::new();
    let mut at = offset;
    while at < end {
        let granule_end = ((at / GRANULE + 1) * GRANULE).min(size);
        let zero = data[at as usize..granule_end as usize]
            .iter()
            .all(|&b| b == 0);
        let flags = if zero { 3 } else { 0 };
        let piece = (granule_end - at) as u32;
        match extents.last_mut() {
            Some(last) if last.flags == flags => last.length += piece,
            _ => extents.push(Extent {
                length: piece,
                flags,
            }),
        }
        at = granule_end;
    }
    extents
}

// ---------------------------------------------------------------------------
// Catalog.

/// Exports by name; the empty name opens the first one.
pub struct MemoryCatalog {
    exports: Vec<(String, Arc<MemoryBackend>)>,
}

impl MemoryCatalog {
    pub fn new(exports: Vec<(&str, Arc<MemoryBackend>)>) -> Arc<MemoryCatalog> {
        Arc::new(MemoryCatalog {
            exports: exports
                .into_iter()
                .map(|(name, b)| (name.to_string(), b))
                .collect(),
        })
    }
}

impl Catalog for MemoryCatalog {
    fn list(&self) -> Vec<(String, String)> {
        self.exports
            .iter()
            .map(|(name, backend)| (name.clone(), backend.description()))
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Backend>> {
        let found = if name.is_empty() {
            self.exports.first()
        } else {
            self.exports.iter().find(|(export, _)| export == name)
        };
        found.map(|(_, backend)| backend.clone() as Arc<dyn Backend>)
    }
}

// ---------------------------------------------------------------------------
// Transmission modes.

/// Threads per connection in threaded mode: what the daemon uses.
pub const THREADS_PER_CONNECTION: usize = 4;

/// The two ways a server can serve a connection's transmission phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Tasks on the runtime (`threads_per_connection: 0`).
    Async,
    /// [`THREADS_PER_CONNECTION`] OS threads per connection.
    Threaded,
}

impl Mode {
    /// The default options, in this mode.
    pub fn options(self) -> ServerOptions {
        let threads_per_connection = match self {
            Mode::Async => 0,
            Mode::Threaded => THREADS_PER_CONNECTION,
        };
        ServerOptions {
            threads_per_connection,
            ..ServerOptions::default()
        }
    }
}

/// Turns each listed `async fn name(mode: Mode)` of a test file into two
/// tests, `async_mode::name` and `threaded::name`.
#[allow(unused_macros)]
macro_rules! in_both_modes {
    ($($name:ident),+ $(,)?) => {
        mod async_mode {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::common::Mode::Async).await
                }
            )+
        }

        mod threaded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::common::Mode::Threaded).await
                }
            )+
        }
    };
}

// ---------------------------------------------------------------------------
// Server harness.

pub struct TestServer {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<io::Result<()>>,
}

impl TestServer {
    pub async fn start(catalog: Arc<dyn Catalog>, options: ServerOptions) -> TestServer {
        TestServer::serve(Server::new(catalog, options)).await
    }

    /// A server whose large requests run on the current runtime's threads
    /// (as the daemon runs them), not on the connection's task.
    pub async fn start_offloaded(catalog: Arc<dyn Catalog>, options: ServerOptions) -> TestServer {
        let server = Server::new(catalog, options).with_offload(tokio::runtime::Handle::current());
        TestServer::serve(server).await
    }

    async fn serve(server: Server) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, shutdown) = watch::channel(false);
        let task = tokio::spawn(async move { server.serve_tcp(listener, shutdown).await });
        TestServer { addr, stop, task }
    }

    /// A server with one writable export "disk" of `size` bytes.
    pub async fn with_disk(size: usize, mode: Mode) -> (TestServer, Arc<MemoryBackend>) {
        let backend = Arc::new(MemoryBackend::new(size));
        let server = TestServer::start(
            MemoryCatalog::new(vec![("disk", backend.clone())]),
            mode.options(),
        )
        .await;
        (server, backend)
    }

    pub fn uri(&self, name: &str) -> String {
        format!("nbd://127.0.0.1:{}/{}", self.addr.port(), name)
    }

    pub fn request_shutdown(&self) {
        // Works whether or not the server is still listening.
        self.stop.send_replace(true);
    }

    /// Asks for shutdown and waits (at most `limit`) for `serve_tcp` to return.
    pub async fn stop_within(self, limit: Duration) -> io::Result<()> {
        self.request_shutdown();
        tokio::time::timeout(limit, self.task)
            .await
            .expect("the server did not stop in time")
            .unwrap()
    }

    pub async fn stop(self) {
        self.stop_within(Duration::from_secs(10)).await.unwrap();
    }
}

// ---------------------------------------------------------------------------
// Raw client. Every value below is spelled out from proto.md.

pub const NBDMAGIC: &[u8; 8] = b"NBDMAGIC";
pub const IHAVEOPT: &[u8; 8] = b"IHAVEOPT";
pub const OPTION_REPLY_MAGIC: u64 = 0x3e889045565a9;
pub const REQUEST_MAGIC: u32 = 0x25609513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x67446698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e33ef;

pub const C_FIXED_NEWSTYLE: u32 = 1;
pub const C_NO_ZEROES: u32 = 2;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_SHUTDOWN: u32 = 0x8000_0007;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const FLAG_HAS_FLAGS: u16 = 1;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

pub const REPLY_FLAG_DONE: u16 = 1;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = 0x8001;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// One option reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub data: Vec<u8>,
}

impl OptionReply {
    pub fn is_final(&self) -> bool {
        self.reply_type == REP_ACK || self.reply_type & 0x8000_0000 != 0
    }

    pub fn info_type(&self) -> u16 {
        u16::from_be_bytes([self.data[0], self.data[1]])
    }
}

/// What `NBD_OPT_INFO`/`GO` reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    pub block_sizes: Option<(u32, u32, u32)>,
    pub name: Option<String>,
    pub description: Option<String>,
}

/// A transmission-phase reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple {
        error: u32,
        cookie: u64,
        data: Vec<u8>,
    },
    Chunk {
        flags: u16,
        kind: u16,
        cookie: u64,
        payload: Vec<u8>,
    },
}

impl Reply {
    pub fn cookie(&self) -> u64 {
        match self {
            Reply::Simple { cookie, .. } | Reply::Chunk { cookie, .. } => *cookie,
        }
    }

    /// The data of a successful read: a simple reply's payload, or the data
    /// of a single final `NBD_REPLY_TYPE_OFFSET_DATA` chunk for `offset`.
    pub fn read_data(self, offset: u64) -> Vec<u8> {
        match self {
            Reply::Simple { error: 0, data, .. } => data,
            Reply::Chunk {
                flags: REPLY_FLAG_DONE,
                kind: REPLY_TYPE_OFFSET_DATA,
                payload,
                ..
            } => {
                assert_eq!(u64::from_be_bytes(payload[..8].try_into().unwrap()), offset);
                payload[8..].to_vec()
            }
            other => panic!("not a successful read reply: {other:?}"),
        }
    }

    /// A structured chunk's flags, type and payload.
    pub fn chunk(self) -> (u16, u16, Vec<u8>) {
        match self {
            Reply::Chunk {
                flags,
                kind,
                payload,
                ..
            } => (flags, kind, payload),
            other => panic!("not a structured chunk: {other:?}"),
        }
    }

    /// The error of a simple reply or of an error chunk; 0 otherwise.
    pub fn error(&self) -> u32 {
        match self {
            Reply::Simple { error, .. } => *error,
            Reply::Chunk { kind, payload, .. } if kind & 0x8000 != 0 => {
                u32::from_be_bytes(payload[..4].try_into().unwrap())
            }
            Reply::Chunk { .. } => 0,
        }
    }
}

pub struct RawClient<S> {
    pub stream: S,
}

impl RawClient<TcpStream> {
    pub async fn connect(addr: SocketAddr) -> RawClient<TcpStream> {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        RawClient { stream }
    }

    /// Connects, negotiates (structured replies and `base:allocation` if
    /// asked) and enters transmission on `name`.
    pub async fn open(
        addr: SocketAddr,
        name: &str,
        structured: bool,
    ) -> (RawClient<TcpStream>, ExportInfo) {
        let mut client = RawClient::connect(addr).await;
        client.handshake(C_FIXED_NEWSTYLE | C_NO_ZEROES).await;
        if structured {
            assert_eq!(
                client.option(OPT_STRUCTURED_REPLY, &[]).await[0].reply_type,
                REP_ACK
            );
        }
        let info = client
            .go(name, &[INFO_BLOCK_SIZE])
            .await
            .expect("GO failed");
        (client, info)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> RawClient<S> {
    pub fn new(stream: S) -> RawClient<S> {
        RawClient { stream }
    }

    /// Reads the greeting, checks it, sends `client_flags`; returns the
    /// handshake flags.
    pub async fn handshake(&mut self, client_flags: u32) -> u16 {
        let mut greeting = [0; 18];
        self.stream.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting[..8], NBDMAGIC);
        assert_eq!(&greeting[8..16], IHAVEOPT);
        self.stream.write_u32(client_flags).await.unwrap();
        u16::from_be_bytes([greeting[16], greeting[17]])
    }

    pub async fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut message = Vec::with_capacity(16 + data.len());
        message.extend_from_slice(IHAVEOPT);
        message.extend_from_slice(&option.to_be_bytes());
        message.extend_from_slice(&(data.len() as u32).to_be_bytes());
        message.extend_from_slice(data);
        self.stream.write_all(&message).await.unwrap();
    }

    pub async fn read_option_reply(&mut self) -> OptionReply {
        assert_eq!(self.stream.read_u64().await.unwrap(), OPTION_REPLY_MAGIC);
        let option = self.stream.read_u32().await.unwrap();
        let reply_type = self.stream.read_u32().await.unwrap();
        let length = self.stream.read_u32().await.unwrap();
        let mut data = vec![0; length as usize];
        self.stream.read_exact(&mut data).await.unwrap();
        OptionReply {
            option,
            reply_type,
            data,
        }
    }

    /// Sends an option and reads replies up to the final one.
    pub async fn option(&mut self, option: u32, data: &[u8]) -> Vec<OptionReply> {
        self.send_option(option, data).await;
        let mut replies = Vec::new();
        loop {
            let reply = self.read_option_reply().await;
            assert_eq!(reply.option, option);
            let last = reply.is_final();
            replies.push(reply);
            if last {
                return replies;
            }
        }
    }

    /// `NBD_OPT_INFO` or `NBD_OPT_GO`; `Err` carries the final error reply.
    pub async fn info_or_go(
        &mut self,
        option: u32,
        name: &str,
        infos: &[u16],
    ) -> Result<ExportInfo, OptionReply> {
        let replies = self.option(option, &export_query(name, infos)).await;
        let last = replies.last().unwrap().clone();
        if last.reply_type != REP_ACK {
            return Err(last);
        }
        let mut info = ExportInfo::default();
        for reply in &replies[..replies.len() - 1] {
            assert_eq!(reply.reply_type, REP_INFO);
            let d = &reply.data;
            match reply.info_type() {
                INFO_EXPORT => {
                    assert_eq!(d.len(), 12);
                    info.size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                    info.flags = u16::from_be_bytes([d[10], d[11]]);
                }
                INFO_BLOCK_SIZE => {
                    assert_eq!(d.len(), 14);
                    let word = |at: usize| u32::from_be_bytes(d[at..at + 4].try_into().unwrap());
                    info.block_sizes = Some((word(2), word(6), word(10)));
                }
                INFO_NAME => info.name = Some(String::from_utf8(d[2..].to_vec()).unwrap()),
                INFO_DESCRIPTION => {
                    info.description = Some(String::from_utf8(d[2..].to_vec()).unwrap())
                }
                other => panic!("unexpected info type {other}"),
            }
        }
        Ok(info)
    }

    pub async fn go(&mut self, name: &str, infos: &[u16]) -> Result<ExportInfo, OptionReply> {
        self.info_or_go(OPT_GO, name, infos).await
    }

    pub async fn send_request(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) {
        self.stream
            .write_all(&request(kind, flags, cookie, offset, length, payload))
            .await
            .unwrap();
    }

    /// Reads one reply; `read_length(cookie)` says how much data a
    /// successful simple reply to that cookie carries (0 unless a read).
    pub async fn read_reply(&mut self, read_length: impl Fn(u64) -> usize) -> Reply {
        let magic = self.stream.read_u32().await.unwrap();
        match magic {
            SIMPLE_REPLY_MAGIC => {
                let error = self.stream.read_u32().await.unwrap();
                let cookie = self.stream.read_u64().await.unwrap();
                let mut data = vec![0; if error == 0 { read_length(cookie) } else { 0 }];
                self.stream.read_exact(&mut data).await.unwrap();
                Reply::Simple {
                    error,
                    cookie,
                    data,
                }
            }
            STRUCTURED_REPLY_MAGIC => {
                let flags = self.stream.read_u16().await.unwrap();
                let kind = self.stream.read_u16().await.unwrap();
                let cookie = self.stream.read_u64().await.unwrap();
                let length = self.stream.read_u32().await.unwrap();
                let mut payload = vec![0; length as usize];
                self.stream.read_exact(&mut payload).await.unwrap();
                Reply::Chunk {
                    flags,
                    kind,
                    cookie,
                    payload,
                }
            }
            other => panic!("bad reply magic {other:#x}"),
        }
    }

    /// Sends one request and reads its (single-message) reply.
    pub async fn call(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Reply {
        let cookie = 0xc0ffee;
        self.send_request(kind, flags, cookie, offset, length, payload)
            .await;
        let data_length = if kind == CMD_READ { length as usize } else { 0 };
        let reply = self.read_reply(|_| data_length).await;
        assert_eq!(reply.cookie(), cookie);
        reply
    }

    /// Whether the server closed the connection (within a few seconds).
    pub async fn closed(&mut self) -> bool {
        self.closed_within(Duration::from_secs(5)).await
    }

    /// Whether the server closes the connection within `limit`; `false`
    /// also if a byte arrives instead.
    pub async fn closed_within(&mut self, limit: Duration) -> bool {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(limit, self.stream.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) => false,
            Err(_) => false,
        }
    }
}

pub fn request(
    kind: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    length: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut message = Vec::with_capacity(28 + payload.len());
    message.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    message.extend_from_slice(&flags.to_be_bytes());
    message.extend_from_slice(&kind.to_be_bytes());
    message.extend_from_slice(&cookie.to_be_bytes());
    message.extend_from_slice(&offset.to_be_bytes());
    message.extend_from_slice(&length.to_be_bytes());
    message.extend_from_slice(payload);
    message
}

/// `NBD_OPT_INFO`/`GO` data.
pub fn export_query(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut data = Vec::new();
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for info in infos {
        data.extend_from_slice(&info.to_be_bytes());
    }
    data
}

/// `NBD_OPT_*_META_CONTEXT` data.
pub fn meta_query(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = Vec::new();
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend_from_slice(&(query.len() as u32).to_be_bytes());
        data.extend_from_slice(query.as_bytes());
    }
    data
}

/// Decodes a block status chunk payload: (context id, [(length, flags)]).
pub fn block_status_payload(payload: &[u8]) -> (u32, Vec<(u32, u32)>) {
    let word = |at: usize| u32::from_be_bytes(payload[at..at + 4].try_into().unwrap());
    let extents = (4..payload.len())
        .step_by(8)
        .map(|at| (word(at), word(at + 4)))
        .collect();
    (word(0), extents)
}

// ---------------------------------------------------------------------------
// Data and tools.

/// Deterministic pseudo-random bytes, different per seed.
pub fn pseudo_random(length: usize, seed: u64) -> Vec<u8> {
    terrace_io::random::SplitMix64::new(seed).bytes(length)
}

/// Whether `program` can be run; prints a note for the skipped test if not.
pub async fn have_tool(program: &str) -> bool {
    let probe = tokio::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
    match probe {
        Ok(_) => true,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            eprintln!("note: {program} is not installed; skipping this test");
            false
        }
        Err(error) => panic!("cannot run {program}: {error}"),
    }
}

/// Runs a tool to completion; a hang fails the test instead of blocking it.
pub async fn run_tool(program: &str, args: &[&str], limit: Duration) -> Output {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(limit, child).await {
        Ok(output) => output.unwrap_or_else(|e| panic!("cannot run {program}: {e}")),
        Err(_) => panic!("{program} {args:?} did not finish within {limit:?}"),
    }
}

/// Output as text, both streams, for assertions and failure messages.
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Replies keyed by cookie.
pub fn by_cookie(replies: Vec<Reply>) -> HashMap<u64, Reply> {
    replies
        .into_iter()
        .map(|reply| (reply.cookie(), reply))
        .collect()
}

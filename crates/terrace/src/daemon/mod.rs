//! `terrace daemon`: owns the pools, serves their spaces over NBD, and
//! answers the CLI on a control socket.
//!
//! ```text
//!  terrace CLI ──(JSON lines, Unix socket)──▶ control ──▶ registry ──▶ engine pools
//!  NBD clients ──(TCP 127.0.0.1:10809, Unix)──▶ terrace-export ──▶ catalog ──▶ spaces
//! ```
//!
//! Start: bind the control socket, NBD's TCP address and its Unix socket
//! (`nbd.sock` beside the control socket unless given), refusing a socket a
//! live process listens on and replacing a stale one ([`sockets`]); import
//! the saved pools; serve; tell a service manager `READY=1` ([`notify`]).
//! A start that fails removes the sockets it bound.
//!
//! Shutdown (SIGTERM, SIGINT, or `Shutdown` on the control socket): stop
//! accepting (`STOPPING=1` to a service manager), let NBD connections
//! finish the requests they have in flight, then close every pool (flush,
//! mark clean). A SIGKILL skips all that; the
//! next start finds the pools not closed cleanly and resynchronises them
//! (mirrors in the background, while they serve), and nothing acknowledged
//! after a flush is lost.

pub mod actions;
mod advice;
pub mod candidates;
pub mod catalog;
pub mod clear;
pub mod control;
pub mod events;
pub mod intake;
pub mod names;
pub mod notify;
pub mod probe;
pub mod readahead;
pub mod registry;
pub mod scrub;
pub mod sockets;
pub mod verify;
pub mod views;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use terrace_engine::io::{Env, SystemEnv};
use terrace_export::{Server, ServerOptions};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use catalog::SpaceCatalog;
use registry::Registry;

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub state_dir: PathBuf,
    pub control_socket: PathBuf,
    /// TCP address for NBD; `None` disables TCP.
    pub nbd_tcp: Option<SocketAddr>,
    /// Unix socket for NBD; `None` disables it.
    pub nbd_socket: Option<PathBuf>,
    /// Threads per NBD socket connection (0: async tasks); see
    /// [`ServerOptions::threads_per_connection`].
    pub nbd_threads: usize,
    /// Bytes of log records the write-back logs of the daemon's pools may
    /// keep in memory, shared equally by the pools; `None`:
    /// [`log_memory_default`].
    pub log_memory: Option<u64>,
}

/// A quarter of this machine's memory (the engine's own default where it
/// cannot be read): what the daemon's write-back logs keep in memory unless
/// configured. Beyond it, logged data is read back from the log's disks.
pub fn log_memory_default() -> u64 {
    match terrace_bench::machine::Machine::memory() {
        0 => terrace_engine::journal::LOG_MEMORY_DEFAULT_BYTES,
        memory => memory / 4,
    }
}

/// Threads per NBD connection unless configured: enough to keep requests
/// in flight to disks that wait, few enough to stay idle cheaply.
pub const NBD_THREADS_DEFAULT: usize = 0;

pub struct Daemon {
    pub config: DaemonConfig,
    pub registry: Arc<Registry>,
    /// The TCP address actually bound (port 0 picks one).
    pub nbd_tcp: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
}

impl Daemon {
    pub fn request_shutdown(&self) {
        let _ = self.shutdown.send(true);
    }
}

/// Write a timestamped line to the daemon's log (standard error).
pub fn log(message: impl std::fmt::Display) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    eprintln!("[{now:.3}] terrace: {message}");
}

/// A started daemon: its state, and the task that ends when it has shut down.
pub struct Running {
    pub daemon: Arc<Daemon>,
    pub finished: tokio::task::JoinHandle<()>,
}

/// Bind every socket, import saved pools and start serving. A start that
/// fails removes the sockets it bound (see [`sockets`]).
pub async fn start(config: DaemonConfig, env: Arc<dyn Env>) -> Result<Running, String> {
    std::fs::create_dir_all(&config.state_dir).map_err(|e| {
        format!(
            "cannot create state folder {}: {e}",
            config.state_dir.display()
        )
    })?;
    let mut created = sockets::Created::default();
    let control = sockets::bind("control socket", &config.control_socket, &mut created)
        .await
        .map_err(|e| e.to_string())?;
    let tcp = match config.nbd_tcp {
        Some(address) => Some(
            TcpListener::bind(address)
                .await
                .map_err(|e| format!("cannot listen for NBD on {address}: {e}"))?,
        ),
        None => None,
    };
    let nbd_unix = match &config.nbd_socket {
        Some(path) => Some(
            sockets::bind("NBD socket", path, &mut created)
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let log_memory = config.log_memory.unwrap_or_else(log_memory_default);
    let registry = Arc::new(Registry::new(env, &config.state_dir, log_memory));
    for problem in registry.import_saved().await {
        log(format!("not imported: {problem}"));
    }
    let (shutdown, _) = watch::channel(false);
    let daemon = Arc::new(Daemon {
        nbd_tcp: tcp.as_ref().and_then(|l| l.local_addr().ok()),
        config,
        registry,
        shutdown,
    });
    let finished = tokio::spawn(serve(daemon.clone(), control, tcp, nbd_unix));
    created.keep();
    Ok(Running { daemon, finished })
}

async fn serve(
    daemon: Arc<Daemon>,
    control: UnixListener,
    tcp: Option<TcpListener>,
    unix: Option<UnixListener>,
) {
    let threads = std::thread::available_parallelism().map_or(2, usize::from);
    let options = ServerOptions {
        connection_threads: threads,
        threads_per_connection: daemon.config.nbd_threads,
        ..ServerOptions::default()
    };
    // Requests of 256 KiB and more run on this multi-thread runtime: their
    // cost is copying bytes, which then overlaps the connection thread's
    // socket copies on another core. A connection thread's reading of the
    // socket is the connection's bottleneck, so the disk submissions of the
    // writes and small reads it starts go to the devices' reactor threads.
    let server = Arc::new(
        Server::new(
            Arc::new(SpaceCatalog::new(daemon.registry.clone())),
            options,
        )
        .with_offload(tokio::runtime::Handle::current())
        .on_connection_thread_start(connection_thread_start),
    );
    let mut servers = Vec::new();
    if let Some(listener) = tcp {
        let (server, stop) = (server.clone(), daemon.shutdown.subscribe());
        servers.push(tokio::spawn(async move {
            server.serve_tcp(listener, stop).await
        }));
    }
    if let Some(listener) = unix {
        let (server, stop) = (server.clone(), daemon.shutdown.subscribe());
        servers.push(tokio::spawn(async move {
            server.serve_unix(listener, stop).await
        }));
    }
    log(format!(
        "serving: control {}, NBD {}{}",
        daemon.config.control_socket.display(),
        daemon
            .nbd_tcp
            .map_or("no TCP".into(), |a| format!("nbd://{a}")),
        daemon
            .config
            .nbd_socket
            .as_ref()
            .map_or(String::new(), |p| format!(
                ", nbd+unix:///?socket={}",
                p.display()
            ))
    ));
    let mut stop = daemon.shutdown.subscribe();
    loop {
        tokio::select! {
            accepted = control.accept() => match accepted {
                Ok((stream, _)) => { tokio::spawn(control::serve(daemon.clone(), stream)); }
                Err(error) => log(format!("control socket: {error}")),
            },
            _ = stop.changed() => break,
        }
    }
    notify::stopping();
    for server in servers {
        let _ = server.await;
    }
    for entry in daemon.registry.all() {
        let owed = entry.pool.resync_extents_pending();
        match entry.pool.close().await {
            Ok(()) if owed > 0 => log(format!(
                "pool {} closed; {owed} mirror extent(s) still owed a resync after an unclean shutdown, resumed at the next import",
                entry.pool.name()
            )),
            Ok(()) => log(format!("pool {} closed cleanly", entry.pool.name())),
            Err(error) => log(format!("pool {}: {error}", entry.pool.name())),
        }
    }
    let _ = std::fs::remove_file(&daemon.config.control_socket);
    if let Some(path) = &daemon.config.nbd_socket {
        let _ = std::fs::remove_file(path);
    }
}

/// Largest buffer the allocator takes from its heap rather than from a
/// mapping of its own: glibc's ceiling on 64-bit, above the 1 MiB requests
/// that dominate streaming and below the 32 MiB most a client may send.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const HEAP_BUFFER_MAX_BYTES: i32 = 32 << 20;

/// Freed heap memory kept for the next requests instead of being returned
/// to the kernel: a few dozen large requests in flight.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const HEAP_KEEP_BYTES: i32 = 128 << 20;

/// Keep freed request buffers for the next requests. The daemon allocates
/// and frees read buffers and write payloads of up to 32 MiB at the request
/// rate; by default glibc maps buffers above a threshold (128 KiB at first)
/// and unmaps them when freed, and trims the heap above another, so each
/// new 1 MiB read buffer was faulted in page by page again (a fifth of the
/// daemon's time serving 1 MiB reads). Call before any thread starts.
pub fn keep_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; no allocation is in
    // progress on another thread, as none has been started yet. A refused
    // value leaves the default, which is merely slower.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, HEAP_BUFFER_MAX_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, HEAP_KEEP_BYTES);
    }
}

/// The daemon's runtime, to build: its workers keep drive models' sleeps
/// in their own event loops (see [`terrace_engine::io::use_thread_timers`]).
pub fn runtime_builder() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .enable_all()
        .on_thread_start(terrace_engine::io::use_thread_timers);
    builder
}

/// Each NBD connection thread hands its devices' submissions to their
/// reactors (see `transmission.rs` in terrace-export) and keeps its drive
/// models' sleeps in its own event loop.
fn connection_thread_start() {
    terrace_engine::io::file::hand_off_submissions();
    terrace_engine::io::use_thread_timers();
}

/// Run until SIGTERM, SIGINT or a shutdown request.
pub async fn run(config: DaemonConfig) -> Result<(), String> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| format!("cannot watch SIGINT: {e}"))?;
    let running = start(config, Arc::new(SystemEnv::new())).await?;
    notify::ready();
    let daemon = running.daemon.clone();
    let mut finished = running.finished;
    tokio::select! {
        _ = terminate.recv() => log("SIGTERM: shutting down"),
        _ = interrupt.recv() => log("SIGINT: shutting down"),
        _ = &mut finished => return Ok(()),
    }
    daemon.request_shutdown();
    finished.await.map_err(|e| format!("shutdown failed: {e}"))
}

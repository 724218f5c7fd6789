//! Connection threads: a connection lives on one thread from accept to close.
//!
//! ```text
//!   accept loop ──(round robin)──▶ thread 0: current-thread runtime ─ connections…
//!                              └──▶ thread 1: current-thread runtime ─ connections…
//! ```
//!
//! On a work-stealing runtime a connection's reader, writer and request
//! tasks wake each other across threads; each of those wake-ups is a futex
//! call and a context switch, and with small requests they cost more than
//! the requests. Pinning a connection to one single-threaded runtime keeps
//! every wake-up within the thread; different connections still run in
//! parallel on different threads. Requests of 256 KiB and more are the
//! exception when the server has an offload runtime
//! ([`Server::with_offload`]): their copying then overlaps the connection
//! thread's socket work on another core.

use std::io;
use std::thread::JoinHandle;

use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::Server;

/// Accepted connections waiting for their thread: a burst of new clients
/// waits in the accept loop beyond this, not in memory.
const HANDOFF_QUEUE: usize = 64;

/// An accepted socket, detached from the accepting runtime.
pub(crate) enum Detached {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

pub(crate) struct Workers {
    senders: Vec<mpsc::Sender<Detached>>,
    threads: Vec<JoinHandle<()>>,
    next: usize,
}

impl Workers {
    pub(crate) fn start(
        server: &Server,
        count: usize,
        shutdown: &watch::Receiver<bool>,
    ) -> io::Result<Workers> {
        let mut workers = Workers {
            senders: Vec::new(),
            threads: Vec::new(),
            next: 0,
        };
        for index in 0..count {
            let (sender, receiver) = mpsc::channel(HANDOFF_QUEUE);
            let (server, stop) = (server.clone(), shutdown.clone());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let thread = std::thread::Builder::new()
                .name(format!("nbd-{index}"))
                .spawn(move || {
                    if let Some(hook) = server.connection_thread_start() {
                        hook();
                    }
                    runtime.block_on(serve(server, receiver, stop))
                })?;
            workers.senders.push(sender);
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// Hand a connection to the next thread.
    pub(crate) async fn dispatch(&mut self, stream: Detached) {
        let index = self.next % self.senders.len();
        self.next = self.next.wrapping_add(1);
        // A thread only stops after its sender is dropped, so this cannot fail.
        let _ = self.senders[index].send(stream).await;
    }

    /// Stop handing out connections and wait until every thread has finished
    /// its connections.
    pub(crate) async fn finish(self) {
        drop(self.senders);
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

async fn serve(
    server: Server,
    mut receiver: mpsc::Receiver<Detached>,
    stop: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    while let Some(detached) = receiver.recv().await {
        while connections.try_join_next().is_some() {}
        let (server, stop) = (server.clone(), stop.clone());
        connections.spawn(async move {
            match detached {
                Detached::Tcp(stream) => {
                    if let Ok(stream) = TcpStream::from_std(stream) {
                        let _ = server.serve_socket(stream, stop).await;
                    }
                }
                Detached::Unix(stream) => {
                    if let Ok(stream) = UnixStream::from_std(stream) {
                        let _ = server.serve_socket(stream, stop).await;
                    }
                }
            }
        });
    }
    while connections.join_next().await.is_some() {}
}

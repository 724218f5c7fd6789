//! Threaded transmission: after the handshake, a connection is served by a
//! few OS threads of its own, each carrying one whole request at a time
//! from the socket to the backend and back (nbdkit's model). What each
//! request means is decided in `requests.rs`, exactly as in async mode.
//!
//! ```text
//!        nbd-conn-0     nbd-conn-1     nbd-conn-2     nbd-conn-3
//!            │              │              │              │
//!   ┌────────▼──────────────▼──────────────▼──────────────▼────────┐
//!   │ reader lock: buffer + the socket's read side                  │ lock, take one request
//!   │ (one read(2) of up to 128 KiB brings in many small requests)  │ (header + write payload),
//!   └────────┬──────────────┬──────────────┬─────────────────────────┘ unlock
//!            │              │              │              (waiting for the lock,
//!            ▼              ▼              ▼               or in read(2))
//!        backend op     backend op     backend op      block_on: polled right here,
//!            │              │              │           no lock held
//!   ┌────────▼──────────────▼──────────────▼────────────────────────┐
//!   │ writer lock: the socket's write side                           │ lock, writev(2) one
//!   └────────────────────────────────────────────────────────────────┘ reply, unlock, repeat
//! ```
//!
//! Why this is faster than tasks on a runtime: a request never changes
//! threads. Async mode either keeps a connection on one thread (then
//! socket copies, backend copies and system calls all queue for one core)
//! or moves reader, request and writer work between threads (then each
//! move is a futex wake-up and a context switch, which costs more than a
//! 4 KiB request). Here every thread does the expensive parts itself, in
//! parallel with the others; they meet only in two short critical
//! sections, and a thread sleeps only when it has nothing to do. Reads are
//! buffered, so after one thread's `read(2)` the next threads find their
//! requests in memory and take them without a system call.
//!
//! What it costs: a few threads per connection (mostly idle stacks; the
//! waiters sleep on the lock), a futex hand-off when a lock is contended,
//! and at most one request in progress per thread: the thread count is
//! the connection's in-flight limit, so backends that wait a long time per
//! request (disks) want more threads than cores. A blocked `read(2)` gives
//! up every [`READ_POLL_INTERVAL`] to look for shutdown, so an idle
//! connection wakes one thread ten times a second.
//!
//! Ending is as in async mode. `NBD_CMD_DISC`, the end of the stream or a
//! broken stream stops the reading: threads finish the request they hold,
//! write its reply and leave; when the last has left the connection is
//! closed. On shutdown the thread that holds the reader lock keeps it and
//! answers whatever arrives with `NBD_ESHUTDOWN` until nothing is in flight.
//! If the grace period runs out, the connection is cancelled: backend
//! operations are dropped where they wait and the socket is shut, which
//! ends every blocked read and write. The supervising task on the runtime
//! joins every thread before it returns.

use std::future::Future;
use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::BytesMut;
use futures::task::AtomicWaker;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};

use crate::error::ConnectionError;
use crate::protocol::{EncodedReply, REQUEST_HEADER_BYTES};
use crate::requests::{
    admit, aligned_capacity, parse_header, payload_plan, refuse_for_shutdown, run, Admission,
    Incoming, Job, Payload, PayloadPlan, Session, Summing, DIRECT_PAYLOAD_MIN,
};
use crate::server::{shutdown_requested, READ_BUFFER_BYTES};

/// How long a `read(2)` waits for the client before the reader looks at
/// the shutdown and cancellation flags again: the longest an idle
/// connection takes to notice shutdown (and a draining one to notice its
/// last reply went out), against one wake-up per interval while idle.
const READ_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Upper bound on threads per connection: each holds one request, and
/// nbdkit's default of 16 already exceeds what clients keep in flight on
/// fast storage; beyond 64 threads only cost memory and scheduling.
pub(crate) const THREADS_PER_CONNECTION_MAX: usize = 64;

/// A connected socket taken over from the runtime, in blocking mode.
/// (`pub` only so that the sealed [`crate::Socket`] trait may name it; this
/// module is private.)
pub enum BlockingSocket {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl BlockingSocket {
    /// Blocking reads that give up after [`READ_POLL_INTERVAL`], blocking
    /// writes that wait as long as the client takes.
    fn prepare(&self) -> io::Result<()> {
        match self {
            BlockingSocket::Tcp(socket) => {
                socket.set_nonblocking(false)?;
                socket.set_read_timeout(Some(READ_POLL_INTERVAL))
            }
            BlockingSocket::Unix(socket) => {
                socket.set_nonblocking(false)?;
                socket.set_read_timeout(Some(READ_POLL_INTERVAL))
            }
        }
    }

    fn read(&self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            BlockingSocket::Tcp(socket) => (&*socket).read(buffer),
            BlockingSocket::Unix(socket) => (&*socket).read(buffer),
        }
    }

    /// One `read(2)` of at most `limit` bytes into the spare capacity of
    /// `data`, which grows by what was read: nothing is zeroed first.
    fn read_spare(&self, data: &mut BytesMut, limit: usize) -> io::Result<usize> {
        let fd = match self {
            BlockingSocket::Tcp(socket) => socket.as_raw_fd(),
            BlockingSocket::Unix(socket) => socket.as_raw_fd(),
        };
        let spare = data.spare_capacity_mut();
        let count = limit.min(spare.len());
        // SAFETY: `spare` is valid for writes of `count` bytes and read(2)
        // writes no more than that; it is borrowed mutably for the call.
        let read = unsafe { libc::read(fd, spare.as_mut_ptr().cast(), count) };
        let Ok(read) = usize::try_from(read) else {
            return Err(io::Error::last_os_error());
        };
        // SAFETY: read(2) initialised the first `read` bytes of the spare
        // capacity, which directly follow the initialised part.
        unsafe { data.set_len(data.len() + read) };
        Ok(read)
    }

    fn write_vectored(&self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            BlockingSocket::Tcp(socket) => (&*socket).write_vectored(parts),
            BlockingSocket::Unix(socket) => (&*socket).write_vectored(parts),
        }
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            BlockingSocket::Tcp(socket) => socket.shutdown(how),
            BlockingSocket::Unix(socket) => socket.shutdown(how),
        }
    }
}

/// Serves requests on `threads` threads until the client disconnects, the
/// stream breaks, or shutdown drains the connection; `leftover` holds bytes
/// the handshake read beyond its last option. Returns once every thread
/// has ended.
pub(crate) async fn transmit(
    socket: BlockingSocket,
    leftover: &[u8],
    session: Session,
    threads: usize,
    limits: (usize, Duration),
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let (max_in_flight, grace) = limits;
    socket.prepare()?;
    let connection = Connection::new(socket, leftover, session, threads, max_in_flight);
    let connection = Arc::new(connection);
    // Every thread holds a sender; the channel closes when the last ends.
    let (done, mut finished) = mpsc::channel::<()>(1);
    let handles = start_threads(&connection, threads, done)?;
    let abandon = CancelOnDrop(Some(connection.clone()));
    let timed_out = supervise(&connection, &mut finished, &mut shutdown, grace).await;
    for handle in handles {
        // Each has let go of its sender, its last act: this returns at once.
        // A panic was already handled (the thread cancelled the connection).
        let _ = handle.join();
    }
    abandon.disarm();
    connection.finish(timed_out.then_some(grace))
}

fn start_threads(
    connection: &Arc<Connection>,
    count: usize,
    done: mpsc::Sender<()>,
) -> Result<Vec<JoinHandle<()>>, ConnectionError> {
    // Backends may use the runtime (timers, its I/O): their futures run in
    // its context on these threads too.
    let runtime = Handle::current();
    let mut handles = Vec::with_capacity(count);
    for slot in 0..count {
        let (connection, done, runtime) = (connection.clone(), done.clone(), runtime.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{slot}"))
            .spawn(move || {
                let _done = done;
                let _context = runtime.enter();
                let connection = connection;
                let _guard = CancelOnPanic(&connection);
                connection.serve(slot);
            });
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(error) if handles.is_empty() => return Err(ConnectionError::Io(error)),
            // Fewer threads serve the connection just as correctly.
            Err(_) => break,
        }
    }
    Ok(handles)
}

/// Waits until every thread has ended. On shutdown, tells them; once the
/// grace period is over, cancels the connection. Returns whether it had to.
async fn supervise(
    connection: &Connection,
    finished: &mut mpsc::Receiver<()>,
    shutdown: &mut watch::Receiver<bool>,
    grace: Duration,
) -> bool {
    tokio::select! {
        _ = finished.recv() => return false,
        _ = shutdown_requested(shutdown) => {}
    }
    connection.shutdown.store(true, Ordering::SeqCst);
    if tokio::time::timeout(grace, finished.recv()).await.is_ok() {
        return false;
    }
    connection.cancel();
    finished.recv().await;
    true
}

/// Cancels the connection if its supervising future is dropped before the
/// threads are done (say, the runtime shuts down): they then end promptly
/// on their own.
struct CancelOnDrop(Option<Arc<Connection>>);

impl CancelOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(connection) = &self.0 {
            connection.cancel();
        }
    }
}

/// A thread that panics (a bug, not a backend: those panics become
/// `NBD_EIO`) may leave the stream out of step: end the connection.
struct CancelOnPanic<'a>(&'a Connection);

impl Drop for CancelOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.cancel();
        }
    }
}

/// One connection, shared by its threads.
struct Connection {
    session: Session,
    socket: BlockingSocket,
    /// Only the thread holding this lock reads from the socket.
    reader: Mutex<ReadBuffer>,
    /// Replies on their way out; only the thread that set its `writing`
    /// writes to the socket, so replies never interleave. Taken after
    /// `reader` when both are held.
    outbox: Mutex<Outbox>,
    /// Signalled when replies have been written while a reader waits for
    /// room under the in-flight limit.
    room: Condvar,
    /// Most requests in flight (read, and reply not yet written).
    limit: usize,
    /// Shutdown began: requests are refused until nothing is in flight.
    shutdown: AtomicBool,
    /// Read no more: `NBD_CMD_DISC`, end of stream, broken stream, drained.
    stopping: AtomicBool,
    /// Past the grace period, or abandoned: backend operations are
    /// dropped, the socket is shut.
    cancelled: AtomicBool,
    /// Requests read and not yet answered. Written twice per request by
    /// different threads: on a cache line of its own, so that the flags
    /// above stay cheap to read.
    in_flight: Padded<AtomicUsize>,
    /// Why the connection ended, if not cleanly; the first reason wins.
    failure: Mutex<Option<ConnectionError>>,
    /// Per thread: wakes its backend operation when the connection is
    /// cancelled. Each thread registers its waker at every poll, so each
    /// has a cache line of its own.
    wakers: Vec<Padded<AtomicWaker>>,
}

/// A value alone on its cache line (128 bytes: adjacent-line prefetching
/// pairs 64-byte lines on x86), so that threads writing neighbouring
/// values do not take the line from each other.
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// Replies waiting for the thread that is writing.
#[derive(Default)]
struct Outbox {
    queue: Vec<EncodedReply>,
    /// A thread is writing; it takes the queue when it is done.
    writing: bool,
}

/// What a thread does with the request it took.
enum Work {
    Answer(EncodedReply),
    Run(Job),
}

/// Where the stream stands between two requests.
enum Boundary {
    /// The next request has begun to arrive.
    Ready,
    /// Shutdown began: drain.
    Shutdown,
    /// Read no more.
    End,
}

impl Connection {
    fn new(
        socket: BlockingSocket,
        leftover: &[u8],
        session: Session,
        threads: usize,
        limit: usize,
    ) -> Self {
        Connection {
            session,
            socket,
            reader: Mutex::new(ReadBuffer::new(leftover)),
            outbox: Mutex::new(Outbox::default()),
            room: Condvar::new(),
            limit,
            shutdown: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
            in_flight: Padded(AtomicUsize::new(0)),
            failure: Mutex::new(None),
            wakers: (0..threads).map(|_| Padded(AtomicWaker::new())).collect(),
        }
    }

    /// One thread's life: take a request, serve it, answer it, repeat.
    fn serve(&self, slot: usize) {
        while let Some(work) = self.take() {
            let reply = match work {
                Work::Answer(reply) => Some(reply),
                Work::Run(job) => self.until_cancelled(slot, run(&self.session, job)),
            };
            match reply {
                Some(reply) => self.send(reply),
                None => self.answered(1),
            }
        }
    }

    /// Under the reader lock: the next request for this thread, or `None`
    /// once the connection reads no more.
    fn take(&self) -> Option<Work> {
        // A thread panicked holding the lock: the stream may be out of step.
        let Ok(mut reader) = self.reader.lock() else {
            self.stop();
            return None;
        };
        self.wait_for_room();
        let admitted = match self.await_request(&mut reader, false) {
            Ok(Boundary::Ready) => self
                .read_request(&mut reader)
                .map(|incoming| admit(&self.session, incoming)),
            Ok(Boundary::Shutdown) => self.drain(&mut reader).map(|()| Admission::Disconnect),
            Ok(Boundary::End) => Ok(Admission::Disconnect),
            Err(error) => Err(error),
        };
        let work = match admitted {
            Ok(Admission::Answer(reply)) => Work::Answer(reply),
            Ok(Admission::Run(job)) => Work::Run(job),
            Ok(Admission::Disconnect) => {
                self.stop();
                return None;
            }
            Err(error) => {
                self.fail(error);
                return None;
            }
        };
        // Counted before the lock is released, so that a draining reader
        // never sees zero while a request is on its way to the backend.
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Some(work)
    }

    /// After shutdown, keeping the reader lock for good: answer whatever
    /// arrives with `NBD_ESHUTDOWN` until nothing is in flight.
    fn drain(&self, reader: &mut ReadBuffer) -> Result<(), ConnectionError> {
        while let Boundary::Ready = self.await_request(reader, true)? {
            let incoming = self.read_request(reader)?;
            match refuse_for_shutdown(&self.session, &incoming.header) {
                Some(reply) => {
                    self.in_flight.fetch_add(1, Ordering::SeqCst);
                    self.send(reply);
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Waits for the first byte of the next request. Only here, between
    /// messages, do shutdown and the end of the connection take effect.
    fn await_request(
        &self,
        reader: &mut ReadBuffer,
        draining: bool,
    ) -> Result<Boundary, ConnectionError> {
        loop {
            if self.stopping.load(Ordering::SeqCst) || self.cancelled.load(Ordering::SeqCst) {
                return Ok(Boundary::End);
            }
            if draining && self.in_flight.load(Ordering::SeqCst) == 0 {
                return Ok(Boundary::End);
            }
            if !draining && self.shutdown.load(Ordering::SeqCst) {
                return Ok(Boundary::Shutdown);
            }
            if !reader.is_empty() {
                return Ok(Boundary::Ready);
            }
            match reader.fill(&self.socket) {
                Ok(0) => return Ok(Boundary::End),
                Ok(_) => return Ok(Boundary::Ready),
                Err(error) if is_retry(&error) => {}
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Reads one request: header, and for `NBD_CMD_WRITE` its payload.
    fn read_request(&self, reader: &mut ReadBuffer) -> Result<Incoming, ConnectionError> {
        let mut bytes = [0; REQUEST_HEADER_BYTES];
        self.read_exact(reader, &mut bytes)?;
        let header = parse_header(&bytes)?;
        let payload = match payload_plan(&header, self.session.payload_limit())? {
            PayloadPlan::None => Payload::None,
            PayloadPlan::Discard(length) => {
                self.discard(reader, length)?;
                Payload::Discarded
            }
            PayloadPlan::Read(length) => {
                let mut summing = Summing::new(&self.session, &header);
                let data = self.read_payload(reader, length, &mut summing)?;
                summing.finish(data.freeze())
            }
        };
        Ok(Incoming { header, payload })
    }

    /// A write payload, in memory aligned for direct-I/O backends. Read
    /// into uninitialised capacity: zeroing up to 32 MiB first would be one
    /// more pass over memory than the copy itself. What of a payload of
    /// [`DIRECT_PAYLOAD_MIN`] or more the buffer does not hold is read
    /// straight into the payload, and the buffer's next read then takes
    /// only a request header, so that it does not pull the next payload in
    /// to be copied out again (as in async mode, `transmission.rs`).
    fn read_payload(
        &self,
        reader: &mut ReadBuffer,
        length: usize,
        summing: &mut Summing,
    ) -> Result<BytesMut, ConnectionError> {
        let mut data = aligned_capacity(length);
        data.extend_from_slice(reader.take(length));
        let direct = length - data.len() >= DIRECT_PAYLOAD_MIN;
        while data.len() < length {
            summing.take(&data);
            let rest = length - data.len();
            if direct {
                self.read_more(|| self.socket.read_spare(&mut data, rest))?;
            } else {
                self.read_more(|| reader.fill(&self.socket))?;
                data.extend_from_slice(reader.take(rest));
            }
        }
        reader.header_next = direct;
        Ok(data)
    }

    /// Fills `out` (a request header) from the buffer, refilling it as
    /// needed.
    fn read_exact(&self, reader: &mut ReadBuffer, out: &mut [u8]) -> Result<(), ConnectionError> {
        let mut filled = 0;
        while filled < out.len() {
            if reader.is_empty() {
                self.read_more(|| reader.fill(&self.socket))?;
            }
            let part = reader.take(out.len() - filled);
            out[filled..filled + part.len()].copy_from_slice(part);
            filled += part.len();
        }
        Ok(())
    }

    /// Reads and drops `length` bytes.
    fn discard(&self, reader: &mut ReadBuffer, mut length: u64) -> Result<(), ConnectionError> {
        loop {
            length -= reader.skip(length);
            if length == 0 {
                return Ok(());
            }
            self.read_more(|| reader.fill(&self.socket))?;
        }
    }

    /// One successful read in the middle of a message: a timeout there only
    /// means a slow client (unless the connection was cancelled meanwhile),
    /// the end of the stream means the client left mid-message.
    fn read_more(
        &self,
        mut read: impl FnMut() -> io::Result<usize>,
    ) -> Result<usize, ConnectionError> {
        loop {
            match read() {
                Ok(0) => return Err(ConnectionError::Truncated),
                Ok(count) => return Ok(count),
                Err(error) if is_retry(&error) && !self.cancelled.load(Ordering::SeqCst) => {}
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Runs a backend operation on this thread (which parks while it
    /// waits) until it completes, or until the connection is cancelled:
    /// then the operation is dropped and there is no reply (`None`).
    fn until_cancelled<F: Future>(&self, slot: usize, operation: F) -> Option<F::Output> {
        let mut operation = pin!(operation);
        let waker = &self.wakers[slot];
        futures::executor::block_on(futures::future::poll_fn(|context| {
            waker.register(context.waker());
            if self.cancelled.load(Ordering::SeqCst) {
                return Poll::Ready(None);
            }
            operation.as_mut().poll(context).map(Some)
        }))
    }

    /// Writes `reply`, or queues it for the thread that is writing (which
    /// writes everything queued before it stops: one `writev(2)` for many
    /// replies). Whoever writes a reply counts it answered.
    fn send(&self, reply: EncodedReply) {
        let mut outbox = self.outbox();
        if outbox.writing {
            outbox.queue.push(reply);
            return;
        }
        outbox.writing = true;
        drop(outbox);
        let mut batch = vec![reply];
        loop {
            if let Err(error) = write_replies(&self.socket, &batch) {
                self.fail(error.into());
            }
            let mut outbox = self.outbox();
            self.answered_locked(batch.len(), &outbox);
            batch.clear();
            if outbox.queue.is_empty() {
                outbox.writing = false;
                return;
            }
            std::mem::swap(&mut batch, &mut outbox.queue);
        }
    }

    /// The outbox; its state stays consistent even if a thread panicked
    /// holding it (a panic there is no more than a lost reply).
    fn outbox(&self) -> MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `count` requests need no reply any more (written, or abandoned).
    fn answered(&self, count: usize) {
        let outbox = self.outbox();
        self.answered_locked(count, &outbox);
    }

    /// [`Connection::answered`] under the outbox lock, which a reader
    /// waiting for room holds while it checks: no wake-up is lost.
    fn answered_locked(&self, count: usize, _outbox: &MutexGuard<'_, Outbox>) {
        let before = self.in_flight.fetch_sub(count, Ordering::SeqCst);
        if before >= self.limit {
            self.room.notify_all();
        }
    }

    /// Waits while the in-flight limit is reached: replies queued behind a
    /// client that does not read count, so such a client cannot make the
    /// server hold more.
    fn wait_for_room(&self) {
        if self.in_flight.load(Ordering::SeqCst) < self.limit {
            return;
        }
        let mut outbox = self.outbox();
        while self.in_flight.load(Ordering::SeqCst) >= self.limit
            && !self.cancelled.load(Ordering::SeqCst)
        {
            outbox = self
                .room
                .wait(outbox)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    fn fail(&self, error: ConnectionError) {
        let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        failure.get_or_insert(error);
        self.stop();
    }

    /// Drops every backend operation where it waits and shuts the socket,
    /// which ends every blocked read and write.
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        for waker in &self.wakers {
            waker.wake();
        }
        {
            let _outbox = self.outbox();
            self.room.notify_all();
        }
        let _ = self.socket.shutdown(Shutdown::Both);
    }

    /// After the last thread: close our direction (a courtesy that fails
    /// harmlessly if the client already closed) and report the outcome.
    fn finish(&self, timed_out: Option<Duration>) -> Result<(), ConnectionError> {
        let _ = self.socket.shutdown(Shutdown::Write);
        if let Some(grace) = timed_out {
            return Err(ConnectionError::ShutdownTimeout(grace));
        }
        let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        failure.take().map_or(Ok(()), Err)
    }
}

/// Read errors after which reading again is right: the poll interval ran
/// out, or a signal interrupted the call.
fn is_retry(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Writes replies, headers and data, with as few `writev(2)` calls as the
/// socket allows (one, unless it is full or there are over 500 replies).
fn write_replies(socket: &BlockingSocket, replies: &[EncodedReply]) -> io::Result<()> {
    let mut parts: Vec<IoSlice<'_>> = Vec::with_capacity(2 * replies.len());
    for reply in replies {
        parts.push(IoSlice::new(&reply.head));
        if let Some(data) = &reply.data {
            parts.push(IoSlice::new(data));
        }
    }
    let mut parts = &mut parts[..];
    IoSlice::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        match socket.write_vectored(parts) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut parts, written),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// Bytes read from the socket and not yet taken: `bytes[start..end]`.
struct ReadBuffer {
    bytes: Box<[u8]>,
    start: usize,
    end: usize,
    /// The next read takes at most a request header (after a payload read
    /// straight from the socket).
    header_next: bool,
}

impl ReadBuffer {
    fn new(leftover: &[u8]) -> ReadBuffer {
        let mut bytes = vec![0; READ_BUFFER_BYTES.max(leftover.len())].into_boxed_slice();
        bytes[..leftover.len()].copy_from_slice(leftover);
        ReadBuffer {
            bytes,
            start: 0,
            end: leftover.len(),
            header_next: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// One `read(2)` into the whole buffer, which every caller has emptied
    /// first; `Ok(0)` at the end of the stream.
    fn fill(&mut self, socket: &BlockingSocket) -> io::Result<usize> {
        debug_assert!(self.is_empty());
        let limit = if self.header_next {
            REQUEST_HEADER_BYTES
        } else {
            self.bytes.len()
        };
        let count = socket.read(&mut self.bytes[..limit])?;
        self.header_next = false;
        (self.start, self.end) = (0, count);
        Ok(count)
    }

    /// As much as is buffered, up to `limit` bytes, taken from the buffer.
    fn take(&mut self, limit: usize) -> &[u8] {
        let count = limit.min(self.end - self.start);
        self.start += count;
        &self.bytes[self.start - count..self.start]
    }

    /// Drops up to `length` buffered bytes; returns how many.
    fn skip(&mut self, length: u64) -> u64 {
        let count = length.min((self.end - self.start) as u64);
        self.start += count as usize;
        count
    }
}

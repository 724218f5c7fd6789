//! Async transmission: requests in, replies out, many in flight, on tasks
//! of a tokio runtime (proto.md "Transmission"). What each request means is
//! decided in `requests.rs`; `threaded.rs` is the other way to serve it.
//!
//! ```text
//!                  ┌──────────────────────── one connection ─────────────────────────┐
//!                  │                                                                 │
//!  client ─bytes─▶ │ reader ── take permit ── read header (+ WRITE payload)          │
//!                  │   │                                                             │
//!                  │   ├─ invalid request ──── error reply ────────┐                 │
//!                  │   │                                           ▼                 │
//!                  │   └─ valid: spawn ─▶ request task ──reply──▶ queue (mpsc,       │
//!                  │        (JoinSet)      backend.op().await      bounded)          │
//!                  │                                                │                │
//!  client ◀─bytes─ │                                   writer task ─┘ write, flush,  │
//!                  │                                               release permit    │
//!                  └─────────────────────────────────────────────────────────────────┘
//! ```
//!
//! * The reader is the only party that reads the socket. It takes a permit
//!   from a semaphore of `max_in_flight` before reading each request, and
//!   each permit travels with its request until the writer has written the
//!   reply: at most `max_in_flight` requests (and their buffers) exist per
//!   connection, and a client that pipelines more simply waits.
//! * Every valid request runs in its own task; replies go out in completion
//!   order, each as one message (a simple reply, or one structured chunk
//!   flagged `NBD_REPLY_FLAG_DONE`), matched by the client's cookie. A
//!   write's reply is queued only after `Backend::write` completed, which is
//!   what makes `NBD_CMD_FLUSH` and `NBD_FLAG_CAN_MULTI_CONN` hold.
//! * The writer is the only party that writes the socket; it takes every
//!   reply queued so far and writes their headers and read data with one
//!   vectored write (read data is never copied into the write buffer), and
//!   flushes when the queue runs dry, so bursts of replies share a system
//!   call.
//! * Invalid requests are answered without reaching the backend and leave
//!   the connection usable, as long as the stream stays in step: a wrong
//!   magic number, or a write payload too large even to discard, ends the
//!   connection.
//!
//! Ending: `NBD_CMD_DISC` or the end of the stream stops the reader; the
//! connection then waits for every request task (their backend operations
//! complete even if the client is gone), lets the writer send what is
//! queued, and closes. On shutdown the reader keeps answering requests that
//! arrive with `NBD_ESHUTDOWN` until nothing is in flight, then the
//! connection closes the same way.

use std::future::Future;
use std::io::{self, IoSlice};
use std::sync::Arc;
use std::task::{Context, Waker};

use bytes::BufMut;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter,
};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use crate::error::ConnectionError;
use crate::protocol::*;
use crate::requests::{
    admit, aligned_capacity, parse_header, payload_plan, refuse_for_shutdown, run, Admission,
    Incoming, Payload, PayloadPlan, Session, Summing, DIRECT_PAYLOAD_MIN,
};
use crate::server::shutdown_requested;

/// Serves requests until the client disconnects, the stream breaks, or
/// shutdown drains the connection.
pub(crate) async fn transmit<R, W>(
    reader: BufReader<R>,
    writer: BufWriter<W>,
    session: Session,
    max_in_flight: usize,
    shutdown: watch::Receiver<bool>,
    offload: Option<Handle>,
) -> Result<(), ConnectionError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    // Every reply but the NBD_ESHUTDOWN refusals of a draining connection
    // holds a permit, so this bound only ever limits those refusals.
    let (replies, queue) = mpsc::channel(max_in_flight);
    let writer = WriterTask(tokio::spawn(write_replies(queue, writer)));
    let mut requests = Requests {
        reader,
        direct: false,
        session: Arc::new(session),
        permits: Arc::new(Semaphore::new(max_in_flight)),
        max_in_flight: max_in_flight as u32,
        replies,
        tasks: JoinSet::new(),
        shutdown,
        offload,
    };
    let ended = requests.run().await;
    let Requests {
        replies, mut tasks, ..
    } = requests;
    drop(replies);
    while tasks.join_next().await.is_some() {}
    let written = writer.finish().await;
    ended?;
    written.map_err(ConnectionError::from)
}

/// A reply on its way to the writer, with the permit of its request.
struct Outgoing {
    reply: EncodedReply,
    _permit: Option<OwnedSemaphorePermit>,
}

/// The writer task; aborted if the connection is dropped before it ends.
struct WriterTask(JoinHandle<io::Result<()>>);

impl WriterTask {
    async fn finish(mut self) -> io::Result<()> {
        match (&mut self.0).await {
            Ok(result) => result,
            Err(join_error) => Err(io::Error::other(join_error)),
        }
    }
}

impl Drop for WriterTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Replies gathered for one vectored write: a burst of completions goes out
/// in one system call, well below the kernel's 1024 slices per call (each
/// reply takes at most two).
const REPLIES_PER_WRITE: usize = 64;

/// Bytes after which a batch takes no further reply: a reply's buffer is
/// freed as soon as its batch is written, and holding several large read
/// buffers until a long batch is out only makes the allocator hand out
/// fresh (zeroed, faulted-in) memory for the next reads.
const BATCH_BYTES_MAX: usize = 128 << 10;

/// Writes queued replies until every sender is gone.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut queue: mpsc::Receiver<Outgoing>,
    mut out: BufWriter<W>,
) -> io::Result<()> {
    let mut batch = Vec::with_capacity(REPLIES_PER_WRITE);
    while let Some(first) = queue.recv().await {
        let mut bytes = first.reply.len();
        batch.push(first);
        loop {
            while batch.len() < REPLIES_PER_WRITE && bytes < BATCH_BYTES_MAX {
                match queue.try_recv() {
                    Ok(next) => {
                        bytes += next.reply.len();
                        batch.push(next);
                    }
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            write_batch(&mut out, &batch).await?;
            // Permits are released here, once their replies are written.
            batch.clear();
            bytes = 0;
        }
        out.flush().await?;
    }
    // Everything is flushed; closing our direction is a courtesy that fails
    // harmlessly if the client already closed the connection.
    let _ = out.shutdown().await;
    Ok(())
}

/// Writes the replies of `batch` in order, headers and read data side by
/// side in one vectored write. The write buffer gathers small batches; a
/// batch carrying [`DIRECT_PAYLOAD_MIN`] bytes of read data or more goes
/// to the socket itself, after whatever the buffer holds, since the buffer
/// would copy in any batch smaller than itself (a quarter of the daemon's
/// CPU in a stream of 64 KiB reads).
async fn write_batch<W: AsyncWrite + Unpin>(
    out: &mut BufWriter<W>,
    batch: &[Outgoing],
) -> io::Result<()> {
    let data_bytes: usize = batch
        .iter()
        .filter_map(|outgoing| outgoing.reply.data.as_ref())
        .map(|data| data.len())
        .sum();
    let direct = data_bytes >= DIRECT_PAYLOAD_MIN;
    if direct {
        out.flush().await?;
    }
    let mut slices = Vec::with_capacity(batch.len() * 2);
    for outgoing in batch {
        slices.push(IoSlice::new(&outgoing.reply.head));
        if let Some(data) = outgoing.reply.data.as_ref().filter(|data| !data.is_empty()) {
            slices.push(IoSlice::new(data));
        }
    }
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let written = if direct {
            out.get_mut().write_vectored(rest).await?
        } else {
            out.write_vectored(rest).await?
        };
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, written);
    }
    Ok(())
}

/// Waits for the next request: `None` at the end of the stream, else how
/// many bytes of its header were read into `head`: some, from the socket
/// alone, after a payload read straight from it (`direct`, with nothing
/// buffered); none where the reader's buffer holds them. Cancel-safe.
async fn next_request<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    direct: bool,
    head: &mut [u8],
) -> io::Result<Option<usize>> {
    if direct && reader.buffer().is_empty() {
        let got = reader.get_mut().read(head).await?;
        Ok((got > 0).then_some(got))
    } else {
        Ok((!reader.fill_buf().await?.is_empty()).then_some(0))
    }
}

/// Reads one request: header, and for `NBD_CMD_WRITE` its payload. `head`
/// holds the header's first bytes where the caller read them from the
/// socket itself (the reader's buffer then being empty).
///
/// The reader's buffer takes in many small requests with one `read(2)`,
/// but a large payload that passed through it would be copied once more
/// (a sixth of the daemon's CPU in a stream of 64 KiB writes). So what of
/// a payload of [`DIRECT_PAYLOAD_MIN`] or more the buffer does not hold is
/// read straight into the payload, and `direct` is set: the caller then
/// reads the next header from the socket alone, which keeps the reader
/// from pulling the payload after it into its buffer. A request without
/// such a payload clears `direct`, and the buffer takes over again.
async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    head: &[u8],
    session: &Session,
    direct: &mut bool,
) -> Result<Incoming, ConnectionError> {
    let mut bytes = [0; REQUEST_HEADER_BYTES];
    bytes[..head.len()].copy_from_slice(head);
    if head.is_empty() {
        reader.read_exact(&mut bytes).await?;
    } else {
        debug_assert!(reader.buffer().is_empty());
        reader
            .get_mut()
            .read_exact(&mut bytes[head.len()..])
            .await?;
    }
    let header = parse_header(&bytes)?;
    let mut went_direct = false;
    let payload = match payload_plan(&header, session.payload_limit())? {
        PayloadPlan::None => Payload::None,
        PayloadPlan::Discard(length) => {
            let mut part = reader.take(length);
            let dropped = tokio::io::copy_buf(&mut part, &mut tokio::io::sink()).await?;
            if dropped < length {
                return Err(ConnectionError::Truncated);
            }
            Payload::Discarded
        }
        PayloadPlan::Read(length) => {
            // Read into uninitialised capacity (no zeroing of up to 32 MiB
            // first), aligned for direct-I/O backends.
            let mut data = aligned_capacity(length);
            let mut summing = Summing::new(session, &header);
            let held = reader.buffer().len().min(length);
            data.extend_from_slice(&reader.buffer()[..held]);
            reader.consume(held);
            if length - held >= DIRECT_PAYLOAD_MIN {
                went_direct = true;
                while data.len() < length {
                    summing.take(&data);
                    let rest = length - data.len();
                    let mut spare = (&mut data).limit(rest);
                    if reader.get_mut().read_buf(&mut spare).await? == 0 {
                        return Err(ConnectionError::Truncated);
                    }
                }
            } else {
                let mut part = reader.take((length - held) as u64);
                while data.len() < length {
                    if part.read_buf(&mut data).await? == 0 {
                        return Err(ConnectionError::Truncated);
                    }
                }
            }
            summing.finish(data.freeze())
        }
    };
    *direct = went_direct;
    Ok(Incoming { header, payload })
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Disconnect,
}

/// The reader side of a connection.
struct Requests<R> {
    reader: BufReader<R>,
    /// The last request's payload was read straight from the socket: read
    /// the next header from the socket alone (see [`read_request`]).
    direct: bool,
    session: Arc<Session>,
    permits: Arc<Semaphore>,
    max_in_flight: u32,
    replies: mpsc::Sender<Outgoing>,
    tasks: JoinSet<()>,
    shutdown: watch::Receiver<bool>,
    /// Where large requests run (see [`OFFLOAD_MIN_BYTES`]).
    offload: Option<Handle>,
}

/// Requests moving at least this many bytes run on the offload runtime when
/// there is one; smaller ones run on the connection's thread from start to
/// reply.
///
/// A large request's cost is copying bytes and submitting them to the
/// disks, which parallelises across cores and dwarfs the cross-thread
/// wake-ups that moving it costs (1 MiB writes at 8 in flight ran at 0.88
/// of `nbdkit file` when started on the connection thread, 1.24 when not).
/// Below this the wake-ups dominate. A read of a file device costs the
/// connection's thread only its submission (the disk fills the buffer),
/// and a write's payload is already copied in by the time it is
/// dispatched; the writes' submissions go to the devices' reactors
/// (`hand_off_submissions` in terrace-io). On a simple space over raw
/// files, keeping 64 KiB requests here took streams of reads at 64 and 512
/// in flight from 1,195–1,580 and 1,156–1,564 MB/s to 1,552–1,909 and
/// 1,598–2,020, and restores at 8 in flight from 0.66–0.71 to 0.80–0.81 ×
/// the raw files (docs/BENCHMARKS.md).
const OFFLOAD_MIN_BYTES: u32 = 256 << 10;

impl<R: AsyncRead + Unpin> Requests<R> {
    async fn run(&mut self) -> Result<(), ConnectionError> {
        loop {
            let permit = tokio::select! {
                biased;
                _ = shutdown_requested(&mut self.shutdown) => return self.drain().await,
                permit = self.permits.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_closed) => return Ok(()),
                },
            };
            // Wait for the first byte of the next request; shutdown may
            // interrupt only here, never in the middle of a message.
            let mut head = [0; REQUEST_HEADER_BYTES];
            let got = tokio::select! {
                biased;
                next = next_request(&mut self.reader, self.direct, &mut head) => match next? {
                    Some(got) => got,
                    None => return Ok(()),
                },
                _ = shutdown_requested(&mut self.shutdown) => {
                    // Draining waits for every permit, this one included.
                    drop(permit);
                    return self.drain().await;
                }
            };
            let incoming = read_request(
                &mut self.reader,
                &head[..got],
                &self.session,
                &mut self.direct,
            )
            .await?;
            if self.dispatch(incoming, permit).await == Flow::Disconnect {
                return Ok(());
            }
        }
    }

    /// After shutdown: answer whatever arrives with `NBD_ESHUTDOWN` until
    /// no request is in flight any more (all permits are back).
    async fn drain(&mut self) -> Result<(), ConnectionError> {
        let permits = self.permits.clone();
        loop {
            tokio::select! {
                biased;
                _ = permits.acquire_many(self.max_in_flight) => return Ok(()),
                ready = self.reader.fill_buf() => if ready?.is_empty() { return Ok(()) },
            }
            let incoming =
                read_request(&mut self.reader, &[], &self.session, &mut self.direct).await?;
            match refuse_for_shutdown(&self.session, &incoming.header) {
                Some(reply) => self.send(reply, None).await,
                None => return Ok(()),
            }
        }
    }

    /// Answers an invalid request at once, or starts a task for a valid one.
    async fn dispatch(&mut self, incoming: Incoming, permit: OwnedSemaphorePermit) -> Flow {
        let job = match admit(&self.session, incoming) {
            Admission::Disconnect => return Flow::Disconnect,
            Admission::Answer(reply) => {
                self.send(reply, Some(permit)).await;
                return Flow::Continue;
            }
            Admission::Run(job) => job,
        };
        let offload = self
            .offload
            .as_ref()
            .filter(|_| job.header.length >= OFFLOAD_MIN_BYTES);
        let write = job.header.kind == NBD_CMD_WRITE;
        let session = self.session.clone();
        let replies = self.replies.clone();
        let task = async move {
            let reply = run(&session, job).await;
            // A closed queue means the writer failed: the client is gone.
            let _ = replies
                .send(Outgoing {
                    reply,
                    _permit: Some(permit),
                })
                .await;
        };
        match offload {
            Some(handle) => {
                self.tasks.spawn_on(task, handle);
            }
            // A write starts here and now, in the order the requests came:
            // the engine recognises a stream of writes by the order they
            // reach it (a restore's 64 KiB pieces are gathered into whole
            // rows). Its first poll runs it up to its first wait, past the
            // point where the engine places it (gather, log or disks).
            None if write => {
                let mut task = Box::pin(task);
                let mut here = Context::from_waker(Waker::noop());
                if task.as_mut().poll(&mut here).is_pending() {
                    self.tasks.spawn(task);
                }
            }
            None => {
                self.tasks.spawn(task);
            }
        };
        // Reap finished tasks so a long-lived connection does not collect them.
        while self.tasks.try_join_next().is_some() {}
        Flow::Continue
    }

    /// Queues a reply the reader produced itself. Takes `&mut self` (not
    /// `&self`) so that the future needs only `R: Send`.
    async fn send(&mut self, reply: EncodedReply, permit: Option<OwnedSemaphorePermit>) {
        // A closed queue means the writer failed; the reader will see the
        // broken connection on its next read.
        let _ = self
            .replies
            .send(Outgoing {
                reply,
                _permit: permit,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};

    fn outgoing(head: u8, data: Option<Vec<u8>>) -> Outgoing {
        Outgoing {
            reply: EncodedReply {
                head: BytesMut::from(&[head; 16][..]),
                data: data.map(Bytes::from),
            },
            _permit: None,
        }
    }

    /// Small batches wait in the write buffer; a batch with much read data
    /// goes past it, but only after what the buffer holds.
    #[tokio::test]
    async fn replies_reach_the_wire_in_order_through_the_buffer_or_past_it() {
        let mut out = BufWriter::with_capacity(128 << 10, Vec::new());
        write_batch(
            &mut out,
            &[outgoing(1, None), outgoing(2, Some(vec![3; 100]))],
        )
        .await
        .unwrap();
        assert!(
            out.get_ref().is_empty(),
            "a small batch waits in the buffer"
        );
        let large = vec![5; DIRECT_PAYLOAD_MIN];
        write_batch(&mut out, &[outgoing(4, Some(large.clone()))])
            .await
            .unwrap();
        assert!(
            out.buffer().is_empty(),
            "a large batch goes past the buffer"
        );
        let wire = out.into_inner();
        let mut expected = vec![1; 16];
        expected.extend([2; 16]);
        expected.extend([3; 100]);
        expected.extend([4; 16]);
        expected.extend(large);
        assert!(wire == expected, "replies out of order on the wire");
    }
}

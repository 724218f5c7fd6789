//! Reading ahead of sequential streams of reads, per exported space.
//!
//! A client streaming a space with a few reads outstanding leaves the disks
//! idle for each request's round trip: at 8 outstanding 64 KiB reads each
//! disk of a simple space has one read or none in flight, where a raw file
//! read by the same client has one always. Here, once a space sees the
//! same stream read three times in a row (each read starting where the last
//! ended), the chunks after it are read into memory before they are asked
//! for, up to a window that doubles with every read served from it: the
//! disks see a deep queue, and the client's reads are answered from memory.
//! A client that keeps enough reads in flight itself needs none of it: the
//! window counts the stream's own reads in flight, so that reading ahead
//! never puts fewer bytes in flight than the client alone would, and a
//! stream with a quarter of its window's maximum of its own reads in
//! flight (2 MiB of the usual 8) is not read ahead at all.
//!
//! ```text
//!   read(offset) ── stream match? ── no ─▶ new stream (least recently used out)
//!        │              │ yes, 3rd in a row
//!        │              ▼
//!        │        issue chunks up to `window` ahead, less what the
//!        │        stream's own reads have in flight (spawned reads)
//!        ▼
//!   covered by chunks? ── yes ─▶ wait for them, answer a slice (or a copy
//!        │                       of the pieces of two); chunks the read
//!        │                       reached the end of are dropped
//!        └── no ─▶ read the space
//! ```
//!
//! Coherence. A write, zeroing or trim drops every chunk it overlaps, ready
//! or in flight, when it completes and before its reply is sent. A chunk
//! read before that completion is dropped with it; one issued after it
//! reads the new data. A read that found a chunk before the write completed
//! is concurrent with the write, and either data is an answer the protocol
//! allows. Every connection to a space shares its read-ahead (the catalog
//! keeps one per space), so a write on one connection drops chunks another
//! would read.
//!
//! Memory: at most [`HELD_MAX_BYTES`] per space (two windows where a space's
//! window is larger, at most 128 MiB), read or in flight; a stream
//! pushed out of the table takes its unread chunks with it, and one that
//! has stopped reading gives them up to a stream that needs the room.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, FutureExt, Shared};

/// Reads `length` bytes at `offset` for a chunk; `None` if that failed (the
/// reader then reads the space itself, and sees the error there).
pub type Fetch = Arc<dyn Fn(u64, u64) -> BoxFuture<'static, Option<Bytes>> + Send + Sync>;

/// Streams followed at once per space: a few clients or files read at once.
const STREAMS: usize = 8;
/// Reads of a stream, each starting where the one before ended, before it
/// is read ahead: one read alone, or two, is no stream.
const SEQUENTIAL_READS: u32 = 3;
/// Chunks ahead when a stream is first read ahead; doubled with every read
/// served from its chunks, up to the space's maximum.
const FIRST_WINDOW_CHUNKS: u64 = 2;
/// Bytes a stream's window reaches at most, unless the space asks for more
/// (a mirror, to reach its next copy's regions): enough ahead that every
/// disk of a wide space has several reads queued.
pub const WINDOW_MAX_BYTES: u64 = 8 << 20;
/// The most any space asks for.
pub const WINDOW_LIMIT_BYTES: u64 = 64 << 20;
/// A stream whose own reads in flight reach a quarter of its window's
/// maximum (2 MiB of the usual 8) is not read ahead: its client keeps the
/// disks busy itself, and its reads would wait for whole chunks instead of
/// their own pieces.
const DEEP_CLIENT_SHARE: u64 = 4;
/// Reads of the space, of any stream, after which a stream that has not
/// read since is idle: its chunks make way for a stream that needs room.
/// Many times the streams a space follows, so that streams read in turns
/// never take each other's chunks.
const IDLE_READS: u64 = 256;
/// Bytes a space's read-ahead holds at most, read or in flight: this, or
/// two windows where the space's window is larger.
pub const HELD_MAX_BYTES: u64 = 64 << 20;
/// The stream of chunks read for a client's hint (`NBD_CMD_CACHE`): no
/// stream's, never pushed out with one.
const HINTED: u64 = u64::MAX;
/// Bytes hinted chunks hold at most, so that streams keep room.
const HINTED_MAX_BYTES: u64 = HELD_MAX_BYTES / 2;
/// Chunk sizes: a row of the space's data where that fits.
const CHUNK_MIN_BYTES: u64 = 256 << 10;
const CHUNK_MAX_BYTES: u64 = 4 << 20;

type Pending = Shared<BoxFuture<'static, Option<Bytes>>>;

struct Chunk {
    length: u64,
    data: Pending,
    /// The stream it was read for.
    stream: u64,
}

struct Stream {
    id: u64,
    /// Bytes of its reads not answered yet: added under the lock, taken
    /// back by each read's [`InFlight`] when it ends, without it.
    outstanding: Arc<AtomicU64>,
    /// Where its next read is expected to start.
    next: u64,
    /// Its reads in a row, each where the last ended.
    sequential: u32,
    /// Chunks it keeps ahead of its reads.
    window: u64,
    /// Chunks are issued up to here.
    ahead: u64,
    /// When it last read (a counter), for choosing the one to replace.
    used: u64,
}

#[derive(Default)]
struct State {
    /// By start offset; chunks never overlap.
    chunks: BTreeMap<u64, Chunk>,
    streams: Vec<Stream>,
    /// Bytes of `chunks`.
    held: u64,
    /// Bytes of `chunks` read for hints ([`HINTED`]).
    hinted: u64,
    tick: u64,
    next_stream: u64,
}

/// How a read is answered; keep it until the read is (its stream counts
/// the read in flight until then).
pub struct Lookup {
    /// From these chunks, each with the part of the read it covers, as
    /// (offset in the chunk, length), in order; `None`: from the space.
    parts: Option<Vec<(Pending, u64, u64)>>,
    _in_flight: Option<InFlight>,
}

/// A read of a stream in flight: counted in its stream's `outstanding`
/// until dropped (a stream replaced meanwhile just loses its counter).
struct InFlight {
    outstanding: Arc<AtomicU64>,
    bytes: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.outstanding.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl Lookup {
    fn space() -> Lookup {
        Lookup {
            parts: None,
            _in_flight: None,
        }
    }

    /// The read's bytes from its chunks; `None` if it must read the space
    /// (no chunks cover it, or a chunk's read failed). Within one chunk, a
    /// slice of it: no copy.
    pub async fn gather(&mut self, length: u64) -> Option<Bytes> {
        let parts = self.parts.take()?;
        if let [(pending, at, part)] = &parts[..] {
            let data = pending.clone().await?;
            return Some(data.slice(*at as usize..(at + part) as usize));
        }
        let mut out = BytesMut::with_capacity(length as usize);
        for (pending, at, part) in parts {
            let data = pending.await?;
            out.extend_from_slice(&data[at as usize..(at + part) as usize]);
        }
        Some(out.freeze())
    }
}

pub struct ReadAhead {
    chunk_bytes: u64,
    window_max_chunks: u64,
    /// A stream with this much of its own reads in flight is not read ahead.
    deep_client_bytes: u64,
    held_max_bytes: u64,
    fetch: Fetch,
    state: Mutex<State>,
}

impl ReadAhead {
    /// Read-ahead for a space whose rows hold `row_bytes` of data, with
    /// windows of up to `window_bytes` (within 8–64 MiB), reading through
    /// `fetch`.
    pub fn new(row_bytes: u64, window_bytes: u64, fetch: Fetch) -> ReadAhead {
        let chunk_bytes = row_bytes
            .clamp(CHUNK_MIN_BYTES, CHUNK_MAX_BYTES)
            .next_multiple_of(4096);
        let window_bytes = window_bytes.clamp(WINDOW_MAX_BYTES, WINDOW_LIMIT_BYTES);
        ReadAhead {
            chunk_bytes,
            window_max_chunks: (window_bytes / chunk_bytes).max(FIRST_WINDOW_CHUNKS),
            deep_client_bytes: window_bytes / DEEP_CLIENT_SHARE,
            held_max_bytes: HELD_MAX_BYTES.max(2 * window_bytes),
            fetch,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A read of `[offset, offset + length)` of a space of `size` bytes
    /// arrives: follow its stream, read ahead of it if it is one, and say
    /// where its bytes come from. Called in the order reads arrive.
    pub fn read(&self, offset: u64, length: u64, size: u64) -> Lookup {
        let end = offset.saturating_add(length);
        if end > size {
            // The space answers what is wrong with it.
            return Lookup::space();
        }
        let mut state = self.lock();
        let parts = take_chunks(&mut state, offset, end);
        state.tick += 1;
        let tick = state.tick;
        let served = parts.is_some();
        let index = match state.streams.iter().position(|s| s.next == offset) {
            Some(index) => index,
            None => {
                let id = state.next_stream;
                state.next_stream += 1;
                let fresh = Stream {
                    id,
                    outstanding: Arc::default(),
                    next: offset,
                    sequential: 0,
                    window: FIRST_WINDOW_CHUNKS,
                    ahead: 0,
                    used: tick,
                };
                if state.streams.len() < STREAMS {
                    state.streams.push(fresh);
                    state.streams.len() - 1
                } else {
                    let oldest = (0..state.streams.len())
                        .min_by_key(|&i| state.streams[i].used)
                        .expect("a stream");
                    let gone = std::mem::replace(&mut state.streams[oldest], fresh).id;
                    drop_stream_chunks(&mut state, gone);
                    oldest
                }
            }
        };
        let window_max = self.window_max_chunks;
        let stream = &mut state.streams[index];
        stream.next = end;
        stream.sequential = stream.sequential.saturating_add(1);
        stream.used = tick;
        stream.outstanding.fetch_add(length, Ordering::Relaxed);
        if served {
            stream.window = (stream.window * 2).min(window_max);
        }
        let in_flight = InFlight {
            outstanding: stream.outstanding.clone(),
            bytes: length,
        };
        if stream.sequential >= SEQUENTIAL_READS {
            self.issue(&mut state, index, size);
        }
        Lookup {
            parts,
            _in_flight: Some(in_flight),
        }
    }

    /// Issue the chunks of stream `index` past its reads, up to its window
    /// less its own reads in flight, within the space and the memory bound.
    fn issue(&self, state: &mut State, index: usize, size: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let chunk = self.chunk_bytes;
        let stream = &state.streams[index];
        let outstanding = stream.outstanding.load(Ordering::Relaxed);
        if outstanding >= self.deep_client_bytes {
            return;
        }
        let id = stream.id;
        let mut start = stream.ahead.max(stream.next).next_multiple_of(chunk);
        let until = stream
            .next
            .saturating_add((stream.window * chunk).saturating_sub(outstanding))
            .min(size);
        let mut index = index;
        while start < until {
            if state.held + chunk > self.held_max_bytes {
                if !drop_idle_stream(state, id) {
                    break;
                }
                // Dropping another stream may have moved this one.
                index = state
                    .streams
                    .iter()
                    .position(|s| s.id == id)
                    .expect("only other streams are dropped");
            }
            let length = chunk.min(size - start);
            self.spawn_chunk(&runtime, state, start, length, id);
            start += length;
            state.streams[index].ahead = start;
        }
    }

    /// A client says it will read `[offset, offset + length)` of a space of
    /// `size` bytes soon (`NBD_CMD_CACHE`): read the chunks covering it,
    /// as far as the bounds allow. They are answered, dropped and kept
    /// coherent as a stream's are.
    pub fn prefetch(&self, offset: u64, length: u64, size: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let chunk = self.chunk_bytes;
        let end = offset.saturating_add(length).min(size);
        let mut state = self.lock();
        let mut start = offset / chunk * chunk;
        while start < end {
            let length = chunk.min(size - start);
            if state.held + length > self.held_max_bytes || state.hinted + length > HINTED_MAX_BYTES
            {
                break;
            }
            self.spawn_chunk(&runtime, &mut state, start, length, HINTED);
            start += length;
        }
    }

    /// Read the chunk at `start` for `stream`, unless it is there already.
    fn spawn_chunk(
        &self,
        runtime: &tokio::runtime::Handle,
        state: &mut State,
        start: u64,
        length: u64,
        stream: u64,
    ) {
        if let Entry::Vacant(vacant) = state.chunks.entry(start) {
            let task = runtime.spawn((self.fetch)(start, length));
            let data = async move { task.await.ok().flatten() }.boxed().shared();
            vacant.insert(Chunk {
                length,
                data,
                stream,
            });
            state.held += length;
            if stream == HINTED {
                state.hinted += length;
            }
        }
    }

    /// `[offset, offset + length)` changed: drop every chunk it overlaps.
    /// Call when the change has completed, before it is acknowledged.
    pub fn changed(&self, offset: u64, length: u64) {
        let end = offset.saturating_add(length);
        let mut state = self.lock();
        let overlapping: Vec<u64> = state
            .chunks
            .range(..end)
            .rev()
            .take_while(|(&start, chunk)| start + chunk.length > offset)
            .map(|(&start, _)| start)
            .collect();
        for start in overlapping {
            remove_chunk(&mut state, start);
        }
        // Streams going through it read ahead again from where they are.
        for stream in state.streams.iter_mut() {
            if stream.ahead > offset {
                stream.ahead = stream.ahead.min(stream.next.max(offset));
            }
        }
    }

    /// Bytes held, read or in flight.
    #[cfg(test)]
    fn held_bytes(&self) -> u64 {
        self.lock().held
    }
}

/// The chunks covering `[offset, end)` if they cover all of it (the ones
/// the read reaches the end of are dropped: the stream has passed them).
fn take_chunks(state: &mut State, offset: u64, end: u64) -> Option<Vec<(Pending, u64, u64)>> {
    if end <= offset {
        return None;
    }
    let mut parts = Vec::new();
    let mut at = offset;
    let mut passed = Vec::new();
    let (&first, _) = state.chunks.range(..=offset).next_back()?;
    for (&start, chunk) in state.chunks.range(first..) {
        if start > at || at >= end {
            break;
        }
        let chunk_end = start + chunk.length;
        if chunk_end <= at {
            continue;
        }
        let part_end = chunk_end.min(end);
        parts.push((chunk.data.clone(), at - start, part_end - at));
        if chunk_end <= end {
            passed.push(start);
        }
        at = part_end;
    }
    if at < end {
        return None;
    }
    for start in passed {
        remove_chunk(state, start);
    }
    Some(parts)
}

fn remove_chunk(state: &mut State, start: u64) {
    if let Some(chunk) = state.chunks.remove(&start) {
        state.held -= chunk.length;
        if chunk.stream == HINTED {
            state.hinted -= chunk.length;
        }
    }
}

/// Make room for stream `reader`: forget the least recently used other
/// stream that has not read for [`IDLE_READS`] reads of the space and
/// holds chunks, with its chunks (a stream that stopped, such as a client
/// that read a file to its end and went on elsewhere, would otherwise keep
/// them until enough new streams pushed it out). Whether one was.
fn drop_idle_stream(state: &mut State, reader: u64) -> bool {
    let tick = state.tick;
    let idle = state
        .streams
        .iter()
        .enumerate()
        .filter(|(_, s)| s.id != reader && s.used + IDLE_READS <= tick)
        .filter(|(_, s)| state.chunks.values().any(|chunk| chunk.stream == s.id))
        .min_by_key(|(_, s)| s.used)
        .map(|(index, s)| (index, s.id));
    let Some((index, id)) = idle else {
        return false;
    };
    state.streams.swap_remove(index);
    drop_stream_chunks(state, id);
    true
}

fn drop_stream_chunks(state: &mut State, stream: u64) {
    let starts: Vec<u64> = state
        .chunks
        .iter()
        .filter(|(_, chunk)| chunk.stream == stream)
        .map(|(&start, _)| start)
        .collect();
    for start in starts {
        remove_chunk(state, start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    const MIB: u64 = 1 << 20;

    /// A space in memory whose reads are counted.
    struct Disk {
        data: Mutex<Vec<u8>>,
        reads: AtomicU64,
        read_bytes: AtomicU64,
        /// Every read, as (offset, length).
        log: Mutex<Vec<(u64, u64)>>,
    }

    impl Disk {
        fn new(size: u64) -> Arc<Disk> {
            let data = (0..size).map(|i| (i / 4096 % 251) as u8).collect();
            Arc::new(Disk {
                data: Mutex::new(data),
                reads: AtomicU64::new(0),
                read_bytes: AtomicU64::new(0),
                log: Mutex::new(Vec::new()),
            })
        }

        fn read(&self, offset: u64, length: u64) -> Bytes {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.read_bytes.fetch_add(length, Ordering::SeqCst);
            self.log.lock().unwrap().push((offset, length));
            let data = self.data.lock().unwrap();
            Bytes::copy_from_slice(&data[offset as usize..(offset + length) as usize])
        }

        /// The bytes at `[offset, offset + length)`, not counted as a read.
        fn expected(&self, offset: u64, length: u64) -> Vec<u8> {
            self.data.lock().unwrap()[offset as usize..(offset + length) as usize].to_vec()
        }

        fn write(&self, offset: u64, bytes: &[u8]) {
            let mut data = self.data.lock().unwrap();
            data[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        }

        fn fetch(self: &Arc<Self>) -> Fetch {
            let disk = self.clone();
            Arc::new(move |offset, length| {
                let bytes = disk.read(offset, length);
                async move { Some(bytes) }.boxed()
            })
        }
    }

    /// A space of `size` bytes in memory, and a read-ahead over it in 1 MiB
    /// chunks.
    fn space(size: u64) -> (Arc<Disk>, Arc<ReadAhead>) {
        space_with_window(size, WINDOW_MAX_BYTES)
    }

    /// As [`space`], with windows of up to `window` bytes.
    fn space_with_window(size: u64, window: u64) -> (Arc<Disk>, Arc<ReadAhead>) {
        let disk = Disk::new(size);
        let ahead = Arc::new(ReadAhead::new(MIB, window, disk.fetch()));
        (disk, ahead)
    }

    /// Read through the read-ahead, as the backend does.
    async fn read(ahead: &Arc<ReadAhead>, disk: &Disk, offset: u64, length: u64) -> Vec<u8> {
        let size = disk.data.lock().unwrap().len() as u64;
        match ahead.read(offset, length, size).gather(length).await {
            Some(bytes) => bytes.to_vec(),
            None => disk.read(offset, length).to_vec(),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    /// A stream read 64 KiB at a time is read ahead after its third read
    /// and then answered from chunks: the space sees whole chunks, far
    /// fewer reads than the stream makes, and every byte is right.
    #[test]
    fn a_sequential_stream_is_read_ahead_in_whole_chunks() {
        runtime().block_on(async {
            let (disk, ahead) = space(64 * MIB);
            let step = 64 << 10;
            for offset in (0..32 * MIB).step_by(step as usize) {
                let got = read(&ahead, &disk, offset, step).await;
                assert!(got == disk.expected(offset, step), "differs at {offset}");
            }
            let reads = disk.reads.load(Ordering::SeqCst);
            // 512 reads of the stream; the space saw the first few and then
            // 1 MiB chunks (a little past the stream's end, never more than
            // the window).
            assert!(reads < 64, "{reads} reads of the space");
            let read_bytes = disk.read_bytes.load(Ordering::SeqCst);
            assert!(read_bytes <= 32 * MIB + WINDOW_MAX_BYTES, "{read_bytes}");
            assert!(ahead.held_bytes() <= WINDOW_MAX_BYTES + MIB);
        });
    }

    /// A space that asks for a wider window (a mirror) is read further
    /// ahead, also beside a client with 4 MiB of reads in flight, where the
    /// usual window would stop; its reads and the chunks together still
    /// stay within the window.
    #[test]
    fn a_wider_window_reads_further_ahead_and_beside_deeper_clients() {
        runtime().block_on(async {
            let (disk, ahead) = space_with_window(128 * MIB, 32 * MIB);
            let (step, size) = (64 << 10, 128 * MIB);
            let mut most = 0;
            for offset in (0..16 * MIB).step_by(step as usize) {
                let got = read(&ahead, &disk, offset, step).await;
                assert!(got == disk.expected(offset, step), "differs at {offset}");
                most = most.max(ahead.held_bytes());
            }
            assert!(most > WINDOW_MAX_BYTES && most <= 33 * MIB, "{most}");
            let mut in_flight = std::collections::VecDeque::new();
            for offset in (16 * MIB..64 * MIB).step_by(step as usize) {
                in_flight.push_back(ahead.read(offset, step, size));
                if in_flight.len() > 64 {
                    let mut oldest = in_flight.pop_front().unwrap();
                    let _ = oldest.gather(step).await;
                }
                let outstanding = in_flight.len() as u64 * step;
                assert!(ahead.held_bytes() + outstanding <= 34 * MIB);
            }
            assert!(ahead.held_bytes() > 8 * MIB, "{}", ahead.held_bytes());
        });
    }

    /// Streams that stopped hold their chunks until a stream that needs
    /// the room has read for a while; then they go, and it is read ahead.
    #[test]
    fn streams_that_stopped_make_room_for_one_that_reads() {
        runtime().block_on(async {
            let (disk, ahead) = space_with_window(192 * MIB, 32 * MIB);
            let step = 64 << 10;
            for first in [0, 64 * MIB] {
                for offset in (first..first + 16 * MIB).step_by(step as usize) {
                    read(&ahead, &disk, offset, step).await;
                }
            }
            // Two stopped streams fill the 64 MiB between them.
            assert!(ahead.held_bytes() > 48 * MIB, "{}", ahead.held_bytes());
            let before = disk.reads.load(Ordering::SeqCst);
            for offset in (128 * MIB..160 * MIB).step_by(step as usize) {
                let got = read(&ahead, &disk, offset, step).await;
                assert!(got == disk.expected(offset, step), "differs at {offset}");
                assert!(ahead.held_bytes() <= 64 * MIB);
            }
            // 512 reads of 64 KiB: read from the space itself only until
            // the stopped streams were idle for 256 reads, then in chunks.
            let reads = disk.reads.load(Ordering::SeqCst) - before;
            assert!(reads < 320, "{reads} reads of the space");
        });
    }

    /// A client with many reads of its stream in flight is read ahead only
    /// by what its own reads leave of the window: together they never pass
    /// it, and a client deeper than the window gets no chunks at all.
    #[test]
    fn a_stream_with_many_reads_in_flight_is_read_ahead_less() {
        runtime().block_on(async {
            let (disk, ahead) = space(64 * MIB);
            let step = 64 << 10;
            let size = 64 * MIB;
            // Reads answered at once until the window has grown.
            for offset in (0..4 * MIB).step_by(step as usize) {
                read(&ahead, &disk, offset, step).await;
            }
            assert!(ahead.held_bytes() > 0, "nothing read ahead");
            // Then reads kept in flight, as a client 160 deep keeps them.
            let mut in_flight = std::collections::VecDeque::new();
            for (i, offset) in (4 * MIB..40 * MIB).step_by(step as usize).enumerate() {
                in_flight.push_back(ahead.read(offset, step, size));
                if in_flight.len() > 160 {
                    let mut oldest = in_flight.pop_front().unwrap();
                    let _ = oldest.gather(step).await;
                }
                let outstanding = in_flight.len() as u64 * step;
                assert!(
                    ahead.held_bytes() + outstanding <= WINDOW_MAX_BYTES + 2 * MIB || i < 64,
                    "{} read ahead beside {outstanding} in flight",
                    ahead.held_bytes()
                );
            }
            // 10 MiB in flight, beyond the window: nothing ahead of it.
            assert_eq!(ahead.held_bytes(), 0);
        });
    }

    /// Chunks read for a hint answer the reads of the range that follow,
    /// and hints together hold no more than their share.
    #[test]
    fn a_hinted_range_is_read_once_and_answers_its_reads() {
        runtime().block_on(async {
            let (disk, ahead) = space(256 * MIB);
            ahead.prefetch(8 * MIB + 4096, 4 * MIB, 256 * MIB);
            tokio::task::yield_now().await;
            assert_eq!(disk.reads.load(Ordering::SeqCst), 5, "5 chunks of 1 MiB");
            let step = 64 << 10;
            for offset in (8 * MIB..12 * MIB).step_by(step as usize) {
                let got = read(&ahead, &disk, offset, step).await;
                assert!(got == disk.expected(offset, step), "differs at {offset}");
            }
            // The range was read as its chunks, once each (the stream its
            // reads formed is read ahead past it).
            let within: Vec<(u64, u64)> = disk
                .log
                .lock()
                .unwrap()
                .iter()
                .copied()
                .filter(|&(offset, _)| offset < 12 * MIB)
                .collect();
            assert_eq!(within, (8..12).map(|i| (i * MIB, MIB)).collect::<Vec<_>>());
            ahead.prefetch(0, 256 * MIB, 256 * MIB);
            let hinted = ahead.lock().hinted;
            assert!(hinted > 0 && hinted <= HINTED_MAX_BYTES, "{hinted}");
            assert!(ahead.held_bytes() <= HELD_MAX_BYTES);
        });
    }

    /// Random reads are never read ahead.
    #[test]
    fn random_reads_are_not_read_ahead() {
        runtime().block_on(async {
            let (disk, ahead) = space(64 * MIB);
            let mut x = 7u64;
            for _ in 0..500 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let offset = (x >> 33) % (64 * MIB / 8192) * 8192;
                read(&ahead, &disk, offset, 8192).await;
            }
            assert_eq!(disk.reads.load(Ordering::SeqCst), 500);
            assert_eq!(ahead.held_bytes(), 0);
        });
    }

    /// A write into chunks read ahead (ready or in flight) drops them: the
    /// stream then reads the new data, on this stream and any other.
    #[test]
    fn a_write_drops_the_chunks_it_overlaps() {
        runtime().block_on(async {
            let (disk, ahead) = space(64 * MIB);
            let step = 64 << 10;
            for offset in (0..MIB).step_by(step as usize) {
                read(&ahead, &disk, offset, step).await;
            }
            assert!(ahead.held_bytes() > 0, "nothing read ahead");
            // Let the chunks' reads run, then overwrite inside them.
            tokio::task::yield_now().await;
            let new = vec![0xa5u8; 8192];
            let at = MIB + 100 * 4096;
            disk.write(at, &new);
            ahead.changed(at, new.len() as u64);
            for offset in (MIB..4 * MIB).step_by(step as usize) {
                let got = read(&ahead, &disk, offset, step).await;
                assert!(got == disk.expected(offset, step), "stale data at {offset}");
            }
        });
    }

    /// The memory bound holds with many streams at once, and a stream
    /// pushed out of the table takes its chunks with it.
    #[test]
    fn many_streams_stay_within_the_memory_bound() {
        runtime().block_on(async {
            let (disk, ahead) = space(256 * MIB);
            let step = 64 << 10;
            let streams = 2 * STREAMS as u64;
            for round in 0..16u64 {
                for stream in 0..streams {
                    let offset = stream * 16 * MIB + round * step;
                    let got = read(&ahead, &disk, offset, step).await;
                    assert!(got == disk.expected(offset, step), "differs at {offset}");
                    assert!(ahead.held_bytes() <= HELD_MAX_BYTES);
                }
            }
            // More streams than the table: each is replaced before its
            // third read, so none was read ahead.
            assert_eq!(ahead.held_bytes(), 0);
            // As many as the table holds: each is read ahead, together
            // up to the bound.
            for round in 16..64u64 {
                for stream in 0..STREAMS as u64 {
                    let offset = stream * 16 * MIB + round * step;
                    let got = read(&ahead, &disk, offset, step).await;
                    assert!(got == disk.expected(offset, step), "differs at {offset}");
                    assert!(ahead.held_bytes() <= HELD_MAX_BYTES);
                }
            }
            assert!(ahead.held_bytes() > 0, "nothing read ahead");
        });
    }
}

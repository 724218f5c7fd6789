//! What a request means, whichever transmission mode serves it: the
//! payload that follows its header, whether it is valid, what the backend
//! does with it, and the reply (proto.md "Request types", "Error values").
//!
//! ```text
//!   header bytes ─▶ parse_header ─▶ payload_plan ─▶ (mode reads or drops the payload)
//!                                                        │
//!            Incoming ─▶ admit ─┬─ Disconnect (NBD_CMD_DISC)
//!                               ├─ Answer(reply)   refused at the edge
//!                               └─ Run(job) ─▶ run: backend, reply encoded
//! ```
//!
//! The two modes, `transmission.rs` (tasks on a runtime) and `threaded.rs`
//! (a few OS threads per connection), only move bytes and decide who does
//! what when; every protocol decision is made here, so they cannot
//! disagree.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::FutureExt;

use crate::error::ConnectionError;
use crate::handshake::transmission_flags;
use crate::protocol::*;
use crate::{Backend, BlockSizes, BlockSum, Errno, Extent, SUMMED_BLOCK_BYTES};

/// Largest write payload above the advertised maximum that the server reads
/// and drops (answering `NBD_EINVAL`) to keep the connection usable. The
/// spec asks servers not to treat anything up to 32 MiB as an attack even
/// when a smaller maximum was advertised; twice that covers every real
/// client. A larger announcement gets a hard disconnect.
pub(crate) const WRITE_DISCARD_MAX_BYTES: u32 = 64 << 20;

/// What the handshake settled for one connection.
pub(crate) struct Session {
    pub backend: Arc<dyn Backend>,
    /// The size sent to the client; requests are checked against it.
    pub size: u64,
    pub read_only: bool,
    /// On spinning media (`Backend::rotational`), as advertised.
    pub rotational: bool,
    /// As advertised; `maximum` is the payload limit this server enforces.
    pub block_sizes: BlockSizes,
    pub structured: bool,
    /// The id of `base:allocation`, if the client selected it for this export.
    pub block_status_context: Option<u32>,
}

impl Session {
    pub(crate) fn transmission_flags(&self) -> u16 {
        transmission_flags(self.read_only, self.rotational)
    }

    pub(crate) fn payload_limit(&self) -> u32 {
        self.block_sizes.maximum
    }
}

/// A write payload as read from the wire.
#[derive(Debug)]
pub(crate) enum Payload {
    None,
    /// With the sums of its whole blocks where the backend takes them
    /// (empty otherwise; see [`Summing`]).
    Data(Bytes, Vec<u64>),
    /// Larger than the payload limit: read and dropped.
    Discarded,
}

#[derive(Debug)]
pub(crate) struct Incoming {
    pub header: RequestHeader,
    pub payload: Payload,
}

/// Parses a request header; past a wrong magic number the stream cannot be
/// followed any more.
pub(crate) fn parse_header(
    bytes: &[u8; REQUEST_HEADER_BYTES],
) -> Result<RequestHeader, ConnectionError> {
    parse_request(bytes).map_err(ConnectionError::RequestMagic)
}

/// What follows a request header on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PayloadPlan {
    /// Nothing: every command but `NBD_CMD_WRITE`.
    None,
    /// A write payload within the limit: read it into memory.
    Read(usize),
    /// A write payload over the limit: read it and drop it.
    Discard(u64),
}

/// The sums of a write payload's whole blocks, taken as its bytes arrive
/// ([`Backend::block_sum`]): after each read from the socket, of the
/// blocks that read completed.
pub(crate) struct Summing {
    sum: Option<BlockSum>,
    first: u64,
    sums: Vec<u64>,
}

impl Summing {
    /// For a write of `header`'s, if the backend takes sums and the write
    /// starts on a block boundary.
    pub(crate) fn new(session: &Session, header: &RequestHeader) -> Summing {
        let block = SUMMED_BLOCK_BYTES as u64;
        let sum = session
            .backend
            .block_sum()
            .filter(|_| header.offset.is_multiple_of(block));
        let whole = header.length as usize / SUMMED_BLOCK_BYTES;
        Summing {
            sum,
            first: header.offset / block,
            sums: Vec::with_capacity(if sum.is_some() { whole } else { 0 }),
        }
    }

    /// Sums the blocks of `data` (the payload as far as it has arrived)
    /// that are whole now and not yet summed.
    pub(crate) fn take(&mut self, data: &[u8]) {
        let Some(sum) = self.sum else { return };
        while let Some(block) = data
            .get(self.sums.len() * SUMMED_BLOCK_BYTES..)
            .and_then(|rest| rest.get(..SUMMED_BLOCK_BYTES))
        {
            self.sums
                .push(sum(block, self.first + self.sums.len() as u64));
        }
    }

    /// The payload `data` (all of it) with its sums.
    pub(crate) fn finish(mut self, data: Bytes) -> Payload {
        self.take(&data);
        Payload::Data(data, self.sums)
    }
}

/// The payload after `header`: read if within `limit`, read and dropped (to
/// answer `NBD_EINVAL` with the stream still in step) if within
/// [`WRITE_DISCARD_MAX_BYTES`], and the end of the connection beyond that.
pub(crate) fn payload_plan(
    header: &RequestHeader,
    limit: u32,
) -> Result<PayloadPlan, ConnectionError> {
    if header.kind != NBD_CMD_WRITE {
        return Ok(PayloadPlan::None);
    }
    match header.length {
        length if length <= limit => Ok(PayloadPlan::Read(length as usize)),
        length if length <= WRITE_DISCARD_MAX_BYTES => Ok(PayloadPlan::Discard(u64::from(length))),
        length => Err(ConnectionError::PayloadTooLarge(length)),
    }
}

/// What to do with a request that was read whole.
#[derive(Debug)]
pub(crate) enum Admission {
    /// `NBD_CMD_DISC`: read nothing more, finish what is in flight, close.
    Disconnect,
    /// Refused at the edge: send this reply; the backend is not involved.
    Answer(EncodedReply),
    /// Valid: run it on the backend ([`run`]).
    Run(Job),
}

/// A request that passed validation, on its way to the backend.
#[derive(Debug)]
pub(crate) struct Job {
    pub header: RequestHeader,
    command: Command,
}

/// Decides what becomes of a request while the connection is open.
pub(crate) fn admit(session: &Session, incoming: Incoming) -> Admission {
    let Incoming { header, payload } = incoming;
    if header.kind == NBD_CMD_DISC {
        return Admission::Disconnect;
    }
    match validate(session, &header, payload) {
        Ok(command) => Admission::Run(Job { header, command }),
        Err(rejection) => {
            let reply = Reply::error(rejection.errno, rejection.message);
            Admission::Answer(encode_reply(header.cookie, session.structured, reply))
        }
    }
}

/// While a connection drains for shutdown: `NBD_ESHUTDOWN` for every
/// request but `NBD_CMD_DISC`, which gets nothing (`None`) and ends it.
pub(crate) fn refuse_for_shutdown(
    session: &Session,
    header: &RequestHeader,
) -> Option<EncodedReply> {
    (header.kind != NBD_CMD_DISC).then(|| {
        let reply = Reply::error(Errno::Shutdown, "the server is shutting down");
        encode_reply(header.cookie, session.structured, reply)
    })
}

/// Runs a valid request on the backend and encodes the reply. A panicking
/// backend is answered `NBD_EIO`: the client must not wait forever for
/// this cookie.
pub(crate) async fn run(session: &Session, job: Job) -> EncodedReply {
    let reply = AssertUnwindSafe(execute(session, job.command))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Reply::error(Errno::Io, "the backend failed"));
    encode_reply(job.header.cookie, session.structured, reply)
}

/// Memory alignment of write payloads: the O_DIRECT granularity of 4 KiB
/// devices.
const PAYLOAD_ALIGNMENT: usize = 4096;

/// A write payload this large or larger, beyond what the connection's
/// reader holds already, is read from the socket straight into its own
/// buffer, and the header after it alone, in both transmission modes: a
/// copy through the reader's buffer was a sixth of the daemon's CPU in a
/// stream of 64 KiB writes. In async mode, a batch of replies carrying
/// this much read data or more likewise goes to the socket past the write
/// buffer.
pub(crate) const DIRECT_PAYLOAD_MIN: usize = 16 << 10;

/// An empty buffer with room for `length` bytes, starting on a
/// [`PAYLOAD_ALIGNMENT`] boundary.
pub(crate) fn aligned_capacity(length: usize) -> BytesMut {
    let mut buffer = BytesMut::with_capacity(length + PAYLOAD_ALIGNMENT);
    let misalignment = buffer.as_ptr() as usize % PAYLOAD_ALIGNMENT;
    let padding = (PAYLOAD_ALIGNMENT - misalignment) % PAYLOAD_ALIGNMENT;
    buffer.extend_from_slice(&[0u8; PAYLOAD_ALIGNMENT][..padding]);
    let _ = buffer.split_to(padding);
    buffer
}

/// A request that passed validation: within the export, flags understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        data: Bytes,
        /// Of its whole blocks, where the backend takes them (else empty).
        sums: Vec<u64>,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        may_trim: bool,
        fast: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
        context: u32,
    },
}

/// Why a request was refused before reaching the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rejection {
    errno: Errno,
    message: &'static str,
}

fn reject(errno: Errno, message: &'static str) -> Rejection {
    Rejection { errno, message }
}

/// Command flags valid with each command; `None` for unknown commands.
/// `NBD_CMD_FLAG_FUA` is valid on every command once `NBD_FLAG_SEND_FUA` is
/// advertised (the spec: "the server MUST accept all commands with this bit
/// set (even by ignoring the bit)"); `NBD_CMD_FLAG_DF` is not, as
/// `NBD_FLAG_SEND_DF` is never advertised.
fn allowed_flags(kind: u16) -> Option<u16> {
    match kind {
        NBD_CMD_READ | NBD_CMD_WRITE | NBD_CMD_FLUSH | NBD_CMD_TRIM | NBD_CMD_CACHE => {
            Some(NBD_CMD_FLAG_FUA)
        }
        NBD_CMD_WRITE_ZEROES => {
            Some(NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO)
        }
        NBD_CMD_BLOCK_STATUS => Some(NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_REQ_ONE),
        _ => None,
    }
}

/// Checks a request at the edge and turns it into a [`Command`].
fn validate(
    session: &Session,
    header: &RequestHeader,
    payload: Payload,
) -> Result<Command, Rejection> {
    check_request(session, header, &payload)?;
    let (offset, length) = (header.offset, header.length);
    let fua = header.flags & NBD_CMD_FLAG_FUA != 0;
    match header.kind {
        NBD_CMD_READ => validate_read(session, offset, length),
        NBD_CMD_WRITE => {
            let (data, sums) = match payload {
                Payload::Data(data, sums) => (data, sums),
                _ => (Bytes::new(), Vec::new()),
            };
            Ok(Command::Write {
                offset,
                data,
                sums,
                fua,
            })
        }
        NBD_CMD_FLUSH => Ok(Command::Flush),
        NBD_CMD_TRIM => Ok(Command::Trim {
            offset,
            length,
            fua,
        }),
        NBD_CMD_CACHE => Ok(Command::Cache { offset, length }),
        NBD_CMD_WRITE_ZEROES => Ok(Command::WriteZeroes {
            offset,
            length,
            fua,
            may_trim: header.flags & NBD_CMD_FLAG_NO_HOLE == 0,
            fast: header.flags & NBD_CMD_FLAG_FAST_ZERO != 0,
        }),
        _ => validate_block_status(session, header),
    }
}

/// The checks every command shares, each with the error proto.md's "Error
/// values" section gives it: unknown command or flag → `NBD_EINVAL`; writing
/// to a read-only export → `NBD_EPERM`; a write payload over the limit →
/// `NBD_EINVAL`; a range past the end → `NBD_ENOSPC` for writes and
/// `NBD_EINVAL` for everything else.
fn check_request(
    session: &Session,
    header: &RequestHeader,
    payload: &Payload,
) -> Result<(), Rejection> {
    let allowed = allowed_flags(header.kind).ok_or(reject(Errno::Invalid, "unknown command"))?;
    if header.flags & !allowed != 0 {
        return Err(reject(
            Errno::Invalid,
            "command flag not valid for this command",
        ));
    }
    let writes = matches!(
        header.kind,
        NBD_CMD_WRITE | NBD_CMD_TRIM | NBD_CMD_WRITE_ZEROES
    );
    if writes && session.read_only {
        // NBD_EPERM is the spec's value for writing to a read-only export.
        return Err(reject(Errno::Perm, "the export is read-only"));
    }
    if matches!(payload, Payload::Discarded) {
        return Err(reject(
            Errno::Invalid,
            "write payload larger than the maximum payload size",
        ));
    }
    // NBD_CMD_FLUSH's offset and length are reserved, not a range.
    let beyond_end = header
        .offset
        .checked_add(u64::from(header.length))
        .is_none_or(|end| end > session.size);
    if beyond_end && header.kind != NBD_CMD_FLUSH {
        let errno = match header.kind {
            NBD_CMD_WRITE | NBD_CMD_WRITE_ZEROES => Errno::NoSpace,
            _ => Errno::Invalid,
        };
        return Err(reject(
            errno,
            "request extends beyond the end of the export",
        ));
    }
    Ok(())
}

fn validate_read(session: &Session, offset: u64, length: u32) -> Result<Command, Rejection> {
    if length > session.payload_limit() {
        // With structured replies the spec names NBD_EOVERFLOW for reads
        // the server will not serve in one go; simple replies have no such
        // provision and get NBD_EINVAL.
        let errno = if session.structured {
            Errno::Overflow
        } else {
            Errno::Invalid
        };
        return Err(reject(errno, "read larger than the maximum payload size"));
    }
    Ok(Command::Read { offset, length })
}

fn validate_block_status(session: &Session, header: &RequestHeader) -> Result<Command, Rejection> {
    let Some(context) = session.block_status_context else {
        return Err(reject(Errno::Invalid, "no metadata context was negotiated"));
    };
    if header.length == 0 {
        return Err(reject(Errno::Invalid, "block status of an empty range"));
    }
    Ok(Command::BlockStatus {
        offset: header.offset,
        length: header.length,
        req_one: header.flags & NBD_CMD_FLAG_REQ_ONE != 0,
        context,
    })
}

/// Runs a command against the backend. Zero-length operations succeed
/// without reaching it (the spec leaves them unspecified, short of
/// disconnecting).
async fn execute(session: &Session, command: Command) -> Reply {
    let backend = &session.backend;
    let done = |result: Result<(), Errno>| match result {
        Ok(()) => Reply::Done,
        Err(errno) => backend_error(errno),
    };
    match command {
        Command::Read { offset, length } => read(backend.as_ref(), offset, length).await,
        Command::Write { data, .. } if data.is_empty() => Reply::Done,
        Command::Write {
            offset,
            data,
            sums,
            fua,
        } => done(backend.write_summed(offset, data, sums, fua).await),
        Command::Flush => done(backend.flush().await),
        Command::Trim { length: 0, .. }
        | Command::Cache { length: 0, .. }
        | Command::WriteZeroes { length: 0, .. } => Reply::Done,
        Command::Trim {
            offset,
            length,
            fua,
        } => done(backend.trim(offset, u64::from(length), fua).await),
        Command::Cache { offset, length } => done(backend.cache(offset, u64::from(length)).await),
        Command::WriteZeroes {
            offset,
            length,
            fua,
            may_trim,
            fast,
        } => done(
            backend
                .write_zeroes(offset, u64::from(length), fua, may_trim, fast)
                .await,
        ),
        Command::BlockStatus {
            offset,
            length,
            req_one,
            context,
        } => match backend.block_status(offset, u64::from(length)).await {
            Ok(extents) => {
                let extents = clamp_extents(extents, length, session.size - offset, req_one);
                Reply::Extents { context, extents }
            }
            Err(errno) => backend_error(errno),
        },
    }
}

async fn read(backend: &dyn Backend, offset: u64, length: u32) -> Reply {
    if length == 0 {
        return Reply::Data {
            offset,
            data: Bytes::new(),
        };
    }
    match backend.read(offset, length).await {
        Ok(data) if data.len() == length as usize => Reply::Data { offset, data },
        // Sending it would put the stream out of step with the client.
        Ok(_) => Reply::error(Errno::Io, "the backend returned the wrong amount of data"),
        Err(errno) => backend_error(errno),
    }
}

fn backend_error(errno: Errno) -> Reply {
    let message = match errno {
        Errno::Perm => "operation not permitted",
        Errno::Io => "input/output error",
        Errno::NoMemory => "out of memory",
        Errno::Invalid => "invalid request",
        Errno::NoSpace => "no space left",
        Errno::Overflow => "request too large",
        Errno::NotSupported => "operation not supported",
        Errno::Shutdown => "the export is shutting down",
    };
    Reply::error(errno, message)
}

/// Makes the backend's extents a valid `NBD_REPLY_TYPE_BLOCK_STATUS`
/// descriptor list for a request of `requested` bytes with `remaining`
/// bytes of export from its offset (`requested` ≥ 1, `remaining` ≥
/// `requested`): no zero lengths, nothing past the end of the export,
/// neighbours with equal flags merged, no descriptor after the one that
/// reaches the requested length, at most [`BLOCK_STATUS_MAX_EXTENTS`],
/// exactly one no longer than the request with `NBD_CMD_FLAG_REQ_ONE`,
/// only the defined flag bits, and never empty (status 0 is always safe).
fn clamp_extents(
    extents: Vec<Extent>,
    requested: u32,
    remaining: u64,
    req_one: bool,
) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    let mut covered = 0u64;
    for extent in extents {
        let length = u64::from(extent.length).min(remaining - covered) as u32;
        if length == 0 {
            continue;
        }
        let flags = extent.flags & (NBD_STATE_HOLE | NBD_STATE_ZERO);
        match out.last_mut() {
            Some(last) if last.flags == flags && last.length.checked_add(length).is_some() => {
                last.length += length
            }
            _ => out.push(Extent { length, flags }),
        }
        covered += u64::from(length);
        if req_one || covered >= u64::from(requested) || out.len() == BLOCK_STATUS_MAX_EXTENTS {
            break;
        }
    }
    if out.is_empty() {
        out.push(Extent {
            length: requested,
            flags: 0,
        });
    }
    if req_one {
        out.truncate(1);
        out[0].length = out[0].length.min(requested);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a backend's sum: the block's first byte and index.
    fn mark(block: &[u8], index: u64) -> u64 {
        index << 8 | u64::from(block[0])
    }

    #[test]
    fn whole_blocks_are_summed_as_they_arrive_and_a_partial_one_is_not() {
        let block = SUMMED_BLOCK_BYTES;
        let data: Vec<u8> = (0..3 * block + 100)
            .map(|i| (i / block) as u8 + 1)
            .collect();
        let mut summing = Summing {
            sum: Some(mark),
            first: 7,
            sums: Vec::new(),
        };
        // Arrivals that end inside blocks, and one that ends on a boundary.
        for end in [100, block + 1, 2 * block, 2 * block + 5] {
            summing.take(&data[..end]);
        }
        assert_eq!(summing.sums, [7 << 8 | 1, 8 << 8 | 2]);
        let Payload::Data(whole, sums) = summing.finish(Bytes::from(data.clone())) else {
            panic!("a payload");
        };
        assert_eq!(&whole[..], &data[..]);
        assert_eq!(sums, [7 << 8 | 1, 8 << 8 | 2, 9 << 8 | 3]);
        // No sum from the backend: none taken.
        let mut none = Summing {
            sum: None,
            first: 0,
            sums: Vec::new(),
        };
        none.take(&data);
        assert!(
            matches!(none.finish(Bytes::from(data)), Payload::Data(_, sums) if sums.is_empty())
        );
    }

    fn extent(length: u32, flags: u32) -> Extent {
        Extent { length, flags }
    }

    #[test]
    fn extents_stop_at_the_request_and_the_export_end() {
        let from_backend = vec![extent(4096, 0), extent(4096, 3), extent(4096, 0)];
        // The descriptor that reaches the requested length is the last one.
        assert_eq!(
            clamp_extents(from_backend.clone(), 5000, 1 << 20, false),
            vec![extent(4096, 0), extent(4096, 3)]
        );
        // Nothing beyond the end of the export.
        assert_eq!(
            clamp_extents(from_backend.clone(), 6000, 6000, false),
            vec![extent(4096, 0), extent(1904, 3)]
        );
        // REQ_ONE: one descriptor, no longer than the request.
        assert_eq!(
            clamp_extents(from_backend, 1000, 1 << 20, true),
            vec![extent(1000, 0)]
        );
    }

    #[test]
    fn extents_are_cleaned_up() {
        let from_backend = vec![
            extent(0, 1),
            extent(512, 0x80 | 2),
            extent(512, 2),
            extent(0, 0),
        ];
        assert_eq!(
            clamp_extents(from_backend, 4096, 1 << 20, false),
            vec![extent(1024, 2)]
        );
        assert_eq!(
            clamp_extents(Vec::new(), 4096, 1 << 20, false),
            vec![extent(4096, 0)]
        );
        assert_eq!(
            clamp_extents(vec![extent(0, 1)], 10, 10, true),
            vec![extent(10, 0)]
        );
    }

    struct NoBackend;

    impl Backend for NoBackend {
        fn size_bytes(&self) -> u64 {
            1 << 20
        }
        fn read_only(&self) -> bool {
            false
        }
        fn block_sizes(&self) -> BlockSizes {
            BlockSizes {
                minimum: 1,
                preferred: 4096,
                maximum: 1 << 16,
            }
        }
        fn description(&self) -> String {
            String::new()
        }
        fn read(
            &self,
            _: u64,
            _: u32,
        ) -> futures::future::BoxFuture<'static, Result<Bytes, Errno>> {
            unimplemented!()
        }
        fn write(
            &self,
            _: u64,
            _: Bytes,
            _: bool,
        ) -> futures::future::BoxFuture<'static, Result<(), Errno>> {
            unimplemented!()
        }
        fn write_zeroes(
            &self,
            _: u64,
            _: u64,
            _: bool,
            _: bool,
            _: bool,
        ) -> futures::future::BoxFuture<'static, Result<(), Errno>> {
            unimplemented!()
        }
        fn trim(
            &self,
            _: u64,
            _: u64,
            _: bool,
        ) -> futures::future::BoxFuture<'static, Result<(), Errno>> {
            unimplemented!()
        }
        fn flush(&self) -> futures::future::BoxFuture<'static, Result<(), Errno>> {
            unimplemented!()
        }
        fn cache(&self, _: u64, _: u64) -> futures::future::BoxFuture<'static, Result<(), Errno>> {
            unimplemented!()
        }
        fn block_status(
            &self,
            _: u64,
            _: u64,
        ) -> futures::future::BoxFuture<'static, Result<Vec<Extent>, Errno>> {
            unimplemented!()
        }
    }

    fn session(read_only: bool, structured: bool, context: Option<u32>) -> Session {
        Session {
            backend: Arc::new(NoBackend),
            size: 1 << 20,
            read_only,
            rotational: false,
            block_sizes: NoBackend.block_sizes(),
            structured,
            block_status_context: context,
        }
    }

    fn header(kind: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            kind,
            cookie: 1,
            offset,
            length,
        }
    }

    fn errno(result: Result<Command, Rejection>) -> Option<Errno> {
        result.err().map(|rejection| rejection.errno)
    }

    /// The error `validate` gives a request without payload, if any.
    fn check(s: &Session, kind: u16, flags: u16, offset: u64, length: u32) -> Option<Errno> {
        errno(validate(
            s,
            &header(kind, flags, offset, length),
            Payload::None,
        ))
    }

    const END: u64 = 1 << 20;

    #[test]
    fn unknown_commands_and_flags_are_einval() {
        let s = session(false, false, None);
        let cases = [
            (99, 0),
            (NBD_CMD_READ, NBD_CMD_FLAG_DF),
            (NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_REQ_ONE),
            (NBD_CMD_CACHE, NBD_CMD_FLAG_NO_HOLE),
            // No metadata context negotiated.
            (NBD_CMD_BLOCK_STATUS, 0),
        ];
        for (kind, flags) in cases {
            assert_eq!(
                check(&s, kind, flags, 0, 512),
                Some(Errno::Invalid),
                "{kind} {flags}"
            );
        }
        // FUA is accepted on every command.
        for kind in [NBD_CMD_READ, NBD_CMD_FLUSH, NBD_CMD_TRIM, NBD_CMD_CACHE] {
            assert_eq!(check(&s, kind, NBD_CMD_FLAG_FUA, 0, 512), None, "{kind}");
        }
    }

    #[test]
    fn ranges_past_the_end_are_enospc_for_writes_and_einval_otherwise() {
        let s = session(false, false, None);
        assert_eq!(check(&s, NBD_CMD_READ, 0, END - 1, 2), Some(Errno::Invalid));
        assert_eq!(
            check(&s, NBD_CMD_READ, 0, u64::MAX, 2),
            Some(Errno::Invalid)
        );
        assert_eq!(check(&s, NBD_CMD_TRIM, 0, END, 1), Some(Errno::Invalid));
        assert_eq!(check(&s, NBD_CMD_CACHE, 0, END, 1), Some(Errno::Invalid));
        assert_eq!(
            check(&s, NBD_CMD_WRITE_ZEROES, 0, END, 1),
            Some(Errno::NoSpace)
        );
        let data = Payload::Data(Bytes::from_static(b"xy"), Vec::new());
        assert_eq!(
            errno(validate(&s, &header(NBD_CMD_WRITE, 0, END - 1, 2), data)),
            Some(Errno::NoSpace)
        );
        assert_eq!(check(&s, NBD_CMD_READ, 0, END - 1, 1), None);
        assert_eq!(check(&s, NBD_CMD_READ, 0, END, 0), None);
        // Flush's offset and length are reserved, not a range.
        assert_eq!(check(&s, NBD_CMD_FLUSH, 0, 7, 7), None);
    }

    #[test]
    fn payloads_over_the_limit_are_refused() {
        let s = session(false, false, None);
        let oversized = header(NBD_CMD_WRITE, 0, 0, 1 << 17);
        assert_eq!(
            errno(validate(&s, &oversized, Payload::Discarded)),
            Some(Errno::Invalid)
        );
        assert_eq!(check(&s, NBD_CMD_READ, 0, 0, 1 << 17), Some(Errno::Invalid));
        let structured = session(false, true, None);
        assert_eq!(
            check(&structured, NBD_CMD_READ, 0, 0, 1 << 17),
            Some(Errno::Overflow)
        );
        assert_eq!(check(&s, NBD_CMD_READ, 0, 0, 1 << 16), None);
    }

    #[test]
    fn read_only_exports_refuse_writes_with_eperm() {
        let s = session(true, false, None);
        for kind in [NBD_CMD_WRITE, NBD_CMD_TRIM, NBD_CMD_WRITE_ZEROES] {
            assert_eq!(
                errno(validate(&s, &header(kind, 0, 0, 0), Payload::None)),
                Some(Errno::Perm)
            );
        }
        assert_eq!(
            errno(validate(
                &s,
                &header(NBD_CMD_CACHE, 0, 0, 512),
                Payload::None
            )),
            None
        );
    }

    #[test]
    fn write_zeroes_flags_become_arguments() {
        let s = session(false, true, Some(4));
        let command = validate(
            &s,
            &header(
                NBD_CMD_WRITE_ZEROES,
                NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO,
                0,
                512,
            ),
            Payload::None,
        );
        assert_eq!(
            command,
            Ok(Command::WriteZeroes {
                offset: 0,
                length: 512,
                fua: false,
                may_trim: false,
                fast: true
            })
        );
        let command = validate(
            &s,
            &header(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_REQ_ONE, 512, 512),
            Payload::None,
        );
        assert_eq!(
            command,
            Ok(Command::BlockStatus {
                offset: 512,
                length: 512,
                req_one: true,
                context: 4
            })
        );
        let command = validate(
            &s,
            &header(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_NO_HOLE, 512, 512),
            Payload::None,
        );
        assert_eq!(errno(command), Some(Errno::Invalid));
    }
}

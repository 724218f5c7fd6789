//! The handshake: fixed newstyle negotiation (proto.md "Fixed newstyle
//! negotiation", "Option types", "Option reply types").
//!
//! ```text
//!   server                                        client
//!     │── NBDMAGIC IHAVEOPT flags ───────────────────▶│  flags = FIXED_NEWSTYLE | NO_ZEROES
//!     │◀─────────────────────────────── client flags ─│  unknown bits: drop the connection
//!     │                                               │
//!     │◀──────────── IHAVEOPT option length data ─────│  ┐ option haggling, one option
//!     │── reply* (INFO, SERVER, META_CONTEXT...) ────▶│  │ at a time; every option but
//!     │── final reply (ACK or ERR_*) ────────────────▶│  ┘ EXPORT_NAME ends in ACK or ERR_*
//!     │                  ...                          │
//!     │◀──────────── GO ──────────────────────────────│  GO + ACK, or EXPORT_NAME + size/flags:
//!     │── INFO(EXPORT) INFO(BLOCK_SIZE) ... ACK ─────▶│  transmission begins
//! ```
//!
//! Negotiated state (structured replies, the selected metadata context)
//! lives in [`Haggle`] until `NBD_OPT_GO` or `NBD_OPT_EXPORT_NAME` turns it
//! into the [`Session`] the transmission phase runs with. No TLS: the
//! server operates in the protocol's NOTLS mode and refuses
//! `NBD_OPT_STARTTLS` with `NBD_REP_ERR_POLICY`.
//!
//! Every option's data is read into memory only up to [`OPTION_DATA_MAX`];
//! anything larger is discarded and answered `NBD_REP_ERR_TOO_BIG`, and
//! anything absurd ([`OPTION_DISCARD_MAX`]) ends the connection.

use std::sync::Arc;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::error::ConnectionError;
use crate::protocol::*;
use crate::requests::Session;
use crate::server::{shutdown_requested, ServerOptions};
use crate::{Backend, BlockSizes, Catalog};

/// Largest option data the server reads and parses. The longest legitimate
/// option is `NBD_OPT_SET_META_CONTEXT`: an export name of at most 4096
/// bytes plus queries of at most 4096 bytes each; 64 KiB holds a name and
/// fourteen maximal queries, far more than the one context offered here.
const OPTION_DATA_MAX: u32 = 64 << 10;

/// Largest option data the server reads and drops (answering
/// `NBD_REP_ERR_TOO_BIG`) so that a confused client learns why; beyond
/// this, a client is not negotiating in good faith and the server hangs up
/// rather than consume an unbounded stream (the spec allows a hard
/// disconnect for denial of service).
const OPTION_DISCARD_MAX: u32 = 1 << 20;

/// Client flags this server understands (and offered).
const KNOWN_CLIENT_FLAGS: u32 = NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES;

/// Runs the handshake on a fresh connection. `Ok(Some(session))`: enter
/// transmission; `Ok(None)`: the client aborted or left between options, or
/// shutdown began; the connection should be closed.
pub(crate) async fn negotiate<R, W>(
    reader: &mut R,
    writer: &mut W,
    catalog: &dyn Catalog,
    options: &ServerOptions,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Session>, ConnectionError>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    writer.write_all(&greeting()).await?;
    writer.flush().await?;
    // A peer that connects and stays silent must not hold up shutdown.
    let client_flags = tokio::select! {
        flags = reader.read_u32() => flags?,
        _ = shutdown_requested(shutdown) => return Ok(None),
    };
    if client_flags & !KNOWN_CLIENT_FLAGS != 0 {
        return Err(ConnectionError::ClientFlags(client_flags));
    }
    let mut haggle = Haggle {
        catalog,
        options,
        no_zeroes: client_flags & NBD_FLAG_C_NO_ZEROES != 0,
        structured: false,
        meta: None,
        next_context_id: 1,
    };
    loop {
        // Between options, and only there, shutdown may interrupt: a
        // half-read option would leave nothing sensible to answer.
        tokio::select! {
            biased;
            ready = reader.fill_buf() => if ready?.is_empty() { return Ok(None) },
            _ = shutdown_requested(shutdown) => return Ok(None),
        }
        let request = read_option(reader).await?;
        if *shutdown.borrow() {
            refuse_for_shutdown(request.option, writer).await?;
            return Ok(None);
        }
        let step = haggle.handle(request, writer).await?;
        writer.flush().await?;
        match step {
            Step::Continue => {}
            Step::Close => return Ok(None),
            Step::Transmit(session) => return Ok(Some(session)),
        }
    }
}

/// One option as read from the wire.
struct OptionRequest {
    option: u32,
    length: u32,
    /// `None`: the data exceeded [`OPTION_DATA_MAX`] and was discarded.
    data: Option<Vec<u8>>,
}

async fn read_option<R: AsyncBufRead + Unpin>(
    reader: &mut R,
) -> Result<OptionRequest, ConnectionError> {
    let magic = reader.read_u64().await?;
    if magic != IHAVEOPT {
        return Err(ConnectionError::OptionMagic(magic));
    }
    let option = reader.read_u32().await?;
    let length = reader.read_u32().await?;
    if length > OPTION_DATA_MAX {
        if length > OPTION_DISCARD_MAX {
            return Err(ConnectionError::OptionTooLarge(length));
        }
        let dropped = tokio::io::copy_buf(
            &mut (&mut *reader).take(u64::from(length)),
            &mut tokio::io::sink(),
        )
        .await?;
        if dropped < u64::from(length) {
            return Err(ConnectionError::Truncated);
        }
        return Ok(OptionRequest {
            option,
            length,
            data: None,
        });
    }
    let mut data = vec![0; length as usize];
    reader.read_exact(&mut data).await?;
    Ok(OptionRequest {
        option,
        length,
        data: Some(data),
    })
}

/// Answers an option received after shutdown began: `NBD_OPT_ABORT` gets
/// its `NBD_REP_ACK`, everything else `NBD_REP_ERR_SHUTDOWN` (which tells
/// the client to disconnect); `NBD_OPT_EXPORT_NAME` cannot be answered
/// with an error, so it gets nothing.
async fn refuse_for_shutdown<W: AsyncWrite + Unpin>(
    option: u32,
    writer: &mut W,
) -> Result<(), ConnectionError> {
    match option {
        NBD_OPT_EXPORT_NAME => return Ok(()),
        NBD_OPT_ABORT => send(writer, option, NBD_REP_ACK, &[]).await?,
        _ => {
            send(
                writer,
                option,
                NBD_REP_ERR_SHUTDOWN,
                b"the server is shutting down",
            )
            .await?
        }
    }
    writer.flush().await?;
    Ok(())
}

async fn send<W: AsyncWrite + Unpin>(
    writer: &mut W,
    option: u32,
    reply_type: u32,
    data: &[u8],
) -> std::io::Result<()> {
    writer
        .write_all(&option_reply(option, reply_type, data))
        .await
}

/// What happens after an option has been answered.
enum Step {
    Continue,
    Close,
    Transmit(Session),
}

/// The metadata context selected by the last `NBD_OPT_SET_META_CONTEXT`,
/// valid only if transmission starts on the same export.
struct MetaSelection {
    export: String,
    context: u32,
}

/// Option haggling state.
struct Haggle<'a> {
    catalog: &'a dyn Catalog,
    options: &'a ServerOptions,
    no_zeroes: bool,
    structured: bool,
    meta: Option<MetaSelection>,
    next_context_id: u32,
}

impl Haggle<'_> {
    async fn handle<W: AsyncWrite + Unpin>(
        &mut self,
        request: OptionRequest,
        w: &mut W,
    ) -> Result<Step, ConnectionError> {
        let option = request.option;
        let Some(data) = request.data else {
            if option == NBD_OPT_EXPORT_NAME {
                // No error reply exists for this option: hard disconnect.
                return Err(ConnectionError::OptionTooLarge(request.length));
            }
            send(w, option, NBD_REP_ERR_TOO_BIG, b"option data too large").await?;
            return Ok(Step::Continue);
        };
        match option {
            NBD_OPT_EXPORT_NAME => self.export_name(&data, w).await,
            NBD_OPT_ABORT => {
                // The client may already be gone; the ACK is a courtesy.
                let _ = send(w, option, NBD_REP_ACK, &[]).await;
                let _ = w.flush().await;
                Ok(Step::Close)
            }
            NBD_OPT_LIST => self.list(&data, w).await,
            NBD_OPT_STARTTLS => {
                send(
                    w,
                    option,
                    NBD_REP_ERR_POLICY,
                    b"TLS is not offered by this server",
                )
                .await?;
                Ok(Step::Continue)
            }
            NBD_OPT_INFO | NBD_OPT_GO => self.info_or_go(option, &data, w).await,
            NBD_OPT_STRUCTURED_REPLY => self.structured_reply(&data, w).await,
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => {
                self.meta_context(option, &data, w).await
            }
            // NBD_OPT_EXTENDED_HEADERS, NBD_OPT_PEEK_EXPORT and anything
            // newer: unsupported, and negotiation goes on.
            _ => {
                send(w, option, NBD_REP_ERR_UNSUP, b"option not supported").await?;
                Ok(Step::Continue)
            }
        }
    }

    /// The session transmission would run with on export `name`.
    fn session(&self, name: &str, backend: Arc<dyn Backend>) -> Session {
        let context = self
            .meta
            .as_ref()
            .filter(|meta| meta.export == name)
            .map(|meta| meta.context);
        Session {
            size: backend.size_bytes(),
            read_only: backend.read_only(),
            rotational: backend.rotational(),
            block_sizes: advertised_block_sizes(
                backend.block_sizes(),
                self.options.max_payload_bytes,
            ),
            structured: self.structured,
            block_status_context: context,
            backend,
        }
    }

    async fn export_name<W: AsyncWrite + Unpin>(
        &mut self,
        data: &[u8],
        w: &mut W,
    ) -> Result<Step, ConnectionError> {
        let name =
            parse_export_name(data).unwrap_or_else(|_| String::from_utf8_lossy(data).into_owned());
        let Some(backend) = self.catalog.open(&name) else {
            return Err(ConnectionError::UnknownExport(name));
        };
        let session = self.session(&name, backend);
        w.write_all(&export_name_reply(
            session.size,
            session.transmission_flags(),
            self.no_zeroes,
        ))
        .await?;
        Ok(Step::Transmit(session))
    }

    async fn list<W: AsyncWrite + Unpin>(
        &mut self,
        data: &[u8],
        w: &mut W,
    ) -> Result<Step, ConnectionError> {
        if !data.is_empty() {
            return invalid(w, NBD_OPT_LIST, Malformed::UnexpectedData).await;
        }
        for (name, description) in self.catalog.list() {
            send(
                w,
                NBD_OPT_LIST,
                NBD_REP_SERVER,
                &rep_server(&name, &description),
            )
            .await?;
        }
        send(w, NBD_OPT_LIST, NBD_REP_ACK, &[]).await?;
        Ok(Step::Continue)
    }

    async fn info_or_go<W: AsyncWrite + Unpin>(
        &mut self,
        option: u32,
        data: &[u8],
        w: &mut W,
    ) -> Result<Step, ConnectionError> {
        let query = match parse_export_query(data) {
            Ok(query) => query,
            Err(malformed) => return invalid(w, option, malformed).await,
        };
        let Some(backend) = self.catalog.open(&query.name) else {
            let message = format!("no export named {:?}", query.name);
            send(w, option, NBD_REP_ERR_UNKNOWN, message.as_bytes()).await?;
            return Ok(Step::Continue);
        };
        let session = self.session(&query.name, backend);
        send(
            w,
            option,
            NBD_REP_INFO,
            &info_export(session.size, session.transmission_flags()),
        )
        .await?;
        // Always sent, requested or not: clients that did not ask may
        // ignore it, and those that did learn the limits.
        let sizes = session.block_sizes;
        send(
            w,
            option,
            NBD_REP_INFO,
            &info_block_size(sizes.minimum, sizes.preferred, sizes.maximum),
        )
        .await?;
        if query.info_requests.contains(&NBD_INFO_NAME) {
            // The catalog has no notion of canonical names: the name the
            // client used is the name.
            send(
                w,
                option,
                NBD_REP_INFO,
                &info_string(NBD_INFO_NAME, &query.name),
            )
            .await?;
        }
        if query.info_requests.contains(&NBD_INFO_DESCRIPTION) {
            let description = session.backend.description();
            send(
                w,
                option,
                NBD_REP_INFO,
                &info_string(NBD_INFO_DESCRIPTION, &description),
            )
            .await?;
        }
        send(w, option, NBD_REP_ACK, &[]).await?;
        if option == NBD_OPT_GO {
            Ok(Step::Transmit(session))
        } else {
            Ok(Step::Continue)
        }
    }

    async fn structured_reply<W: AsyncWrite + Unpin>(
        &mut self,
        data: &[u8],
        w: &mut W,
    ) -> Result<Step, ConnectionError> {
        if !data.is_empty() {
            return invalid(w, NBD_OPT_STRUCTURED_REPLY, Malformed::UnexpectedData).await;
        }
        if self.structured {
            send(
                w,
                NBD_OPT_STRUCTURED_REPLY,
                NBD_REP_ERR_INVALID,
                b"structured replies are already on",
            )
            .await?;
            return Ok(Step::Continue);
        }
        self.structured = true;
        send(w, NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, &[]).await?;
        Ok(Step::Continue)
    }

    /// `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`. The only
    /// context is `base:allocation`; `base:` lists it, and queries in other
    /// namespaces are ignored, as the spec requires.
    async fn meta_context<W: AsyncWrite + Unpin>(
        &mut self,
        option: u32,
        data: &[u8],
        w: &mut W,
    ) -> Result<Step, ConnectionError> {
        let setting = option == NBD_OPT_SET_META_CONTEXT;
        if setting {
            // A SET replaces the selection even when it fails.
            self.meta = None;
            if !self.structured {
                send(
                    w,
                    option,
                    NBD_REP_ERR_INVALID,
                    b"negotiate structured replies first",
                )
                .await?;
                return Ok(Step::Continue);
            }
        }
        let query = match parse_meta_query(data) {
            Ok(query) => query,
            Err(malformed) => return invalid(w, option, malformed).await,
        };
        if self.catalog.open(&query.name).is_none() {
            let message = format!("no export named {:?}", query.name);
            send(w, option, NBD_REP_ERR_UNKNOWN, message.as_bytes()).await?;
            return Ok(Step::Continue);
        }
        if selects_base_allocation(&query.queries, !setting) {
            let context = if setting {
                let context = self.next_context_id;
                self.next_context_id = self.next_context_id.wrapping_add(1).max(1);
                self.meta = Some(MetaSelection {
                    export: query.name,
                    context,
                });
                context
            } else {
                // "The metadata context ID in these replies is reserved and
                // SHOULD be set to zero."
                0
            };
            send(
                w,
                option,
                NBD_REP_META_CONTEXT,
                &rep_meta_context(context, BASE_ALLOCATION),
            )
            .await?;
        }
        send(w, option, NBD_REP_ACK, &[]).await?;
        Ok(Step::Continue)
    }
}

async fn invalid<W: AsyncWrite + Unpin>(
    w: &mut W,
    option: u32,
    malformed: Malformed,
) -> Result<Step, ConnectionError> {
    send(
        w,
        option,
        NBD_REP_ERR_INVALID,
        malformed.to_string().as_bytes(),
    )
    .await?;
    Ok(Step::Continue)
}

/// Whether `queries` name `base:allocation`. Listing: no query means
/// everything, and `base:` is a wildcard for the namespace. Setting: no
/// query selects nothing, and `base:` is ignored.
fn selects_base_allocation(queries: &[String], listing: bool) -> bool {
    if queries.is_empty() {
        return listing;
    }
    queries
        .iter()
        .any(|query| query == BASE_ALLOCATION || (listing && query == BASE_NAMESPACE))
}

/// Transmission flags of an export. Everything the server implements is
/// advertised; read-only exports leave out the commands that would write
/// (they are still refused with `NBD_EPERM` if sent). `NBD_FLAG_ROTATIONAL`
/// is the backend's answer. `NBD_FLAG_SEND_DF` is never set: reads always
/// come back as one chunk, but the flag is not implemented.
pub(crate) fn transmission_flags(read_only: bool, rotational: bool) -> u16 {
    let spins = if rotational { NBD_FLAG_ROTATIONAL } else { 0 };
    let common = spins
        | NBD_FLAG_HAS_FLAGS
        | NBD_FLAG_SEND_FLUSH
        | NBD_FLAG_SEND_FUA
        | NBD_FLAG_SEND_CACHE
        | NBD_FLAG_CAN_MULTI_CONN;
    if read_only {
        common | NBD_FLAG_READ_ONLY
    } else {
        common | NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO
    }
}

/// The size constraints advertised for an export: the backend's, with the
/// maximum payload capped by the server's own limit, then the preferred and
/// minimum sizes lowered if needed so that minimum ≤ preferred ≤ maximum
/// still holds with powers of two (proto.md "Size constraints").
pub(crate) fn advertised_block_sizes(backend: BlockSizes, max_payload: u32) -> BlockSizes {
    let maximum = backend.maximum.min(max_payload).max(1);
    let largest_power_of_two = 1u32 << (31 - maximum.leading_zeros());
    let preferred = backend.preferred.min(largest_power_of_two).max(1);
    let minimum = backend.minimum.min(preferred).max(1);
    BlockSizes {
        minimum,
        preferred,
        maximum,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(minimum: u32, preferred: u32, maximum: u32) -> BlockSizes {
        BlockSizes {
            minimum,
            preferred,
            maximum,
        }
    }

    #[test]
    fn block_sizes_keep_the_backend_values_within_the_server_limit() {
        assert_eq!(
            advertised_block_sizes(sizes(512, 4096, 32 << 20), 32 << 20),
            sizes(512, 4096, 32 << 20)
        );
        assert_eq!(
            advertised_block_sizes(sizes(512, 4096, 32 << 20), 1 << 20),
            sizes(512, 4096, 1 << 20)
        );
        // A preferred size above the capped maximum comes down to the
        // largest power of two that fits.
        assert_eq!(
            advertised_block_sizes(sizes(512, 8 << 20, 32 << 20), (1 << 20) + 1),
            sizes(512, 1 << 20, (1 << 20) + 1)
        );
        assert_eq!(
            advertised_block_sizes(sizes(4096, 4096, 32 << 20), 1024),
            sizes(1024, 1024, 1024)
        );
    }

    #[test]
    fn base_allocation_matching() {
        let q = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(selects_base_allocation(&q(&[]), true));
        assert!(!selects_base_allocation(&q(&[]), false));
        assert!(selects_base_allocation(&q(&["base:"]), true));
        assert!(!selects_base_allocation(&q(&["base:"]), false));
        assert!(selects_base_allocation(
            &q(&["x-a:b", "base:allocation"]),
            false
        ));
        assert!(!selects_base_allocation(
            &q(&["qemu:dirty-bitmap:a", "base:other"]),
            true
        ));
    }

    #[test]
    fn read_only_exports_do_not_offer_writing_commands() {
        let flags = transmission_flags(true, false);
        assert_ne!(flags & NBD_FLAG_READ_ONLY, 0);
        assert_eq!(
            flags & (NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO),
            0
        );
        let flags = transmission_flags(false, false);
        assert_eq!(flags & NBD_FLAG_READ_ONLY, 0);
        assert_ne!(flags & NBD_FLAG_CAN_MULTI_CONN, 0);
        assert_eq!(flags & (NBD_FLAG_ROTATIONAL | NBD_FLAG_SEND_DF), 0);
        // Spinning media is the only difference a rotational backend makes.
        assert_eq!(transmission_flags(false, true), flags | NBD_FLAG_ROTATIONAL);
    }
}

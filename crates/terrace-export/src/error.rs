//! Why a connection ended other than by the client's choice.
//!
//! Errors a client can cause while the protocol stays in step (a bad
//! option, an out-of-range request, an unknown command) are answered on the
//! wire and never surface here. What does surface is the end of a
//! connection the server had to close: the byte stream could not be
//! followed any more (wrong magic, a peer gone in the middle of a message),
//! a limit was exceeded by so much that the server treats it as an attack,
//! the protocol mandates a hard disconnect (an unknown export requested with
//! `NBD_OPT_EXPORT_NAME`), or shutdown's grace period ran out.

use std::io;
use std::time::Duration;

/// The end of a connection that was not a clean close by the client.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// Reading from or writing to the transport failed.
    #[error("connection I/O failed: {0}")]
    Io(io::Error),
    /// The client closed the connection in the middle of a message.
    #[error("the client closed the connection in the middle of a message")]
    Truncated,
    /// The client set handshake flags the server did not offer; the
    /// protocol requires the server to drop the connection.
    #[error("the client sent unknown handshake flags {0:#x}")]
    ClientFlags(u32),
    /// An option did not start with `IHAVEOPT`.
    #[error("an option started with {0:#018x} instead of IHAVEOPT")]
    OptionMagic(u64),
    /// Option data longer than the server will read, even to discard it.
    #[error("the client sent {0} bytes of option data")]
    OptionTooLarge(u32),
    /// `NBD_OPT_EXPORT_NAME` named an export that does not exist; that
    /// option has no way to report an error, so the protocol requires a
    /// hard disconnect.
    #[error("NBD_OPT_EXPORT_NAME asked for unknown export {0:?}")]
    UnknownExport(String),
    /// A request did not start with `NBD_REQUEST_MAGIC`; the stream cannot
    /// be resynchronised.
    #[error("a request started with {0:#010x} instead of NBD_REQUEST_MAGIC")]
    RequestMagic(u32),
    /// A write payload larger than the server will read, even to discard it.
    #[error("the client announced a {0}-byte write payload")]
    PayloadTooLarge(u32),
    /// Shutdown began and the connection had not finished within the grace
    /// period; its in-flight requests were dropped.
    #[error("the connection was still busy {0:?} after shutdown began")]
    ShutdownTimeout(Duration),
}

impl From<io::Error> for ConnectionError {
    /// An end of stream inside a message is the client's doing, not an I/O
    /// failure; every read of a message part uses `read_exact`, whose early
    /// end of stream is `UnexpectedEof`.
    fn from(error: io::Error) -> ConnectionError {
        if error.kind() == io::ErrorKind::UnexpectedEof {
            ConnectionError::Truncated
        } else {
            ConnectionError::Io(error)
        }
    }
}

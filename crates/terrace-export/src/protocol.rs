//! The NBD wire format: constants, request parsing, reply encoding.
//!
//! Every constant below is named as in `doc/proto.md` and carries its value
//! from there; groups follow the document's "Values" section. The functions
//! are pure (bytes in, values out; values in, bytes out), so the state
//! machines in `handshake.rs` and `transmission.rs` never touch
//! byte offsets, and this module can be tested without sockets.
//!
//! All integers on the wire are big-endian.
//!
//! ```text
//! option request   C: IHAVEOPT(64) option(32) length(32) data[length]
//! option reply     S: NBD_OPTION_REPLY_MAGIC(64) option(32) type(32) length(32) data[length]
//! request          C: NBD_REQUEST_MAGIC(32) flags(16) type(16) cookie(64) offset(64) length(32) [data]
//! simple reply     S: NBD_SIMPLE_REPLY_MAGIC(32) error(32) cookie(64) [data]
//! structured chunk S: NBD_STRUCTURED_REPLY_MAGIC(32) flags(16) type(16) cookie(64) length(32) payload
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use crate::{Errno, Extent};

// ---------------------------------------------------------------------------
// Magic numbers.

/// `NBDMAGIC` (ASCII "NBDMAGIC", also `INIT_PASSWD`): the server's first word.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT` (ASCII "IHAVEOPT"): the newstyle greeting, and the prefix of
/// every option the client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The magic of every option reply (proto.md: "magic number for replies").
pub const NBD_OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`: first word of every transmission request.
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC` (formerly `NBD_REPLY_MAGIC`).
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`: first word of every structured reply chunk.
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---------------------------------------------------------------------------
// Handshake flags (16 bits, server to client).

pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;

// Client flags (32 bits, client to server).

pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---------------------------------------------------------------------------
// Transmission flags (16 bits, with the export size).

pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const NBD_FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;
pub const NBD_FLAG_BLOCK_STATUS_PAYLOAD: u16 = 1 << 12;

// ---------------------------------------------------------------------------
// Option types.

pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_LIST: u32 = 3;
pub const NBD_OPT_PEEK_EXPORT: u32 = 4;
pub const NBD_OPT_STARTTLS: u32 = 5;
pub const NBD_OPT_INFO: u32 = 6;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// ---------------------------------------------------------------------------
// Option reply types. Errors have bit 31 set.

pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_SERVER: u32 = 2;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_META_CONTEXT: u32 = 4;
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR + 1;
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR + 2;
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR + 3;
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR + 4;
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR + 5;
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR + 6;
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR + 7;
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR + 8;
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR + 9;
pub const NBD_REP_ERR_EXT_HEADER_REQD: u32 = NBD_REP_FLAG_ERROR + 10;

// Information types (`NBD_REP_INFO` payloads, and `NBD_OPT_INFO`/`GO` requests).

pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_NAME: u16 = 1;
pub const NBD_INFO_DESCRIPTION: u16 = 2;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// ---------------------------------------------------------------------------
// Request types.

pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_CACHE: u16 = 5;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;
pub const NBD_CMD_RESIZE: u16 = 8;

// Command flags.

pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
pub const NBD_CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// ---------------------------------------------------------------------------
// Structured reply flags and types.

pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;

pub const NBD_REPLY_TYPE_NONE: u16 = 0;
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const NBD_REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// ---------------------------------------------------------------------------
// `base:allocation` metadata context.

/// The one metadata context this server offers.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The `base:` namespace; as a list query it is a wildcard for the namespace.
pub const BASE_NAMESPACE: &str = "base:";
pub const NBD_STATE_HOLE: u32 = 1 << 0;
pub const NBD_STATE_ZERO: u32 = 1 << 1;

// ---------------------------------------------------------------------------
// Sizes fixed by the protocol.

/// Bytes of a request header (magic, flags, type, cookie, offset, length).
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Longest string the protocol allows (export names, descriptions, error
/// messages, context names: "MUST be no longer than 4096 bytes").
pub const STRING_MAX_BYTES: usize = 4096;
/// Reserved zeroes after `NBD_OPT_EXPORT_NAME`'s reply unless the client
/// negotiated `NBD_FLAG_C_NO_ZEROES`.
pub const EXPORT_NAME_ZEROES: usize = 124;
/// Most descriptors in one `NBD_REPLY_TYPE_BLOCK_STATUS` chunk ("Servers
/// SHOULD NOT send more than 2^20 extents in a single reply chunk").
pub const BLOCK_STATUS_MAX_EXTENTS: usize = 1 << 20;

impl Errno {
    /// The value of the error field on the wire (proto.md "Error values").
    pub(crate) fn code(self) -> u32 {
        self as u32
    }
}

// ---------------------------------------------------------------------------
// Handshake encoding.

/// The first thing the server sends: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub(crate) fn greeting() -> [u8; 18] {
    let mut out = [0; 18];
    out[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..].copy_from_slice(&(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes());
    out
}

/// An option reply: header plus `data`.
pub(crate) fn option_reply(option: u32, reply_type: u32, data: &[u8]) -> BytesMut {
    let mut out = BytesMut::with_capacity(20 + data.len());
    out.put_u64(NBD_OPTION_REPLY_MAGIC);
    out.put_u32(option);
    out.put_u32(reply_type);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
    out
}

/// `NBD_REP_SERVER` data: name length, name, description.
pub(crate) fn rep_server(name: &str, description: &str) -> BytesMut {
    let mut out = BytesMut::with_capacity(4 + name.len() + description.len());
    out.put_u32(name.len() as u32);
    out.put_slice(name.as_bytes());
    out.put_slice(truncate_string(description).as_bytes());
    out
}

/// `NBD_INFO_EXPORT` data: size and transmission flags.
pub(crate) fn info_export(size: u64, flags: u16) -> BytesMut {
    let mut out = BytesMut::with_capacity(12);
    out.put_u16(NBD_INFO_EXPORT);
    out.put_u64(size);
    out.put_u16(flags);
    out
}

/// `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION` data.
pub(crate) fn info_string(info: u16, text: &str) -> BytesMut {
    let text = truncate_string(text);
    let mut out = BytesMut::with_capacity(2 + text.len());
    out.put_u16(info);
    out.put_slice(text.as_bytes());
    out
}

/// `NBD_INFO_BLOCK_SIZE` data.
pub(crate) fn info_block_size(minimum: u32, preferred: u32, maximum: u32) -> BytesMut {
    let mut out = BytesMut::with_capacity(14);
    out.put_u16(NBD_INFO_BLOCK_SIZE);
    out.put_u32(minimum);
    out.put_u32(preferred);
    out.put_u32(maximum);
    out
}

/// `NBD_REP_META_CONTEXT` data.
pub(crate) fn rep_meta_context(id: u32, name: &str) -> BytesMut {
    let mut out = BytesMut::with_capacity(4 + name.len());
    out.put_u32(id);
    out.put_slice(name.as_bytes());
    out
}

/// The reply to `NBD_OPT_EXPORT_NAME`: size, flags, and (unless the client
/// negotiated `NBD_FLAG_C_NO_ZEROES`) 124 reserved zero bytes.
pub(crate) fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> BytesMut {
    let mut out = BytesMut::with_capacity(10 + EXPORT_NAME_ZEROES);
    out.put_u64(size);
    out.put_u16(flags);
    if !no_zeroes {
        out.put_bytes(0, EXPORT_NAME_ZEROES);
    }
    out
}

/// `text` cut to at most [`STRING_MAX_BYTES`], on a character boundary.
fn truncate_string(text: &str) -> &str {
    if text.len() <= STRING_MAX_BYTES {
        return text;
    }
    let mut end = STRING_MAX_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

// ---------------------------------------------------------------------------
// Handshake parsing.

/// Why an option's data could not be parsed; the text goes back to the
/// client with `NBD_REP_ERR_INVALID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Malformed {
    #[error("option data is shorter than its fields")]
    Short,
    #[error("option data is longer than its fields")]
    Long,
    #[error("a string is longer than 4096 bytes")]
    StringTooLong,
    #[error("a string is not valid UTF-8")]
    NotUtf8,
    #[error("this option takes no data")]
    UnexpectedData,
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExportQuery {
    pub name: String,
    pub info_requests: Vec<u16>,
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetaQuery {
    pub name: String,
    pub queries: Vec<String>,
}

/// A cursor over option data that fails with [`Malformed`] instead of
/// panicking on short input.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.rest.len() < n {
            return Err(Malformed::Short);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, Malformed> {
        let bytes = self.take(2)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        let bytes = self.take(4)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// A string preceded by its 32-bit length.
    fn string(&mut self) -> Result<String, Malformed> {
        let length = self.u32()? as usize;
        if length > STRING_MAX_BYTES {
            return Err(Malformed::StringTooLong);
        }
        let bytes = self.take(length)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| Malformed::NotUtf8)
    }

    fn finish(self) -> Result<(), Malformed> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(Malformed::Long)
        }
    }
}

/// Parses `NBD_OPT_INFO` / `NBD_OPT_GO` data: name, count, info requests.
pub(crate) fn parse_export_query(data: &[u8]) -> Result<ExportQuery, Malformed> {
    let mut fields = Fields { rest: data };
    let name = fields.string()?;
    let count = fields.u16()?;
    let info_requests = (0..count)
        .map(|_| fields.u16())
        .collect::<Result<Vec<_>, _>>()?;
    fields.finish()?;
    Ok(ExportQuery {
        name,
        info_requests,
    })
}

/// Parses `NBD_OPT_*_META_CONTEXT` data: name, count, queries.
pub(crate) fn parse_meta_query(data: &[u8]) -> Result<MetaQuery, Malformed> {
    let mut fields = Fields { rest: data };
    let name = fields.string()?;
    let count = fields.u32()?;
    // Each query takes at least its 4-byte length, so the data bounds the
    // count: no allocation follows a count the data cannot back.
    if count as usize > fields.rest.len() / 4 {
        return Err(Malformed::Short);
    }
    let queries = (0..count)
        .map(|_| fields.string())
        .collect::<Result<Vec<_>, _>>()?;
    fields.finish()?;
    Ok(MetaQuery { name, queries })
}

/// The name of the export, from `NBD_OPT_EXPORT_NAME` data (the whole data).
pub(crate) fn parse_export_name(data: &[u8]) -> Result<String, Malformed> {
    if data.len() > STRING_MAX_BYTES {
        return Err(Malformed::StringTooLong);
    }
    String::from_utf8(data.to_vec()).map_err(|_| Malformed::NotUtf8)
}

// ---------------------------------------------------------------------------
// Transmission: requests.

/// A request header, magic already checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Parses a request header; `Err` carries a wrong magic number.
pub(crate) fn parse_request(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, u32> {
    let word =
        |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let half = |at: usize| u16::from_be_bytes([bytes[at], bytes[at + 1]]);
    let double = |at: usize| (u64::from(word(at)) << 32) | u64::from(word(at + 4));
    let magic = word(0);
    if magic != NBD_REQUEST_MAGIC {
        return Err(magic);
    }
    Ok(RequestHeader {
        flags: half(4),
        kind: half(6),
        cookie: double(8),
        offset: double(16),
        length: word(24),
    })
}

// ---------------------------------------------------------------------------
// Transmission: replies.

/// The outcome of one request, before encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Success without data.
    Done,
    /// `NBD_CMD_READ` data for `[offset, offset + data.len())`.
    Data { offset: u64, data: Bytes },
    /// `NBD_CMD_BLOCK_STATUS` descriptors for one context.
    Extents { context: u32, extents: Vec<Extent> },
    /// Failure, with a message for a human (sent with structured replies).
    Error { errno: Errno, message: &'static str },
}

impl Reply {
    pub(crate) fn error(errno: Errno, message: &'static str) -> Reply {
        Reply::Error { errno, message }
    }
}

/// An encoded reply: a header (and small payloads) plus bulk data that is
/// written as is, without copying it into the header buffer.
#[derive(Debug)]
pub(crate) struct EncodedReply {
    pub head: BytesMut,
    pub data: Option<Bytes>,
}

impl EncodedReply {
    /// Bytes on the wire.
    pub(crate) fn len(&self) -> usize {
        self.head.len() + self.data.as_ref().map_or(0, Bytes::len)
    }
}

/// Encodes `reply` to the request with `cookie`. With structured replies
/// every reply is a single chunk flagged `NBD_REPLY_FLAG_DONE`, except that
/// successes without data use a simple reply (allowed for every command but
/// `NBD_CMD_READ`, which never reaches here as [`Reply::Done`]).
pub(crate) fn encode_reply(cookie: u64, structured: bool, reply: Reply) -> EncodedReply {
    match (reply, structured) {
        (Reply::Done, _) => EncodedReply {
            head: simple_reply(cookie, 0),
            data: None,
        },
        (Reply::Data { data, .. }, false) => EncodedReply {
            head: simple_reply(cookie, 0),
            data: Some(data),
        },
        (Reply::Data { data, .. }, true) if data.is_empty() => EncodedReply {
            head: chunk_header(NBD_REPLY_TYPE_NONE, cookie, 0),
            data: None,
        },
        (Reply::Data { offset, data }, true) => {
            let mut head = chunk_header(NBD_REPLY_TYPE_OFFSET_DATA, cookie, 8 + data.len() as u32);
            head.put_u64(offset);
            EncodedReply {
                head,
                data: Some(data),
            }
        }
        (Reply::Extents { context, extents }, _) => {
            let mut head = chunk_header(
                NBD_REPLY_TYPE_BLOCK_STATUS,
                cookie,
                4 + 8 * extents.len() as u32,
            );
            head.put_u32(context);
            for extent in extents {
                head.put_u32(extent.length);
                head.put_u32(extent.flags);
            }
            EncodedReply { head, data: None }
        }
        (Reply::Error { errno, .. }, false) => EncodedReply {
            head: simple_reply(cookie, errno.code()),
            data: None,
        },
        (Reply::Error { errno, message }, true) => {
            let message = truncate_string(message);
            let mut head = chunk_header(NBD_REPLY_TYPE_ERROR, cookie, 6 + message.len() as u32);
            head.put_u32(errno.code());
            head.put_u16(message.len() as u16);
            head.put_slice(message.as_bytes());
            EncodedReply { head, data: None }
        }
    }
}

fn simple_reply(cookie: u64, error: u32) -> BytesMut {
    let mut out = BytesMut::with_capacity(16);
    out.put_u32(NBD_SIMPLE_REPLY_MAGIC);
    out.put_u32(error);
    out.put_u64(cookie);
    out
}

/// A structured chunk header, always the final chunk of its reply.
fn chunk_header(reply_type: u16, cookie: u64, length: u32) -> BytesMut {
    let mut out = BytesMut::with_capacity(28 + length.min(64) as usize);
    out.put_u32(NBD_STRUCTURED_REPLY_MAGIC);
    out.put_u16(NBD_REPLY_FLAG_DONE);
    out.put_u16(reply_type);
    out.put_u64(cookie);
    out.put_u32(length);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_is_magic_then_flags() {
        let bytes = greeting();
        assert_eq!(&bytes[..8], b"NBDMAGIC");
        assert_eq!(&bytes[8..16], b"IHAVEOPT");
        assert_eq!(&bytes[16..], &[0, 3]);
    }

    #[test]
    fn request_header_round_trip() {
        let mut bytes = [0u8; REQUEST_HEADER_BYTES];
        bytes[..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        bytes[4..6].copy_from_slice(&NBD_CMD_FLAG_FUA.to_be_bytes());
        bytes[6..8].copy_from_slice(&NBD_CMD_WRITE.to_be_bytes());
        bytes[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        bytes[16..24].copy_from_slice(&(1u64 << 40).to_be_bytes());
        bytes[24..].copy_from_slice(&4096u32.to_be_bytes());
        let header = parse_request(&bytes).unwrap();
        assert_eq!(
            header,
            RequestHeader {
                flags: NBD_CMD_FLAG_FUA,
                kind: NBD_CMD_WRITE,
                cookie: 0x0102_0304_0506_0708,
                offset: 1 << 40,
                length: 4096
            }
        );
        bytes[0] ^= 1;
        assert_eq!(parse_request(&bytes), Err(NBD_REQUEST_MAGIC ^ (1 << 24)));
    }

    fn export_query_bytes(name: &[u8], infos: &[u16]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for info in infos {
            out.extend_from_slice(&info.to_be_bytes());
        }
        out
    }

    #[test]
    fn export_query_parses_and_rejects_bad_lengths() {
        let data = export_query_bytes(b"disk", &[NBD_INFO_NAME, NBD_INFO_BLOCK_SIZE]);
        let query = parse_export_query(&data).unwrap();
        assert_eq!(query.name, "disk");
        assert_eq!(
            query.info_requests,
            vec![NBD_INFO_NAME, NBD_INFO_BLOCK_SIZE]
        );
        assert_eq!(
            parse_export_query(&data[..data.len() - 1]),
            Err(Malformed::Short)
        );
        let mut long = data.clone();
        long.push(0);
        assert_eq!(parse_export_query(&long), Err(Malformed::Long));
        let mut lying = data;
        lying[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_export_query(&lying), Err(Malformed::StringTooLong));
        assert_eq!(
            parse_export_query(&export_query_bytes(&[0xff, 0xfe], &[])),
            Err(Malformed::NotUtf8)
        );
    }

    #[test]
    fn meta_query_parses_and_bounds_the_count() {
        let mut data = Vec::new();
        data.extend_from_slice(&4u32.to_be_bytes());
        data.extend_from_slice(b"disk");
        data.extend_from_slice(&2u32.to_be_bytes());
        for query in ["base:", "x-other:thing"] {
            data.extend_from_slice(&(query.len() as u32).to_be_bytes());
            data.extend_from_slice(query.as_bytes());
        }
        let query = parse_meta_query(&data).unwrap();
        assert_eq!(query.name, "disk");
        assert_eq!(
            query.queries,
            vec!["base:".to_string(), "x-other:thing".to_string()]
        );
        // A count far beyond what the data holds fails before allocating.
        data[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_meta_query(&data), Err(Malformed::Short));
    }

    #[test]
    fn structured_read_is_one_final_offset_data_chunk() {
        let reply = Reply::Data {
            offset: 512,
            data: Bytes::from_static(b"abc"),
        };
        let encoded = encode_reply(7, true, reply);
        let head = &encoded.head[..];
        assert_eq!(&head[..4], &NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&head[4..6], &NBD_REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&head[6..8], &NBD_REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        assert_eq!(&head[8..16], &7u64.to_be_bytes());
        assert_eq!(&head[16..20], &11u32.to_be_bytes());
        assert_eq!(&head[20..28], &512u64.to_be_bytes());
        assert_eq!(encoded.data.as_deref(), Some(&b"abc"[..]));
    }

    #[test]
    fn errors_are_simple_or_error_chunks() {
        let simple = encode_reply(9, false, Reply::error(Errno::NoSpace, "full"));
        assert_eq!(
            &simple.head[..],
            &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 28, 0, 0, 0, 0, 0, 0, 0, 9]
        );
        let chunk = encode_reply(9, true, Reply::error(Errno::NoSpace, "full"));
        assert_eq!(&chunk.head[6..8], &NBD_REPLY_TYPE_ERROR.to_be_bytes());
        assert_eq!(&chunk.head[16..20], &10u32.to_be_bytes());
        assert_eq!(&chunk.head[20..24], &28u32.to_be_bytes());
        assert_eq!(&chunk.head[24..26], &4u16.to_be_bytes());
        assert_eq!(&chunk.head[26..], b"full");
    }

    #[test]
    fn empty_structured_read_is_a_none_chunk() {
        let encoded = encode_reply(
            1,
            true,
            Reply::Data {
                offset: 0,
                data: Bytes::new(),
            },
        );
        assert_eq!(&encoded.head[6..8], &NBD_REPLY_TYPE_NONE.to_be_bytes());
        assert_eq!(&encoded.head[16..20], &0u32.to_be_bytes());
        assert!(encoded.data.is_none());
    }

    #[test]
    fn long_strings_are_cut_on_a_character_boundary() {
        let text = "é".repeat(STRING_MAX_BYTES);
        let cut = truncate_string(&text);
        assert!(cut.len() <= STRING_MAX_BYTES && cut.len() >= STRING_MAX_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}

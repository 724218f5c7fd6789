//! A raw, blocking NBD client for the protocol tests: every byte on the
//! wire is spelled out here, so tests can also send what a well-behaved
//! client never would. Constants follow the NBD protocol document
//! (`doc/proto.md` of NetworkBlockDevice/nbd).

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const TRANSMIT_HAS_FLAGS: u16 = 1 << 0;
pub const TRANSMIT_READ_ONLY: u16 = 1 << 1;
pub const TRANSMIT_SEND_FLUSH: u16 = 1 << 2;
pub const TRANSMIT_SEND_FUA: u16 = 1 << 3;
pub const TRANSMIT_SEND_TRIM: u16 = 1 << 5;
pub const TRANSMIT_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TRANSMIT_CAN_MULTI_CONN: u16 = 1 << 8;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;

pub const CMD_FLAG_FUA: u16 = 1 << 0;

pub const EPERM: u32 = 1;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;

/// How long a test waits for any one answer before calling it a hang.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A Unix-socket connection with read and write timeouts.
pub fn connect(socket: &Path) -> UnixStream {
    let stream =
        UnixStream::connect(socket).unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(IO_TIMEOUT))
        .expect("write timeout");
    stream
}

pub fn read_exact(stream: &mut UnixStream, length: usize) -> std::io::Result<Vec<u8>> {
    let mut buffer = vec![0u8; length];
    stream.read_exact(&mut buffer)?;
    Ok(buffer)
}

fn u16_at(data: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(data[at..at + 2].try_into().expect("2 bytes"))
}

fn u32_at(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(data[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(data[at..at + 8].try_into().expect("8 bytes"))
}

/// Read the server's greeting; returns its handshake flags.
pub fn greeting(stream: &mut UnixStream) -> u16 {
    let data = read_exact(stream, 18).expect("server greeting");
    assert_eq!(u64_at(&data, 0), NBDMAGIC, "greeting magic: {data:02x?}");
    assert_eq!(u64_at(&data, 8), IHAVEOPT, "not newstyle: {data:02x?}");
    let flags = u16_at(&data, 16);
    assert!(
        flags & FLAG_FIXED_NEWSTYLE != 0,
        "server lacks fixed newstyle: flags {flags:#x}"
    );
    flags
}

pub fn send_option(stream: &mut UnixStream, option: u32, data: &[u8]) {
    let mut message = Vec::with_capacity(16 + data.len());
    message.extend_from_slice(&IHAVEOPT.to_be_bytes());
    message.extend_from_slice(&option.to_be_bytes());
    message.extend_from_slice(&(data.len() as u32).to_be_bytes());
    message.extend_from_slice(data);
    stream.write_all(&message).expect("send option");
}

pub struct OptionReply {
    pub option: u32,
    pub reply: u32,
    pub data: Vec<u8>,
}

pub fn option_reply(stream: &mut UnixStream) -> OptionReply {
    let header = read_exact(stream, 20).expect("option reply header");
    assert_eq!(
        u64_at(&header, 0),
        OPTION_REPLY_MAGIC,
        "option reply magic: {header:02x?}"
    );
    let length = u32_at(&header, 16);
    assert!(length <= 1 << 20, "option reply of {length} bytes");
    let data = read_exact(stream, length as usize).expect("option reply data");
    OptionReply {
        option: u32_at(&header, 8),
        reply: u32_at(&header, 12),
        data,
    }
}

/// NBD_OPT_GO / NBD_OPT_INFO payload asking for block sizes.
pub fn go_payload(export: &str) -> Vec<u8> {
    let mut data = Vec::new();
    data.extend_from_slice(&(export.len() as u32).to_be_bytes());
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    data
}

/// What NBD_OPT_GO told about an export.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    /// (minimum, preferred, maximum)
    pub block_sizes: Option<(u32, u32, u32)>,
}

/// Read NBD_REP_INFO replies up to the final reply. `Err(reply type)` if
/// the server refused.
pub fn info_replies(stream: &mut UnixStream, option: u32) -> Result<ExportInfo, u32> {
    let mut info = ExportInfo::default();
    loop {
        let reply = option_reply(stream);
        assert_eq!(reply.option, option, "reply to another option");
        match reply.reply {
            REP_ACK => return Ok(info),
            REP_INFO => {
                let data = &reply.data;
                match u16_at(data, 0) {
                    INFO_EXPORT => {
                        assert_eq!(data.len(), 12, "NBD_INFO_EXPORT length");
                        info.size = u64_at(data, 2);
                        info.flags = u16_at(data, 10);
                    }
                    INFO_BLOCK_SIZE => {
                        assert_eq!(data.len(), 14, "NBD_INFO_BLOCK_SIZE length");
                        info.block_sizes =
                            Some((u32_at(data, 2), u32_at(data, 6), u32_at(data, 10)));
                    }
                    _ => {}
                }
            }
            error if error & 0x8000_0000 != 0 => return Err(error),
            other => panic!("unexpected option reply type {other:#x}"),
        }
    }
}

/// A connection in the transmission phase (simple replies).
pub struct Connection {
    pub stream: UnixStream,
    pub info: ExportInfo,
    next_cookie: u64,
}

/// The end of a request as the client sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Simple reply with this error (0 = success) and cookie.
    Reply { error: u32, cookie: u64 },
    /// The server closed the connection.
    Closed,
}

impl Connection {
    /// Fixed newstyle handshake, NBD_OPT_GO with NBD_INFO_BLOCK_SIZE.
    pub fn open(socket: &Path, export: &str) -> Connection {
        let mut stream = connect(socket);
        let flags = greeting(&mut stream);
        let client_flags = u32::from(FLAG_FIXED_NEWSTYLE | (flags & FLAG_NO_ZEROES));
        stream
            .write_all(&client_flags.to_be_bytes())
            .expect("client flags");
        Connection::go(stream, export)
    }

    /// Send NBD_OPT_GO on a stream that is past the client flags.
    pub fn go(mut stream: UnixStream, export: &str) -> Connection {
        send_option(&mut stream, OPT_GO, &go_payload(export));
        let info = info_replies(&mut stream, OPT_GO)
            .unwrap_or_else(|error| panic!("NBD_OPT_GO {export:?} refused: reply {error:#x}"));
        assert!(info.size > 0, "export {export:?} has no size: {info:?}");
        Connection {
            stream,
            info,
            next_cookie: 1,
        }
    }

    /// Send one request (header and payload); returns its cookie.
    #[track_caller]
    pub fn send(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> u64 {
        self.try_send(command, flags, offset, length, payload)
            .expect("send request")
    }

    /// Send one request; an error if the server has closed the connection.
    pub fn try_send(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> std::io::Result<u64> {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let mut message = Vec::with_capacity(28 + payload.len());
        message.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        message.extend_from_slice(&flags.to_be_bytes());
        message.extend_from_slice(&command.to_be_bytes());
        message.extend_from_slice(&cookie.to_be_bytes());
        message.extend_from_slice(&offset.to_be_bytes());
        message.extend_from_slice(&length.to_be_bytes());
        message.extend_from_slice(payload);
        self.stream.write_all(&message)?;
        Ok(cookie)
    }

    /// Read one simple reply header, or notice the connection closed.
    pub fn outcome(&mut self) -> Outcome {
        let mut header = [0u8; 16];
        match self.stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
                ) =>
            {
                return Outcome::Closed
            }
            Err(e) => panic!("no reply within {IO_TIMEOUT:?}: {e}"),
        }
        assert_eq!(
            u32_at(&header, 0),
            SIMPLE_REPLY_MAGIC,
            "reply magic: {header:02x?}"
        );
        Outcome::Reply {
            error: u32_at(&header, 4),
            cookie: u64_at(&header, 8),
        }
    }

    /// Read a reply that must exist and answer `cookie`; returns its error.
    #[track_caller]
    pub fn reply(&mut self, cookie: u64) -> u32 {
        match self.outcome() {
            Outcome::Reply { error, cookie: got } => {
                assert_eq!(got, cookie, "reply for another request");
                error
            }
            Outcome::Closed => {
                panic!("the server closed the connection instead of answering request {cookie}")
            }
        }
    }

    #[track_caller]
    pub fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
        let cookie = self.send(CMD_READ, 0, offset, length, &[]);
        match self.reply(cookie) {
            0 => Ok(read_exact(&mut self.stream, length as usize).expect("read payload")),
            error => Err(error),
        }
    }

    #[track_caller]
    pub fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> Result<(), u32> {
        let cookie = self.send(CMD_WRITE, flags, offset, data.len() as u32, data);
        match self.reply(cookie) {
            0 => Ok(()),
            error => Err(error),
        }
    }

    /// A command without payload either way (flush, trim, write zeroes...).
    #[track_caller]
    pub fn command(&mut self, command: u16, offset: u64, length: u32) -> Result<(), u32> {
        let cookie = self.send(command, 0, offset, length, &[]);
        match self.reply(cookie) {
            0 => Ok(()),
            error => Err(error),
        }
    }

    #[track_caller]
    pub fn flush(&mut self) -> Result<(), u32> {
        self.command(CMD_FLUSH, 0, 0)
    }

    /// NBD_CMD_DISC, then close.
    pub fn disconnect(mut self) {
        self.send(CMD_DISC, 0, 0, 0, &[]);
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Read until the peer closes. `Ok(bytes read)` on close (EOF or reset);
/// `Err` if it stayed open for `IO_TIMEOUT`.
pub fn wait_closed(stream: &mut UnixStream) -> Result<usize, String> {
    let mut total = 0;
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return Ok(total),
            Ok(n) => total += n,
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return Ok(total)
            }
            Err(e) if matches!(e.kind(), ErrorKind::Interrupted) => {}
            Err(e) => {
                return Err(format!(
                    "still open after {IO_TIMEOUT:?} ({e}), {total} bytes received"
                ))
            }
        }
    }
}

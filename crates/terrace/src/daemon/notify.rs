//! Readiness for a service manager (systemd's `Type=notify`): `READY=1`
//! once the saved pools are imported and every socket is bound, and
//! `STOPPING=1` when shutdown begins.
//!
//! The protocol (`sd_notify(3)`): one datagram of `KEY=VALUE` lines sent to
//! the Unix datagram socket named by `$NOTIFY_SOCKET`, a path or, when it
//! starts with `@`, a name in the abstract namespace. Without the variable
//! (not started by a service manager) nothing is sent.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The variable naming the service manager's socket.
const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// The daemon serves: pools imported, sockets bound.
pub fn ready() {
    send("READY=1\n");
}

/// The daemon has begun to shut down.
pub fn stopping() {
    send("STOPPING=1\n");
}

fn send(state: &str) {
    let Some(target) = std::env::var_os(NOTIFY_SOCKET) else {
        return;
    };
    if let Err(error) = send_to(&target, state) {
        super::log(format!(
            "cannot tell the service manager {} at {}: {error}",
            state.trim_end(),
            target.to_string_lossy()
        ));
    }
}

fn send_to(target: &OsString, state: &str) -> std::io::Result<()> {
    let bytes = target.as_bytes();
    let address = match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)?
        }
        None => SocketAddr::from_pathname(target)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &address)?;
    Ok(())
}

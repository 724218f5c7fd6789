//! Where the daemon keeps its sockets and state, unless told otherwise.
//!
//! root: `/run/terrace/` for sockets, `/var/lib/terrace` for state.
//! Others: `$XDG_RUNTIME_DIR/terrace` (or `/tmp/terrace-UID`) and
//! `$XDG_STATE_HOME/terrace` (or `~/.local/state/terrace`).
//! `TERRACE_CONTROL` and `TERRACE_STATE_DIR` override both.
//! The daemon's other runtime files (the NBD Unix socket) go beside its
//! control socket, wherever that is, so that daemons with different
//! control sockets in different folders never meet.

use std::path::{Path, PathBuf};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn runtime_dir() -> PathBuf {
    if is_root() {
        return PathBuf::from("/run/terrace");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) => PathBuf::from(dir).join("terrace"),
        // SAFETY: getuid has no preconditions and cannot fail.
        None => PathBuf::from(format!("/tmp/terrace-{}", unsafe { libc::getuid() })),
    }
}

pub fn control_socket() -> PathBuf {
    std::env::var_os("TERRACE_CONTROL")
        .map(PathBuf::from)
        .unwrap_or_else(|| runtime_dir().join("control.sock"))
}

/// The NBD Unix socket of the daemon whose control socket is `control`:
/// `nbd.sock` in the same folder.
pub fn nbd_socket_beside(control: &Path) -> PathBuf {
    control
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("nbd.sock")
}

pub fn state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TERRACE_STATE_DIR") {
        return PathBuf::from(dir);
    }
    if is_root() {
        return PathBuf::from("/var/lib/terrace");
    }
    match (std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME")) {
        (Some(state), _) => PathBuf::from(state).join("terrace"),
        (None, Some(home)) => PathBuf::from(home).join(".local/state/terrace"),
        (None, None) => runtime_dir().join("state"),
    }
}

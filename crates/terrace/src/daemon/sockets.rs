//! The daemon's Unix sockets: bound only where no live process listens,
//! and removed again if the daemon does not start.
//!
//! A socket file whose listener is gone (a daemon killed with SIGKILL
//! leaves one) refuses connections: it is stale and replaced. A socket
//! that accepts a connection belongs to a live process, whose PID the
//! kernel gives with the connection (SO_PEERCRED): the start is refused
//! naming it, and that socket is left alone. Anything at the path that is
//! not a socket is left alone too.

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};

#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create {}: {error}", folder.display())]
    Folder {
        folder: PathBuf,
        error: std::io::Error,
    },
    #[error("{what} {} is in use by the process with PID {pid} (another daemon?): stop it, or give this daemon another path", path.display())]
    InUse {
        what: &'static str,
        path: PathBuf,
        pid: i32,
    },
    #[error("{what} {} is in use by a process this one may not ask for its PID", path.display())]
    InUseByUnknown { what: &'static str, path: PathBuf },
    #[error("{what} {} exists and is not a socket: move it away or give this daemon another path", path.display())]
    NotSocket { what: &'static str, path: PathBuf },
    #[error("cannot tell whether {what} {} is in use: {error}", path.display())]
    Probe {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot remove the stale {what} {}: {error}", path.display())]
    RemoveStale {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot listen on {what} {}: {error}", path.display())]
    Bind {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
}

/// The socket files a starting daemon has bound: removed when dropped,
/// unless [`Created::keep`] hands them to the running daemon, so that a
/// start that fails leaves nothing behind.
#[derive(Default)]
pub struct Created {
    paths: Vec<PathBuf>,
}

impl Created {
    /// The daemon started: from now on it removes its sockets itself when
    /// it stops.
    pub fn keep(mut self) {
        self.paths.clear();
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        for path in &self.paths {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Bind `what` (e.g. "control socket") at `path`, replacing a stale
/// socket file, refusing one a live process listens on.
pub async fn bind(
    what: &'static str,
    path: &Path,
    created: &mut Created,
) -> Result<UnixListener, SocketError> {
    if let Some(folder) = path.parent().filter(|f| !f.as_os_str().is_empty()) {
        std::fs::create_dir_all(folder).map_err(|error| SocketError::Folder {
            folder: folder.to_path_buf(),
            error,
        })?;
    }
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        if !metadata.file_type().is_socket() {
            return Err(SocketError::NotSocket {
                what,
                path: path.to_path_buf(),
            });
        }
        remove_if_stale(what, path).await?;
    }
    let listener = UnixListener::bind(path).map_err(|error| SocketError::Bind {
        what,
        path: path.to_path_buf(),
        error,
    })?;
    created.paths.push(path.to_path_buf());
    Ok(listener)
}

/// Remove the socket file at `path` if nothing listens on it; refuse,
/// naming the listener's PID, if something does.
async fn remove_if_stale(what: &'static str, path: &Path) -> Result<(), SocketError> {
    match UnixStream::connect(path).await {
        Ok(stream) => {
            return Err(match stream.peer_cred().ok().and_then(|cred| cred.pid()) {
                Some(pid) => SocketError::InUse {
                    what,
                    path: path.to_path_buf(),
                    pid,
                },
                None => SocketError::InUseByUnknown {
                    what,
                    path: path.to_path_buf(),
                },
            })
        }
        // Nobody listens: the file outlived its daemon.
        Err(error) if error.kind() == ErrorKind::ConnectionRefused => {}
        // Gone meanwhile: nothing to remove.
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(SocketError::Probe {
                what,
                path: path.to_path_buf(),
                error,
            })
        }
    }
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != ErrorKind::NotFound => Err(SocketError::RemoveStale {
            what,
            path: path.to_path_buf(),
            error,
        }),
        _ => Ok(()),
    }
}

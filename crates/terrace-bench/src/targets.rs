//! The targets: an NBD export, a file or block device, an in-process space;
//! and [`TargetSpec`], the `[name=]URI|PATH` text that names one.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use terrace_engine::Space;
use terrace_export::client::NbdClient;
use terrace_io::file::{FileDevice, FileOptions};
use terrace_io::{aligned_buffer, BlockDevice, Bytes};

use crate::target::{Target, TargetError, TargetResult};

/// A target as the user names it: `nbd://host[:port]/export`,
/// `nbd+unix:///export?socket=PATH`, or a path to a file or block device,
/// optionally labelled `label=...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    pub label: String,
    pub location: Location,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Nbd(String),
    Path(PathBuf),
}

impl TargetSpec {
    /// Parse `[label=]URI|PATH`. A label is a leading run of letters,
    /// digits, `-`, `_` and `.` before the first `=`; anything else (an NBD
    /// URI's `?socket=`, a path) is the location. Without a label, the
    /// location itself is the label.
    pub fn parse(text: &str) -> Result<TargetSpec, String> {
        let text = text.trim();
        let (label, location) = match text.split_once('=') {
            Some((label, rest))
                if !label.is_empty()
                    && label
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) =>
            {
                (label.to_string(), rest)
            }
            _ => (text.to_string(), text),
        };
        if location.is_empty() {
            return Err(format!(
                "target {text:?} names nothing: give an nbd:// or nbd+unix:// URI or a path"
            ));
        }
        let location = if location.starts_with("nbd://") || location.starts_with("nbd+unix://") {
            Location::Nbd(location.to_string())
        } else if location.contains("://") {
            return Err(format!(
                "target {text:?}: only nbd:// and nbd+unix:// URIs are supported"
            ));
        } else {
            Location::Path(PathBuf::from(location))
        };
        Ok(TargetSpec { label, location })
    }

    /// Connect or open: NBD with `connections` connections, a path with
    /// O_DIRECT where the filesystem allows it.
    pub async fn open(&self, connections: usize) -> TargetResult<Box<dyn Target>> {
        Ok(match &self.location {
            Location::Nbd(uri) => {
                Box::new(NbdTarget::connect(&self.label, uri, connections).await?)
            }
            Location::Path(path) => Box::new(FileTarget::open(&self.label, path)?),
        })
    }
}

/// An NBD export, over one connection or several used in turn.
pub struct NbdTarget {
    name: String,
    clients: Vec<NbdClient>,
    next: AtomicUsize,
}

impl NbdTarget {
    pub async fn connect(name: &str, uri: &str, connections: usize) -> TargetResult<NbdTarget> {
        let mut clients = Vec::new();
        for _ in 0..connections.max(1) {
            clients.push(NbdClient::connect(uri).await?);
        }
        Ok(NbdTarget {
            name: name.to_string(),
            clients,
            next: AtomicUsize::new(0),
        })
    }

    /// The connections in turn, one request each.
    fn client(&self) -> &NbdClient {
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        &self.clients[turn % self.clients.len()]
    }

    /// Say goodbye on every connection.
    pub async fn disconnect(&self) -> TargetResult<()> {
        for client in &self.clients {
            client.disconnect().await?;
        }
        Ok(())
    }
}

impl Target for NbdTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.clients[0].size_bytes
    }

    fn read(&self, offset: u64, length: u32) -> BoxFuture<'_, TargetResult<Bytes>> {
        let request = self.client().read(offset, length);
        async move { Ok(Bytes::from(request.await?)) }.boxed()
    }

    fn write(&self, offset: u64, data: Bytes) -> BoxFuture<'_, TargetResult<()>> {
        let client = self.client();
        async move { Ok(client.write(offset, &data, false).await?) }.boxed()
    }

    /// Flush every connection: a server without multi-conn only promises
    /// that a flush covers its own connection's writes.
    fn flush(&self) -> BoxFuture<'_, TargetResult<()>> {
        async move {
            let flushes = self.clients.iter().map(NbdClient::flush);
            for result in futures::future::join_all(flushes).await {
                result?;
            }
            Ok(())
        }
        .boxed()
    }
}

/// A regular file or block device, through terrace's own I/O backend
/// (io_uring, O_DIRECT where the filesystem allows it, so that the page
/// cache does not flatter reads).
pub struct FileTarget {
    name: String,
    device: FileDevice,
}

impl FileTarget {
    pub fn open(name: &str, path: &std::path::Path) -> TargetResult<FileTarget> {
        let device = FileDevice::open(path, FileOptions::default())?;
        if device.size_bytes() == 0 {
            return Err(TargetError::Other(format!(
                "{} is empty; give it a size first (e.g. truncate -s 1G {})",
                path.display(),
                path.display()
            )));
        }
        Ok(FileTarget {
            name: name.to_string(),
            device,
        })
    }

    pub fn is_direct(&self) -> bool {
        self.device.is_direct()
    }
}

impl Target for FileTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.device.size_bytes()
    }

    fn alignment(&self) -> u64 {
        self.device.alignment()
    }

    fn read(&self, offset: u64, length: u32) -> BoxFuture<'_, TargetResult<Bytes>> {
        let request = self.device.read(offset, aligned_buffer(length as usize));
        async move {
            let (buffer, result) = request.await;
            result?;
            Ok(buffer.freeze())
        }
        .boxed()
    }

    fn write(&self, offset: u64, data: Bytes) -> BoxFuture<'_, TargetResult<()>> {
        let request = self.device.write(offset, data, false);
        async move { Ok(request.await?) }.boxed()
    }

    fn flush(&self) -> BoxFuture<'_, TargetResult<()>> {
        let request = self.device.flush();
        async move { Ok(request.await?) }.boxed()
    }
}

/// A space of an engine running in this process: the engine's cost without
/// a protocol in between.
pub struct SpaceTarget {
    name: String,
    space: Arc<Space>,
}

impl SpaceTarget {
    pub fn new(name: &str, space: Arc<Space>) -> SpaceTarget {
        SpaceTarget {
            name: name.to_string(),
            space,
        }
    }
}

impl Target for SpaceTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.space.size_bytes()
    }

    fn read(&self, offset: u64, length: u32) -> BoxFuture<'_, TargetResult<Bytes>> {
        async move {
            let data = self.space.read(offset, u64::from(length)).await?;
            Ok(data.freeze())
        }
        .boxed()
    }

    fn write(&self, offset: u64, data: Bytes) -> BoxFuture<'_, TargetResult<()>> {
        async move { Ok(self.space.write(offset, data, false).await?) }.boxed()
    }

    fn flush(&self) -> BoxFuture<'_, TargetResult<()>> {
        async move { Ok(self.space.flush().await?) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_labels_uris_and_paths() {
        let spec = TargetSpec::parse("nbd+unix:///disk?socket=/tmp/s.sock").expect("uri");
        assert_eq!(spec.label, "nbd+unix:///disk?socket=/tmp/s.sock");
        assert_eq!(
            spec.location,
            Location::Nbd("nbd+unix:///disk?socket=/tmp/s.sock".into())
        );
        let spec = TargetSpec::parse("mirror=nbd://127.0.0.1:10809/m").expect("labelled");
        assert_eq!(spec.label, "mirror");
        assert_eq!(
            spec.location,
            Location::Nbd("nbd://127.0.0.1:10809/m".into())
        );
        let spec = TargetSpec::parse("ssd=/dev/nvme0n1").expect("path");
        assert_eq!(spec.label, "ssd");
        assert_eq!(spec.location, Location::Path("/dev/nvme0n1".into()));
        let spec = TargetSpec::parse("/tmp/a=b.img").expect("path with =");
        assert_eq!(spec.location, Location::Path("/tmp/a=b.img".into()));
        assert!(TargetSpec::parse("x=").is_err());
        assert!(TargetSpec::parse("http://host/disk").is_err());
    }
}

//! The targets: an NBD export, a file or block device, several files striped
//! (the raw limit of a set of drives), an in-process space; and
//! [`TargetSpec`], the `[name=]URI|PATH[,PATH...]` text that names one.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::BoxFuture;
use futures::FutureExt;
use terrace_io::file::{FileDevice, FileOptions};
use terrace_io::{aligned_buffer, BlockDevice, Bytes};

use crate::nbd::PipelinedNbd;
use crate::target::{Target, TargetError, TargetResult};

/// A target as the user names it: `nbd://host[:port]/export`,
/// `nbd+unix:///export?socket=PATH`, a path to a file or block device, or
/// several paths separated by commas (striped, see [`StripeTarget`]),
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
    /// Two or more files or devices, striped.
    Stripe(Vec<PathBuf>),
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
        } else if location.contains(',') && !location.starts_with("engine:") {
            // (`engine:SPACE@DISK,DISK` names a pool's disks; the terrace
            // command opens it.)
            let paths: Vec<PathBuf> = location.split(',').map(PathBuf::from).collect();
            if paths.iter().any(|path| path.as_os_str().is_empty()) {
                return Err(format!(
                    "target {text:?}: an empty path in the list; write PATH,PATH,..."
                ));
            }
            Location::Stripe(paths)
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
            Location::Stripe(paths) => Box::new(StripeTarget::open(
                &self.label,
                paths,
                STRIPE_INTERLEAVE_BYTES,
            )?),
        })
    }
}

/// Largest NBD request when the server does not say: 32 MiB, the limit of
/// the reference implementations (nbd-server, nbdkit, qemu-nbd).
pub const NBD_REQUEST_MAX_BYTES: u64 = 32 << 20;

/// An NBD export, over one connection or several used in turn, through the
/// generator's pipelined client ([`crate::nbd`]).
pub struct NbdTarget {
    name: String,
    clients: Vec<PipelinedNbd>,
    next: AtomicUsize,
}

impl NbdTarget {
    pub async fn connect(name: &str, uri: &str, connections: usize) -> TargetResult<NbdTarget> {
        let mut clients = Vec::new();
        for _ in 0..connections.max(1) {
            clients.push(PipelinedNbd::connect(uri).await?);
        }
        Ok(NbdTarget {
            name: name.to_string(),
            clients,
            next: AtomicUsize::new(0),
        })
    }

    /// The connections in turn, one request each.
    fn client(&self) -> &PipelinedNbd {
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

    /// The server's advertised maximum payload, else NBD's usual 32 MiB.
    fn request_max_bytes(&self) -> u64 {
        self.clients[0]
            .block_sizes
            .map_or(NBD_REQUEST_MAX_BYTES, |(_, _, maximum)| u64::from(maximum))
    }

    fn read(&self, offset: u64, length: u32) -> BoxFuture<'_, TargetResult<Bytes>> {
        let request = self.client().read(offset, length);
        async move { Ok(request.await?) }.boxed()
    }

    fn write(&self, offset: u64, data: Bytes) -> BoxFuture<'_, TargetResult<()>> {
        let request = self.client().write(offset, &data);
        async move { Ok(request.await?) }.boxed()
    }

    /// Flush every connection: a server without multi-conn only promises
    /// that a flush covers its own connection's writes.
    fn flush(&self) -> BoxFuture<'_, TargetResult<()>> {
        async move {
            let flushes = self.clients.iter().map(PipelinedNbd::flush);
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

/// Interleave of a [`StripeTarget`] named on the command line: 256 KiB,
/// terrace's (and Storage Spaces') default, so that the raw limit stripes
/// exactly as a simple space over the same files does.
pub const STRIPE_INTERLEAVE_BYTES: u64 = 256 << 10;

/// Several files or block devices striped in `interleave_bytes` units, with
/// nothing in between: what the drives of a pool give at most, the limit a
/// simple space over them is measured against. A request is cut at
/// interleave boundaries and the pieces run in parallel.
pub struct StripeTarget {
    name: String,
    files: Vec<FileDevice>,
    interleave_bytes: u64,
    size_bytes: u64,
    alignment: u64,
}

impl StripeTarget {
    pub fn open(
        name: &str,
        paths: &[PathBuf],
        interleave_bytes: u64,
    ) -> TargetResult<StripeTarget> {
        let mut files = Vec::new();
        for path in paths {
            let device = FileDevice::open(path, FileOptions::default())?;
            if device.size_bytes() < interleave_bytes {
                return Err(TargetError::Other(format!(
                    "{} is smaller than one stripe unit ({interleave_bytes} bytes); \
                     give it a size first (e.g. truncate -s 1G {})",
                    path.display(),
                    path.display()
                )));
            }
            files.push(device);
        }
        let alignment = files.iter().map(|f| f.alignment()).max().unwrap_or(1);
        if files.is_empty() || !interleave_bytes.is_multiple_of(alignment) {
            return Err(TargetError::Other(format!(
                "cannot stripe {} files in units of {interleave_bytes} bytes \
                 (their alignment is {alignment} bytes)",
                files.len()
            )));
        }
        let smallest = files.iter().map(|f| f.size_bytes()).min().unwrap_or(0);
        let size_bytes = smallest / interleave_bytes * interleave_bytes * files.len() as u64;
        Ok(StripeTarget {
            name: name.to_string(),
            files,
            interleave_bytes,
            size_bytes,
            alignment,
        })
    }

    /// The pieces of `[offset, offset + length)`: (file, file offset,
    /// position in the request, length).
    fn pieces(&self, offset: u64, length: u64) -> Vec<(usize, u64, usize, u64)> {
        let columns = self.files.len() as u64;
        let mut pieces = Vec::new();
        let mut done = 0;
        while done < length {
            let at = offset + done;
            let unit = at / self.interleave_bytes;
            let within = at % self.interleave_bytes;
            let piece = (self.interleave_bytes - within).min(length - done);
            let file_offset = unit / columns * self.interleave_bytes + within;
            pieces.push(((unit % columns) as usize, file_offset, done as usize, piece));
            done += piece;
        }
        pieces
    }
}

impl Target for StripeTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn read(&self, offset: u64, length: u32) -> BoxFuture<'_, TargetResult<Bytes>> {
        let pieces = self.pieces(offset, u64::from(length));
        let reads: Vec<_> = pieces
            .iter()
            .map(|&(file, file_offset, _, piece)| {
                self.files[file].read(file_offset, aligned_buffer(piece as usize))
            })
            .collect();
        async move {
            let mut results = futures::future::join_all(reads).await;
            if results.len() == 1 {
                let (buffer, result) = results.remove(0);
                result?;
                return Ok(buffer.freeze());
            }
            let mut whole = aligned_buffer(length as usize);
            for ((buffer, result), &(_, _, at, piece)) in results.into_iter().zip(&pieces) {
                result?;
                whole[at..at + piece as usize].copy_from_slice(&buffer);
            }
            Ok(whole.freeze())
        }
        .boxed()
    }

    fn write(&self, offset: u64, data: Bytes) -> BoxFuture<'_, TargetResult<()>> {
        let writes: Vec<_> = self
            .pieces(offset, data.len() as u64)
            .into_iter()
            .map(|(file, file_offset, at, piece)| {
                let slice = data.slice(at..at + piece as usize);
                self.files[file].write(file_offset, slice, false)
            })
            .collect();
        async move {
            for result in futures::future::join_all(writes).await {
                result?;
            }
            Ok(())
        }
        .boxed()
    }

    fn flush(&self) -> BoxFuture<'_, TargetResult<()>> {
        let flushes: Vec<_> = self.files.iter().map(|file| file.flush()).collect();
        async move {
            for result in futures::future::join_all(flushes).await {
                result?;
            }
            Ok(())
        }
        .boxed()
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
        let spec = TargetSpec::parse("raw=/tmp/a.img,/tmp/b.img").expect("stripe");
        assert_eq!(spec.label, "raw");
        assert_eq!(
            spec.location,
            Location::Stripe(vec!["/tmp/a.img".into(), "/tmp/b.img".into()])
        );
        assert!(TargetSpec::parse("/tmp/a.img,").is_err());
        assert!(TargetSpec::parse("x=").is_err());
        assert!(TargetSpec::parse("http://host/disk").is_err());
    }
}

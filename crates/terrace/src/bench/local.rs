//! `engine:SPACE@DISK,DISK,...`: a space of a pool that `terrace bench`
//! imports itself, measured through the daemon's own request handling (its
//! read-ahead included) with no NBD transport in between: what the engine
//! costs, beside what a client of the daemon sees.
//!
//! The disks are claimed as the daemon claims them, so a pool a daemon
//! serves is refused until it is exported there. Each pool runs its job
//! runner and destaging while measured, and is closed cleanly when the
//! sweep ends (or fails); a benchmark killed before that leaves the pool
//! to the next import's crash recovery, as a daemon killed would.

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use terrace_bench::target::TargetResult;
use terrace_bench::{Target, TargetError};
use terrace_engine::io::{Env, SystemEnv};
use terrace_engine::{ImportOptions, Pool};
use terrace_export::Backend;

use crate::daemon::catalog::SpaceBackend;
use crate::daemon::registry::{expand_disks, open_for_import, start_pool_tasks, DiskPath};
use crate::CliError;

/// The prefix that names such a target.
pub const PREFIX: &str = "engine:";

/// `SPACE@DISK,DISK,...` after the prefix: the space and the pool's disks
/// (files, block devices, or folders of them).
pub fn parse(text: &str) -> Result<(String, Vec<PathBuf>), String> {
    let usage = || {
        format!(
            "{PREFIX}{text}: name a space and its pool's disks, as in \
             {PREFIX}vm@/d/a.img,/d/b.img or {PREFIX}vm@/d (a folder of disk files)"
        )
    };
    let (space, disks) = text.split_once('@').ok_or_else(usage)?;
    let disks: Vec<PathBuf> = disks.split(',').map(PathBuf::from).collect();
    if space.is_empty() || disks.iter().any(|disk| disk.as_os_str().is_empty()) {
        return Err(usage());
    }
    Ok((space.to_string(), disks))
}

/// The pools imported for a run, closed by [`LocalPools::close`].
#[derive(Default)]
pub struct LocalPools {
    pools: Vec<Arc<Pool>>,
}

impl LocalPools {
    /// Import the pool on `disks` (or use it, if an earlier target of the
    /// run did) and open `space` of it as a target labelled `label`.
    pub async fn open(
        &mut self,
        label: &str,
        space: &str,
        disks: &[PathBuf],
    ) -> Result<Box<dyn Target>, CliError> {
        let refuse = |why: String| CliError::Refused(format!("target {label}: {why}"));
        let pool = match self.find(space) {
            Some(pool) => pool,
            None => {
                let pool = Arc::new(import(disks).await.map_err(refuse)?);
                start_pool_tasks(&pool);
                self.pools.push(pool.clone());
                pool
            }
        };
        let space = pool.space(space).ok_or_else(|| {
            let names: Vec<String> = pool.spaces().iter().map(|s| s.name().to_string()).collect();
            refuse(format!(
                "pool {} has no space {space} (its spaces: {})",
                pool.name(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })?;
        Ok(Box::new(LocalSpace {
            label: label.to_string(),
            size_bytes: space.size_bytes(),
            backend: SpaceBackend::for_space(space),
        }))
    }

    fn find(&self, space: &str) -> Option<Arc<Pool>> {
        self.pools
            .iter()
            .find(|pool| pool.space(space).is_some())
            .cloned()
    }

    /// Close every pool cleanly; the first failure is returned after all
    /// were tried.
    pub async fn close(self) -> Result<(), CliError> {
        let mut first = Ok(());
        for pool in self.pools {
            if let Err(error) = pool.close().await {
                if first.is_ok() {
                    first = Err(CliError::Refused(format!(
                        "pool {}: close failed: {error}",
                        pool.name()
                    )));
                }
            }
        }
        first
    }
}

async fn import(disks: &[PathBuf]) -> Result<Pool, String> {
    let env: Arc<dyn Env> = Arc::new(SystemEnv::new());
    let requested: Vec<DiskPath> = disks
        .iter()
        .map(|path| DiskPath {
            path: path.display().to_string(),
            model: None,
        })
        .collect();
    let claimed = open_for_import(&expand_disks(&requested), &env).await;
    if let Some(busy) = claimed.busy.first() {
        return Err(busy.refusal());
    }
    if claimed.opened.is_empty() {
        return Err(format!(
            "none of {} could be opened",
            requested
                .iter()
                .map(|disk| disk.path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let devices = claimed
        .opened
        .into_iter()
        .map(|(_, device)| device)
        .collect();
    Pool::import(env, devices, ImportOptions::default())
        .await
        .map_err(|error| error.to_string())
}

/// A space through the daemon's backend.
struct LocalSpace {
    label: String,
    size_bytes: u64,
    backend: SpaceBackend,
}

fn failed(what: &str, errno: terrace_export::Errno) -> TargetError {
    TargetError::Other(format!("{what} failed: {errno:?}"))
}

impl Target for LocalSpace {
    fn name(&self) -> &str {
        &self.label
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset: u64, length: u32) -> BoxFuture<'_, TargetResult<bytes::Bytes>> {
        let read = self.backend.read(offset, length);
        async move { read.await.map_err(|errno| failed("read", errno)) }.boxed()
    }

    fn write(&self, offset: u64, data: bytes::Bytes) -> BoxFuture<'_, TargetResult<()>> {
        let write = self.backend.write(offset, data, false);
        async move { write.await.map_err(|errno| failed("write", errno)) }.boxed()
    }

    fn flush(&self) -> BoxFuture<'_, TargetResult<()>> {
        let flush = self.backend.flush();
        async move { flush.await.map_err(|errno| failed("flush", errno)) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_a_space_and_its_disks() {
        assert_eq!(
            parse("vm@/d/a.img,/d/b.img").unwrap(),
            (
                "vm".to_string(),
                vec![PathBuf::from("/d/a.img"), PathBuf::from("/d/b.img")]
            )
        );
        assert_eq!(
            parse("vm@/d").unwrap(),
            ("vm".to_string(), vec![PathBuf::from("/d")])
        );
        for bad in ["vm", "@/d", "vm@", "vm@/a,,/b"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

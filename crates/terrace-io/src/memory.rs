//! A drive held in memory: the fastest backend, used by unit tests, the
//! simulator and the engine benchmarks. Every operation completes at once;
//! `flush` has nothing to do because memory has no volatile cache of its own
//! (the crash wrapper models one on top).

use std::sync::RwLock;

use futures::future;

use crate::{check_range, BlockDevice, BoxFuture, Bytes, BytesMut, IoResult, Operation};

pub struct MemoryDevice {
    name: String,
    size_bytes: u64,
    image: RwLock<Vec<u8>>,
}

impl MemoryDevice {
    /// A zero-filled device. Large sizes cost nothing until written: the
    /// allocator hands out zero pages lazily.
    pub fn new(name: impl Into<String>, size_bytes: u64) -> Self {
        Self::from_image(name, vec![0; size_bytes as usize])
    }

    /// A device whose contents are `image` (e.g. a crash image).
    pub fn from_image(name: impl Into<String>, image: Vec<u8>) -> Self {
        MemoryDevice {
            name: name.into(),
            size_bytes: image.len() as u64,
            image: RwLock::new(image),
        }
    }

    /// A copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.image.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Copy `length` bytes at `offset` out synchronously (tests, crash wrapper).
    pub fn read_sync(&self, offset: u64, length: usize) -> Vec<u8> {
        let image = self.image.read().unwrap_or_else(|e| e.into_inner());
        image[offset as usize..offset as usize + length].to_vec()
    }

    /// Store `data` at `offset` synchronously (tests, crash wrapper).
    pub fn write_sync(&self, offset: u64, data: &[u8]) {
        let mut image = self.image.write().unwrap_or_else(|e| e.into_inner());
        image[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    fn check(&self, operation: Operation, offset: u64, length: u64) -> IoResult<()> {
        check_range(&self.name, operation, offset, length, self.size_bytes)
    }
}

impl BlockDevice for MemoryDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn alignment(&self) -> u64 {
        1
    }

    /// No cache to empty: FUA changes nothing.
    fn cheap_fua(&self) -> bool {
        true
    }

    fn read(&self, offset: u64, mut buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        let result = self
            .check(Operation::Read, offset, buf.len() as u64)
            .map(|()| {
                let image = self.image.read().unwrap_or_else(|e| e.into_inner());
                let start = offset as usize;
                let end = start + buf.len();
                buf.copy_from_slice(&image[start..end]);
            });
        Box::pin(future::ready((buf, result)))
    }

    fn write(&self, offset: u64, data: Bytes, _fua: bool) -> BoxFuture<IoResult<()>> {
        let result = self
            .check(Operation::Write, offset, data.len() as u64)
            .map(|()| self.write_sync(offset, &data));
        Box::pin(future::ready(result))
    }

    fn write_zeroes(&self, offset: u64, length: u64, _fua: bool) -> BoxFuture<IoResult<()>> {
        let result = self
            .check(Operation::WriteZeroes, offset, length)
            .map(|()| {
                let mut image = self.image.write().unwrap_or_else(|e| e.into_inner());
                image[offset as usize..(offset + length) as usize].fill(0);
            });
        Box::pin(future::ready(result))
    }

    fn flush(&self) -> BoxFuture<IoResult<()>> {
        Box::pin(future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    #[test]
    fn reads_back_writes_and_zeroes() {
        let device = MemoryDevice::new("memory:0", 64 * 1024);
        block_on(device.write(4096, Bytes::from(vec![7u8; 8192]), false)).unwrap();
        let (buf, result) = block_on(device.read(4096, BytesMut::zeroed(8192)));
        result.unwrap();
        assert!(buf.iter().all(|&b| b == 7));
        block_on(device.write_zeroes(8192, 4096, false)).unwrap();
        assert_eq!(device.read_sync(8192, 4096), vec![0u8; 4096]);
        assert_eq!(device.read_sync(4096, 4096), vec![7u8; 4096]);
    }

    #[test]
    fn rejects_out_of_range() {
        let device = MemoryDevice::new("memory:0", 4096);
        let (_, result) = block_on(device.read(4096, BytesMut::zeroed(1)));
        assert!(result.is_err());
        assert!(block_on(device.write(1, Bytes::from(vec![0; 4096]), false)).is_err());
    }
}

//! A pool's view of one disk at run time.
//!
//! The data path asks a disk two things: "may I use you?" (one atomic load)
//! and "do this I/O". The first error of a disk latches it failed (the
//! [`LatchedDevice`] underneath refuses further I/O); the pool then records
//! the failure in a metadata commit before any write that saw it is
//! acknowledged (see [`crate::pool`]).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use terrace_io::latch::LatchedDevice;
use terrace_io::{BlockDevice, Bytes, BytesMut, Env, IoResult};
use terrace_meta::{DiskIndex, Label};

/// Run-time condition of a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    Online = 0,
    /// An I/O error latched it, or the metadata says failed.
    Failed = 1,
    /// Not present (not found at import, or vanished).
    Missing = 2,
    /// Present but not serving (stale copy, removed, retired hot spare...).
    Standby = 3,
}

impl Condition {
    fn from_u8(value: u8) -> Condition {
        match value {
            0 => Condition::Online,
            1 => Condition::Failed,
            2 => Condition::Missing,
            _ => Condition::Standby,
        }
    }
}

pub struct Disk {
    pub index: DiskIndex,
    device: Option<Arc<LatchedDevice>>,
    label: Option<Label>,
    condition: AtomicU8,
    reason: Mutex<String>,
    /// The pool's count of failures observed, bumped when this disk fails,
    /// so requests know a metadata commit must precede their completion.
    failures_observed: Arc<AtomicU64>,
    env: Arc<dyn Env>,
    /// Moving average of read and write service times, in microseconds
    /// (weight 1/16 per operation): how `pool status` spots a slow disk.
    latency_us: AtomicU64,
}

/// What every disk of a pool shares.
#[derive(Clone)]
pub struct DiskContext {
    pub failures_observed: Arc<AtomicU64>,
    pub env: Arc<dyn Env>,
}

impl Disk {
    pub fn present(
        index: DiskIndex,
        device: Arc<dyn BlockDevice>,
        label: Label,
        context: DiskContext,
    ) -> Disk {
        Disk {
            failures_observed: context.failures_observed,
            env: context.env,
            latency_us: AtomicU64::new(0),
            index,
            device: Some(Arc::new(LatchedDevice::new(device))),
            label: Some(label),
            condition: AtomicU8::new(Condition::Online as u8),
            reason: Mutex::new(String::new()),
        }
    }

    pub fn absent(index: DiskIndex, reason: impl Into<String>, context: DiskContext) -> Disk {
        Disk {
            failures_observed: context.failures_observed,
            env: context.env,
            latency_us: AtomicU64::new(0),
            index,
            device: None,
            label: None,
            condition: AtomicU8::new(Condition::Missing as u8),
            reason: Mutex::new(reason.into()),
        }
    }

    pub fn condition(&self) -> Condition {
        Condition::from_u8(self.condition.load(Ordering::Acquire))
    }

    pub fn is_online(&self) -> bool {
        self.condition() == Condition::Online
    }

    pub fn reason(&self) -> String {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn label(&self) -> Option<&Label> {
        self.label.as_ref()
    }

    pub fn device_name(&self) -> Option<&str> {
        self.device.as_ref().map(|device| device.name())
    }

    pub fn device(&self) -> Option<&Arc<LatchedDevice>> {
        self.device.as_ref()
    }

    /// Take the disk out of service with a reason (first reason wins).
    pub fn set_condition(&self, condition: Condition, reason: impl Into<String>) {
        let previous = self.condition.swap(condition as u8, Ordering::AcqRel);
        if previous == Condition::Online as u8 || condition == Condition::Online {
            *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason.into();
        }
        if condition == Condition::Failed {
            if let Some(device) = &self.device {
                device.fail(self.reason());
            }
        }
        if previous != condition as u8 {
            self.failures_observed.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn on_error<T>(&self, result: IoResult<T>) -> Result<T, String> {
        result.map_err(|error| {
            let message = error.to_string();
            if self.is_online() {
                self.set_condition(Condition::Failed, message.clone());
            }
            message
        })
    }

    fn online_device(&self) -> Result<&Arc<LatchedDevice>, String> {
        match (&self.device, self.condition()) {
            (Some(device), Condition::Online) => Ok(device),
            _ => Err(format!("disk {} is {:?}", self.index.0, self.condition())),
        }
    }

    pub async fn read(&self, offset: u64, buf: BytesMut) -> (BytesMut, Result<(), String>) {
        let device = match self.online_device() {
            Ok(device) => device,
            Err(error) => return (buf, Err(error)),
        };
        let started = self.env.now_ns();
        let (buf, result) = device.read(offset, buf).await;
        self.note_latency(started);
        (buf, self.on_error(result))
    }

    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), String> {
        let device = self.online_device()?;
        let started = self.env.now_ns();
        let result = device.write(offset, data, fua).await;
        self.note_latency(started);
        self.on_error(result)
    }

    fn note_latency(&self, started_ns: u64) {
        let sample = self.env.now_ns().saturating_sub(started_ns) / 1000;
        let _ = self
            .latency_us
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |average| {
                Some(if average == 0 {
                    sample
                } else {
                    average - average / 16 + sample / 16
                })
            });
    }

    /// Moving average of service times, in microseconds.
    pub fn latency_us(&self) -> u64 {
        self.latency_us.load(Ordering::Acquire)
    }

    pub async fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> Result<(), String> {
        let device = self.online_device()?;
        self.on_error(device.write_zeroes(offset, length, fua).await)
    }

    pub async fn flush(&self) -> Result<(), String> {
        let device = self.online_device()?;
        self.on_error(device.flush().await)
    }
}

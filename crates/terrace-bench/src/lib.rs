//! The terrace benchmark: the white paper's standard load profiles, swept
//! over the number of outstanding I/Os, against any number of targets.
//!
//! ```text
//!   Sweep (sweep.rs)      targets × profiles × outstanding I/Os, progress bar
//!     ├─ prefill.rs       random data over the working set, once per target
//!     └─ runner.rs        one point: N requests always in flight, warm-up,
//!          │              measured interval, latency histogram, CPU time
//!          └─ Target      NbdTarget · FileTarget · StripeTarget (targets.rs);
//!                         the terrace command adds spaces imported in process
//!   Report (report.rs)    points + machine + settings → table.rs (terminal),
//!                         serde JSON, plot.rs (one SVG per profile)
//! ```
//!
//! # How a point is measured
//!
//! The runner keeps exactly `outstanding` requests in flight from one task:
//! when one completes the next is issued at once, in the same poll. Offsets
//! come from a seeded generator, so a run can be repeated exactly. Each
//! request's latency goes into a log-bucketed histogram (1.6 % resolution);
//! I/Os, bytes and time are counted only for completions inside the measured
//! interval, which starts after the warm-up. CPU time is the whole machine's
//! (see [`cpu`]), divided by the I/Os completed.
//!
//! Throughput is in MB/s with MB = 10^6 bytes, as in the white paper, so
//! MB/s = IO/s × block bytes / 10^6.
//!
//! # Keeping the generator out of the way
//!
//! The generator is meant to run on a single-threaded tokio runtime
//! (`current_thread`): its work per request is a few hundred nanoseconds,
//! and a wake-up that crosses threads costs more than that. Its NBD client
//! ([`nbd`]) sends every request issued in one poll with one system call
//! and reads replies through a buffer, many per call.

pub mod cpu;
pub mod histogram;
pub mod machine;
pub mod nbd;
pub mod plot;
pub mod prefill;
pub mod profile;
pub mod report;
pub mod runner;
pub mod sweep;
pub mod table;
pub mod target;
pub mod targets;
pub mod units;

pub use profile::{Access, Profile, ProfileError};
pub use report::{Point, Report};
pub use runner::{run_point, RunOptions, SequentialMode};
pub use sweep::{sweep, sweep_settled, Settle, SweepConfig, DEFAULT_DEPTHS};
pub use target::{Target, TargetError};
pub use targets::{FileTarget, NbdTarget, StripeTarget, TargetSpec};

/// Why a benchmark could not run or could not write its results.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Profile(#[from] ProfileError),
    #[error("target {target}: {source}")]
    Target {
        target: String,
        #[source]
        source: TargetError,
    },
    #[error("target {target}: {reason}")]
    WorkingSet { target: String, reason: String },
    #[error("target {target}: no request completed for {seconds} s; is the target alive?")]
    Stalled { target: String, seconds: u64 },
    #[error("{0}")]
    Settings(String),
    #[error("{path}: {source}")]
    Output {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("plot for profile {profile}: {reason}")]
    Plot { profile: String, reason: String },
}

impl BenchError {
    pub(crate) fn target(target: &dyn Target, source: TargetError) -> BenchError {
        BenchError::Target {
            target: target.name().to_string(),
            source,
        }
    }
}

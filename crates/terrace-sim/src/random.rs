//! The simulator's only source of randomness: the project's SplitMix64,
//! seeded.

pub use terrace_engine::io::random::SplitMix64 as Random;

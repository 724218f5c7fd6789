//! Decoding metadata, labels and slot headers from arbitrary bytes never
//! panics, and whatever decodes re-encodes to the same value.
//!
//! Run: `cargo install cargo-fuzz && cd fuzz && cargo +nightly fuzz run metadata`

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    terrace_meta::fuzzing::decode_anything(data);
});

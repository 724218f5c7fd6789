//! The body of the metadata fuzz target (`fuzz/fuzz_targets/metadata.rs`),
//! kept here so the test suite can run it too.
//!
//! Whatever the bytes, decoding must not panic, and anything that decodes
//! must encode back to bytes that decode to the same value.

use crate::codec;
use crate::format::{Label, SlotHeader, METADATA_SLOT_MIN_BYTES};

pub fn decode_anything(data: &[u8]) {
    if let Ok(metadata) = codec::decode(data) {
        let again = codec::decode(&codec::encode(&metadata)).expect("re-encoded metadata decodes");
        assert_eq!(again, metadata);
    }
    if let Ok(label) = Label::decode(data) {
        assert_eq!(
            Label::decode(&label.encode()).expect("re-encoded label decodes"),
            label
        );
    }
    if let Ok(header) = SlotHeader::decode(data, METADATA_SLOT_MIN_BYTES) {
        let again = SlotHeader::decode(&header.encode(), METADATA_SLOT_MIN_BYTES)
            .expect("re-encoded header decodes");
        assert_eq!(again, header);
    }
}

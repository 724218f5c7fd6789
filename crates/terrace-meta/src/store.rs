//! Reading and writing labels and metadata slots on a device.
//!
//! # Crash ordering of a commit
//!
//! A commit of generation `g` writes slot `g mod 2` on every member disk and
//! then flushes each one. Until the flush returns, the slot may be torn on
//! any disk; the other slot still holds `g - 1`, whose flush completed
//! before `g` was started (commits are serialised by the pool). So at every
//! instant each member disk holds a complete `g - 1` or `g`, and import
//! ([`crate::quorum`]) picks the newest generation a majority holds.
//!
//! The write intent's slots ([`IntentRecord`]) alternate the same way, by
//! their own sequence: record `s` goes to slot `s mod 2` of every member
//! disk and is flushed before the writes it names begin.

use terrace_io::{aligned_buffer, BlockDevice, Bytes, IoError, DIRECT_IO_ALIGNMENT};

use crate::codec;
use crate::format::{
    intent_offset, slot_offset, IntentError, IntentRecord, Label, LabelError, SlotError,
    SlotHeader, INTENT_SLOT_BYTES, LABEL_BYTES, SLOT_HEADER_BYTES, SLOT_VERSION,
};
use crate::model::PoolMetadata;

/// What a device holds, as far as pools are concerned.
#[derive(Debug)]
pub enum Probe {
    /// No terrace label: free to use.
    Blank,
    /// A member of a pool, with whatever metadata slots are readable.
    Member {
        label: Label,
        slots: Box<[Result<PoolMetadata, SlotError>; 2]>,
    },
    /// Carries our magic but the label is damaged: refuse and leave alone.
    Damaged(LabelError),
    /// Could not be read at all.
    Unreadable(IoError),
}

impl Probe {
    /// Valid metadata copies, newest first.
    pub fn generations(&self) -> Vec<&PoolMetadata> {
        let mut found: Vec<&PoolMetadata> = match self {
            Probe::Member { slots, .. } => {
                slots.iter().filter_map(|slot| slot.as_ref().ok()).collect()
            }
            _ => Vec::new(),
        };
        found.sort_by_key(|metadata| std::cmp::Reverse(metadata.generation));
        found
    }
}

/// Read the label and both metadata slots of `device`.
pub async fn probe(device: &dyn BlockDevice) -> Probe {
    if device.size_bytes() < LABEL_BYTES as u64 {
        return Probe::Blank;
    }
    let label = match read_label(device).await {
        Err(error) => return Probe::Unreadable(error),
        Ok(Ok(label)) => label,
        Ok(Err(LabelError::Blank)) => return Probe::Blank,
        Ok(Err(error)) => return Probe::Damaged(error),
    };
    if device.size_bytes() < label.data_offset {
        return Probe::Damaged(LabelError::Inconsistent {
            field: "device size (the device is smaller than its label says)",
            value: device.size_bytes(),
        });
    }
    let first = read_slot(device, &label, 0).await;
    let second = read_slot(device, &label, 1).await;
    Probe::Member {
        label,
        slots: Box::new([first, second]),
    }
}

/// Read and decode the label of `device` (the caller made sure the device
/// is at least a label long).
pub async fn read_label(device: &dyn BlockDevice) -> Result<Result<Label, LabelError>, IoError> {
    let (block, result) = device.read(0, aligned_buffer(LABEL_BYTES)).await;
    result?;
    Ok(Label::decode(&block))
}

/// Write a label (once, when a disk joins a pool) and make it durable.
/// The intent slots are zeroed with it: a disk that was in the same pool
/// before must not bring its old records back.
pub async fn write_label(device: &dyn BlockDevice, label: &Label) -> Result<(), IoError> {
    let mut block = aligned_buffer(LABEL_BYTES);
    block.copy_from_slice(&label.encode());
    device.write(0, block.freeze(), false).await?;
    let slots = aligned_buffer(2 * INTENT_SLOT_BYTES as usize);
    device
        .write(intent_offset(0), slots.freeze(), false)
        .await?;
    device.flush().await
}

/// Erase a label so the device is blank again (pool destroy).
pub async fn erase_label(device: &dyn BlockDevice) -> Result<(), IoError> {
    device
        .write(0, aligned_buffer(LABEL_BYTES).freeze(), false)
        .await?;
    device.flush().await
}

/// Encode `metadata` as the bytes of one slot (header, payload, zero padding
/// to the I/O granularity). Fails, before any I/O, if it does not fit.
pub fn encode_slot(metadata: &PoolMetadata, slot_bytes: u64) -> Result<Bytes, SlotError> {
    let payload = codec::encode(metadata);
    let header = SlotHeader {
        version: SLOT_VERSION,
        pool_id: metadata.pool_id,
        generation: metadata.generation,
        payload_bytes: payload.len() as u64,
        payload_checksum: crc32c::crc32c(&payload),
    };
    let total = SLOT_HEADER_BYTES + payload.len();
    if total as u64 > slot_bytes {
        return Err(SlotError::Oversized {
            payload_bytes: payload.len() as u64,
            slot_bytes,
        });
    }
    let mut buffer = aligned_buffer(total.next_multiple_of(DIRECT_IO_ALIGNMENT));
    buffer[..SLOT_HEADER_BYTES].copy_from_slice(&header.encode());
    buffer[SLOT_HEADER_BYTES..total].copy_from_slice(&payload);
    Ok(buffer.freeze())
}

/// Write an encoded slot for `generation` and flush: when this returns Ok
/// the generation is durable on this device.
pub async fn write_slot(
    device: &dyn BlockDevice,
    label: &Label,
    generation: u64,
    encoded: Bytes,
) -> Result<(), IoError> {
    let offset = slot_offset(label.metadata_slot_bytes, generation % 2);
    device.write(offset, encoded, false).await?;
    device.flush().await
}

/// Encode a write-intent record once, in a buffer every disk's write can
/// share. Fails, before any I/O, if it does not fit a slot.
pub fn encode_intent(record: &IntentRecord) -> Result<Bytes, IntentError> {
    let encoded = record.encode()?;
    let mut buffer = aligned_buffer(encoded.len());
    buffer.copy_from_slice(&encoded);
    Ok(buffer.freeze())
}

/// Write an encoded write-intent record (see [`encode_intent`]) of
/// `sequence` and flush: when this returns Ok it is durable on this device.
pub async fn write_intent(
    device: &dyn BlockDevice,
    sequence: u64,
    encoded: Bytes,
) -> Result<(), IoError> {
    device
        .write(intent_offset(sequence % 2), encoded, false)
        .await?;
    device.flush().await
}

/// The newest whole write-intent record of `label`'s pool that `device`
/// holds (a torn, unreadable or blank slot gives nothing; a torn newest
/// record leaves the one before it).
pub async fn read_intent(device: &dyn BlockDevice, label: &Label) -> Option<IntentRecord> {
    let mut newest: Option<IntentRecord> = None;
    for slot in 0..2 {
        let (bytes, result) = device
            .read(
                intent_offset(slot),
                aligned_buffer(INTENT_SLOT_BYTES as usize),
            )
            .await;
        if result.is_err() {
            continue;
        }
        let Ok(record) = IntentRecord::decode(&bytes) else {
            continue;
        };
        if record.pool_id == label.pool_id
            && newest.as_ref().is_none_or(|n| n.sequence < record.sequence)
        {
            newest = Some(record);
        }
    }
    newest
}

async fn read_slot(
    device: &dyn BlockDevice,
    label: &Label,
    slot: u64,
) -> Result<PoolMetadata, SlotError> {
    let offset = slot_offset(label.metadata_slot_bytes, slot);
    let (first, result) = device
        .read(offset, aligned_buffer(DIRECT_IO_ALIGNMENT))
        .await;
    result.map_err(|source| SlotError::Unreadable { source })?;
    let header = SlotHeader::decode(&first, label.metadata_slot_bytes)?;
    if header.pool_id != label.pool_id {
        return Err(SlotError::WrongPool {
            found: header.pool_id,
            expected: label.pool_id,
        });
    }
    let total = (SLOT_HEADER_BYTES as u64 + header.payload_bytes)
        .next_multiple_of(DIRECT_IO_ALIGNMENT as u64);
    let whole = if total as usize <= first.len() {
        first
    } else {
        let (whole, result) = device.read(offset, aligned_buffer(total as usize)).await;
        result.map_err(|source| SlotError::Unreadable { source })?;
        whole
    };
    let payload = &whole[SLOT_HEADER_BYTES..SLOT_HEADER_BYTES + header.payload_bytes as usize];
    if crc32c::crc32c(payload) != header.payload_checksum {
        return Err(SlotError::PayloadChecksum);
    }
    let metadata = codec::decode_version(payload, header.version)
        .map_err(|source| SlotError::Payload { source })?;
    if metadata.generation != header.generation {
        return Err(SlotError::GenerationMismatch {
            header: header.generation,
            payload: metadata.generation,
        });
    }
    if metadata.pool_id != label.pool_id {
        return Err(SlotError::WrongPool {
            found: metadata.pool_id,
            expected: label.pool_id,
        });
    }
    Ok(metadata)
}

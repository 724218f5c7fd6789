//! Encoding of the pool's operating state in the metadata payload: settings,
//! jobs (with their moves and watermarks) and dirty-extent records. It
//! follows the spaces; byte tables in `docs/ON_DISK_FORMAT.md`.

use std::collections::BTreeSet;

use crate::codec::{DecodeError, Reader, Writer};
use crate::ids::{DiskIndex, SlabIndex, SlabRef, SpaceId};
use crate::model::{
    DirtyRecord, DiskRecord, JobKind, JobRecord, JobState, MoveRecord, PoolSettings, Provisioning,
    RepairPolicy, RetireMissing, SpaceRecord,
};

/// Smallest encoded job (fixed fields, empty reason, no moves).
pub const JOB_MIN_BYTES: usize = 8 + 5 + 1 + 2 + 8 * 4 + 4;
/// An encoded move.
pub const MOVE_BYTES: usize = 8 + 4 + 2 + 6 + 8 + 1;
/// An encoded dirty extent.
pub const DIRTY_EXTENT_BYTES: usize = 8 + 4;

pub(crate) fn encode(
    writer: &mut Writer,
    settings: &PoolSettings,
    next_job_id: u64,
    jobs: &[JobRecord],
    dirty: &[DirtyRecord],
    intent: &[(SpaceId, u32)],
    version: u32,
) {
    writer.u8(match settings.retire_missing {
        RetireMissing::Never => 0,
        RetireMissing::Always => 1,
        RetireMissing::Auto => 2,
    });
    writer.u8(match settings.repair_policy {
        RepairPolicy::Parallel => 0,
        RepairPolicy::Sequential => 1,
    });
    writer.u64(settings.repair_rate_bytes_per_second);
    writer.u64(next_job_id);
    writer.u32(jobs.len() as u32);
    for job in jobs {
        encode_job(writer, job, version);
    }
    writer.u16(dirty.len() as u16);
    for record in dirty {
        writer.u16(record.disk.0);
        writer.u32(record.extents.len() as u32);
        for (space, extent) in &record.extents {
            writer.u64(space.0);
            writer.u32(*extent);
        }
    }
    writer.u32(intent.len() as u32);
    for (space, extent) in intent {
        writer.u64(space.0);
        writer.u32(*extent);
    }
    if version >= 5 {
        writer.u32(settings.error_limit);
        writer.u32(settings.error_window_secs);
        writer.u64(settings.scrub_interval_secs);
        writer.u64(settings.scrub_last_ns);
    }
    if version >= 6 {
        writer.u8(match settings.provisioning {
            Provisioning::Fixed => 0,
            Provisioning::Thin => 1,
        });
        for percent in settings.alert_percents {
            writer.u8(percent);
        }
    }
}

fn encode_job(writer: &mut Writer, job: &JobRecord, version: u32) {
    writer.u64(job.id);
    let (code, first, second) = match job.kind {
        JobKind::Repair { disk } => (0, disk, disk),
        JobKind::Evacuate { disk } => (1, disk, disk),
        JobKind::Replace { old, new } => (2, old, new),
        JobKind::Resync { disk } => (3, disk, disk),
        JobKind::LogsToJournal => (4, DiskIndex(0), DiskIndex(0)),
        JobKind::Scrub => (5, DiskIndex(0), DiskIndex(0)),
    };
    writer.u8(code);
    writer.u16(first.0);
    writer.u16(second.0);
    writer.u8(match job.state {
        JobState::Running => 0,
        JobState::Paused => 1,
        JobState::Done => 2,
        JobState::Cancelled => 3,
        JobState::Failed => 4,
    });
    writer.text(&job.reason);
    writer.u64(job.created_ns);
    writer.u64(job.finished_ns);
    writer.u64(job.bytes_total);
    writer.u64(job.bytes_done);
    writer.u32(job.moves.len() as u32);
    for step in &job.moves {
        writer.u64(step.space.0);
        writer.u32(step.extent);
        writer.u16(step.slot);
        writer.u16(step.target.disk.0);
        writer.u32(step.target.slab.0);
        writer.u64(step.watermark_rows);
        writer.u8(u8::from(step.done));
    }
    writer.u32(job.folded_moves);
    writer.u32(job.folded_moves_done);
    if version >= 5 {
        writer.u64(job.cursor);
        writer.u64(job.repaired);
        writer.u64(job.unrepaired);
    }
}

/// What the decoder checks references against.
pub(crate) struct Known<'a> {
    pub disks: &'a [DiskRecord],
    pub spaces: &'a [SpaceRecord],
    pub slab_bytes: u64,
}

pub(crate) type State = (
    PoolSettings,
    u64,
    Vec<JobRecord>,
    Vec<DirtyRecord>,
    Vec<(SpaceId, u32)>,
);

pub(crate) fn decode(
    reader: &mut Reader,
    known: &Known,
    used: &mut BTreeSet<SlabRef>,
    version: u32,
) -> Result<State, DecodeError> {
    let retire_missing = match reader.u8("retire missing")? {
        0 => RetireMissing::Never,
        1 => RetireMissing::Always,
        2 => RetireMissing::Auto,
        code => {
            return Err(DecodeError::BadCode {
                field: "retire missing",
                code,
            })
        }
    };
    let repair_policy = match reader.u8("repair policy")? {
        0 => RepairPolicy::Parallel,
        1 => RepairPolicy::Sequential,
        code => {
            return Err(DecodeError::BadCode {
                field: "repair policy",
                code,
            })
        }
    };
    let mut settings = PoolSettings {
        retire_missing,
        repair_policy,
        repair_rate_bytes_per_second: reader.u64("repair rate")?,
        ..PoolSettings::default()
    };
    let next_job_id = reader.u64("next job id")?;
    let job_count = reader.u32("job count")? as usize;
    let job_count = reader.count_of("jobs", job_count, JOB_MIN_BYTES)?;
    let mut jobs = Vec::with_capacity(job_count);
    for _ in 0..job_count {
        jobs.push(decode_job(reader, known, used, version)?);
    }
    let dirty_count = usize::from(reader.u16("dirty count")?);
    let dirty_count = reader.count_of("dirty records", dirty_count, 6)?;
    let mut dirty = Vec::with_capacity(dirty_count);
    for _ in 0..dirty_count {
        let disk = DiskIndex(reader.u16("dirty disk")?);
        check_disk(known, disk)?;
        let count = reader.u32("dirty extent count")? as usize;
        let count = reader.count_of("dirty extents", count, DIRTY_EXTENT_BYTES)?;
        let mut extents = Vec::with_capacity(count);
        for _ in 0..count {
            extents.push((
                SpaceId(reader.u64("dirty space")?),
                reader.u32("dirty extent")?,
            ));
        }
        dirty.push(DirtyRecord { disk, extents });
    }
    // The write-intent list came last and later: metadata written before it
    // ends here and has none.
    let mut intent = Vec::new();
    if reader.remaining() > 0 {
        let count = reader.u32("intent count")? as usize;
        let count = reader.count_of("intent extents", count, DIRTY_EXTENT_BYTES)?;
        for _ in 0..count {
            intent.push((
                SpaceId(reader.u64("intent space")?),
                reader.u32("intent extent")?,
            ));
        }
    }
    // Slot format 5 added the error and scrub settings after the intent.
    if version >= 5 {
        settings.error_limit = reader.u32("error limit")?;
        settings.error_window_secs = reader.u32("error window")?;
        settings.scrub_interval_secs = reader.u64("scrub interval")?;
        settings.scrub_last_ns = reader.u64("last scrub")?;
    }
    // Slot format 6 added the default provisioning after them.
    if version >= 6 {
        settings.provisioning = match reader.u8("default provisioning")? {
            0 => Provisioning::Fixed,
            1 => Provisioning::Thin,
            code => {
                return Err(DecodeError::BadCode {
                    field: "default provisioning",
                    code,
                })
            }
        };
        for percent in &mut settings.alert_percents {
            *percent = reader.u8("alert percent")?;
        }
    }
    Ok((settings, next_job_id, jobs, dirty, intent))
}

fn check_disk(known: &Known, disk: DiskIndex) -> Result<(), DecodeError> {
    if usize::from(disk.0) < known.disks.len() {
        Ok(())
    } else {
        Err(DecodeError::NoSuchDisk { disk: disk.0 })
    }
}

fn decode_kind(reader: &mut Reader, known: &Known) -> Result<JobKind, DecodeError> {
    let code = reader.u8("job kind")?;
    let first = DiskIndex(reader.u16("job disk")?);
    let second = DiskIndex(reader.u16("job second disk")?);
    check_disk(known, first)?;
    check_disk(known, second)?;
    match code {
        0 => Ok(JobKind::Repair { disk: first }),
        1 => Ok(JobKind::Evacuate { disk: first }),
        2 => Ok(JobKind::Replace {
            old: first,
            new: second,
        }),
        3 => Ok(JobKind::Resync { disk: first }),
        4 => Ok(JobKind::LogsToJournal),
        5 => Ok(JobKind::Scrub),
        code => Err(DecodeError::BadCode {
            field: "job kind",
            code,
        }),
    }
}

fn decode_job(
    reader: &mut Reader,
    known: &Known,
    used: &mut BTreeSet<SlabRef>,
    version: u32,
) -> Result<JobRecord, DecodeError> {
    let id = reader.u64("job id")?;
    let kind = decode_kind(reader, known)?;
    let state = match reader.u8("job state")? {
        0 => JobState::Running,
        1 => JobState::Paused,
        2 => JobState::Done,
        3 => JobState::Cancelled,
        4 => JobState::Failed,
        code => {
            return Err(DecodeError::BadCode {
                field: "job state",
                code,
            })
        }
    };
    let mut job = JobRecord {
        id,
        kind,
        state,
        reason: reader.text("job reason")?,
        created_ns: reader.u64("job created")?,
        finished_ns: reader.u64("job finished")?,
        bytes_total: reader.u64("job bytes total")?,
        bytes_done: reader.u64("job bytes done")?,
        moves: Vec::new(),
        folded_moves: 0,
        folded_moves_done: 0,
        cursor: 0,
        repaired: 0,
        unrepaired: 0,
    };
    let count = reader.u32("move count")? as usize;
    let count = reader.count_of("moves", count, MOVE_BYTES)?;
    for _ in 0..count {
        let step = decode_move(reader, known)?;
        // A resync's target is the slot's own slab, already counted.
        let in_place = matches!(job.kind, JobKind::Resync { .. });
        if job.is_active() && !step.done && !in_place && !used.insert(step.target) {
            return Err(DecodeError::SlabReused { slab: step.target });
        }
        job.moves.push(step);
    }
    if version >= 2 {
        job.folded_moves = reader.u32("folded moves")?;
        job.folded_moves_done = reader.u32("folded moves done")?;
        if job.folded_moves_done > job.folded_moves {
            return Err(DecodeError::FoldedMoves {
                job: job.id,
                done: job.folded_moves_done,
                total: job.folded_moves,
            });
        }
    }
    if version >= 5 {
        job.cursor = reader.u64("job cursor")?;
        job.repaired = reader.u64("job repaired")?;
        job.unrepaired = reader.u64("job unrepaired")?;
    }
    Ok(job)
}

fn decode_move(reader: &mut Reader, known: &Known) -> Result<MoveRecord, DecodeError> {
    let step = MoveRecord {
        space: SpaceId(reader.u64("move space")?),
        extent: reader.u32("move extent")?,
        slot: reader.u16("move slot")?,
        target: SlabRef {
            disk: DiskIndex(reader.u16("move disk")?),
            slab: SlabIndex(reader.u32("move slab")?),
        },
        watermark_rows: reader.u64("move watermark")?,
        done: reader.u8("move done")? != 0,
    };
    let exists = known
        .disks
        .get(usize::from(step.target.disk.0))
        .is_some_and(|disk| step.target.slab.0 < disk.slab_count);
    if !exists {
        return Err(DecodeError::SlabOutOfRange {
            space: step.space.0,
            slab: step.target,
        });
    }
    if let Some(space) = known.spaces.iter().find(|s| s.id == step.space) {
        let slots = space
            .geometry(known.slab_bytes)
            .map_or(0, |g| g.slots_per_extent());
        if step.extent as usize >= space.extents.len() || u32::from(step.slot) >= slots {
            return Err(DecodeError::BadMove {
                space: step.space.0,
            });
        }
    }
    Ok(step)
}

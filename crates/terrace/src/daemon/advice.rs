//! What the CLI adds to an engine error, or to a job's reason: the engine
//! says what is wrong, in its own terms; which flag or command would help
//! is the CLI's to say, so it is said here, once, for every answer that
//! carries the error or the job.

use std::any::Any;
use std::fmt::Display;

use terrace_engine::{ClearRefusal, EngineError, JobStatus, CLEARED_BACK, LARGEST_FIT};

use crate::api::non_empty;

/// `message` as the user reads it: an engine error with the advice that
/// goes with it, anything else as it is.
pub(super) fn advised(message: &(impl Display + Any)) -> String {
    let any: &dyn Any = message;
    match any.downcast_ref::<EngineError>() {
        Some(error) => {
            // The largest space that fits is what `--max` asks for.
            let text = match error {
                EngineError::NoCapacity { .. } => error
                    .to_string()
                    .replace(&format!("({LARGEST_FIT})"), "(--max)"),
                _ => error.to_string(),
            };
            match advice(error) {
                Some(advice) => format!("{text}{advice}"),
                None => text,
            }
        }
        None => message.to_string(),
    }
}

/// A disk's reason as the user reads it (none if it has none): a failed
/// disk that is present again names the command that takes it back.
pub(super) fn disk_reason(reason: &str, pool: &str) -> Option<String> {
    let reason = non_empty(reason)?;
    Some(if reason.ends_with(CLEARED_BACK) {
        format!("{reason} (`terrace pool clear {pool}`)")
    } else {
        reason
    })
}

fn advice(error: &EngineError) -> Option<&'static str> {
    match error {
        EngineError::NoCapacityDisks { .. } => Some(
            ". To give one disk its own usage, write it after the disk (for example \
             ssd.img,usage=journal) instead of --usage, which sets every disk's",
        ),
        EngineError::MetadataRoom { .. } => {
            Some("; use larger slabs, or a pool created with a larger --metadata-slot")
        }
        EngineError::NotCleared {
            why: ClearRefusal::NotPresent { .. },
            ..
        } => Some(", or add it with `terrace disk add`"),
        _ => None,
    }
}

/// `job`'s reason as the user reads it (none if it has none): a repair
/// waiting for the disks its extents lost names the command that takes
/// them back.
pub(super) fn job_reason(job: &JobStatus) -> Option<String> {
    let reason = non_empty(&job.reason)?;
    Some(if job.waits_for_lost_disks() {
        format!("{reason} (`terrace pool clear`)")
    } else {
        reason
    })
}

#[cfg(test)]
mod tests {
    use terrace_engine::meta::{DiskIndex, JobKind, JobState};

    use super::*;

    #[test]
    fn the_largest_fit_names_its_option_and_a_failed_disk_back_its_command() {
        let error = EngineError::NoCapacity {
            space: "big".into(),
            detail: format!("1G does not fit: at most 6M with 3 columns ({LARGEST_FIT}); more"),
        };
        assert_eq!(
            advised(&error),
            "not enough free capacity for space big: 1G does not fit: at most 6M with 3 \
             columns (--max); more"
        );
        let reason = format!("an I/O error; present: {CLEARED_BACK}");
        assert_eq!(
            disk_reason(&reason, "tank"),
            Some(format!("{reason} (`terrace pool clear tank`)"))
        );
        assert_eq!(
            disk_reason("not found", "tank").as_deref(),
            Some("not found")
        );
        assert_eq!(disk_reason("", "tank"), None);
    }

    #[test]
    fn engine_errors_get_the_flag_that_helps_and_other_messages_stay() {
        let error = EngineError::NoCapacityDisks {
            usages: "journal".into(),
        };
        assert_eq!(
            advised(&error),
            "none of the disks given holds capacity: every one has usage journal; a pool \
             needs at least one disk of usage auto (the default) or manual. To give one disk \
             its own usage, write it after the disk (for example ssd.img,usage=journal) \
             instead of --usage, which sets every disk's"
        );
        let error = EngineError::MetadataRoom {
            metadata_bytes: 1,
            reserve_bytes: 2,
            slot_bytes: 3,
        };
        assert!(advised(&error).ends_with(
            "beyond its metadata slot of 3; use larger slabs, or a pool created with a \
             larger --metadata-slot"
        ));
        assert!(!EngineError::MetadataRoom {
            metadata_bytes: 1,
            reserve_bytes: 2,
            slot_bytes: 3,
        }
        .to_string()
        .contains("--"));
        assert_eq!(advised(&"no such pool"), "no such pool");
    }

    /// A disk not present names the command that adds it; one in service
    /// names none.
    #[test]
    fn a_disk_not_present_to_clear_is_told_how_to_add_it() {
        let refused = |why| EngineError::NotCleared {
            disk: 1,
            pool: "tank".into(),
            why,
        };
        let absent = refused(ClearRefusal::NotPresent {
            reason: "not found at import".into(),
        });
        assert_eq!(
            advised(&absent),
            "disk 1 of pool tank is not one to clear: it is not present (not found at \
             import): plug it back in, or add it with `terrace disk add`"
        );
    }

    /// A repair that re-created nothing because its extents lost too many
    /// disks names the command that takes them back; other reasons stay.
    #[test]
    fn a_repair_waiting_for_lost_disks_is_told_how_to_take_them_back() {
        let job = |disk, reason: &str| JobStatus {
            id: 1,
            kind: JobKind::Repair {
                disk: DiskIndex(disk),
            },
            state: JobState::Done,
            reason: reason.into(),
            bytes_total: 0,
            bytes_done: 0,
            moves_total: 0,
            moves_done: 0,
            rate_bytes_per_second: 0,
            eta_seconds: None,
            repaired: 0,
            unrepaired: 0,
        };
        let waiting = "nothing to repair: every extent with a slab on disk 2 has lost more \
                       disks than its layout tolerates, so none can be re-created; they read \
                       again once the disks are back";
        assert_eq!(
            job_reason(&job(2, waiting)).as_deref(),
            Some(format!("{waiting} (`terrace pool clear`)").as_str())
        );
        let no_data = "nothing to repair: disk 2 holds no data";
        assert_eq!(job_reason(&job(2, no_data)).as_deref(), Some(no_data));
        assert_eq!(job_reason(&job(2, "")), None);
    }
}

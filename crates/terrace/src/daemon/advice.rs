//! What the CLI adds to an engine error: the engine says what is wrong, in
//! its own terms; which flag or command would help is the CLI's to say, so
//! it is said here, once, for every answer that carries the error.

use std::any::Any;
use std::fmt::Display;

use terrace_engine::EngineError;

/// `message` as the user reads it: an engine error with the advice that
/// goes with it, anything else as it is.
pub(super) fn advised(message: &(impl Display + Any)) -> String {
    let any: &dyn Any = message;
    match any.downcast_ref::<EngineError>() {
        Some(error) => match advice(error) {
            Some(advice) => format!("{error}{advice}"),
            None => error.to_string(),
        },
        None => message.to_string(),
    }
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
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

//! Load profiles: access pattern, read share and block size.
//!
//! The five standard profiles are those of the Fujitsu white paper on
//! Storage Spaces (SPEC.md, "Standard load profiles"). Any other mix is
//! written `ACCESS:READ%:BLOCK`, e.g. `random:70:8K` (random, 70 % reads,
//! 30 % writes, 8 KiB requests).

use serde::{Deserialize, Serialize};

use crate::units::{format_block, format_block_short, parse_block_size};

/// Smallest block: one 512-byte sector, the NBD protocol's natural unit.
pub const BLOCK_MIN_BYTES: u64 = 512;
/// Largest block: 32 MiB, the largest request NBD servers accept.
pub const BLOCK_MAX_BYTES: u64 = 32 << 20;
/// Blocks are whole sectors, so that they suit every device (a target may
/// ask for more: O_DIRECT files need multiples of their own alignment).
pub const BLOCK_GRANULE_BYTES: u64 = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Offsets uniform over the working set, aligned to the block size.
    Random,
    /// Consecutive blocks (see [`crate::SequentialMode`]).
    Sequential,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Random => "random",
            Access::Sequential => "sequential",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    pub name: String,
    pub access: Access,
    /// Share of requests that are reads, 0 to 100; the rest are writes.
    pub read_percent: u8,
    pub block_bytes: u32,
}

/// A profile text that names no profile; the message says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("profile {text:?}: {reason}")]
pub struct ProfileError {
    pub text: String,
    pub reason: String,
}

/// The standard names, for messages.
const STANDARD_NAMES: &str = "file-copy, file-server, database, streaming, restore";

impl Profile {
    fn new(name: &str, access: Access, read_percent: u8, block_bytes: u32) -> Profile {
        Profile {
            name: name.to_string(),
            access,
            read_percent,
            block_bytes,
        }
    }

    /// The white paper's five profiles, in its order.
    pub fn standard() -> Vec<Profile> {
        vec![
            Profile::new("file-copy", Access::Random, 50, 64 << 10),
            Profile::new("file-server", Access::Random, 67, 64 << 10),
            Profile::new("database", Access::Random, 67, 8 << 10),
            Profile::new("streaming", Access::Sequential, 100, 64 << 10),
            Profile::new("restore", Access::Sequential, 0, 64 << 10),
        ]
    }

    /// A standard profile by name, or a custom `ACCESS:READ%:BLOCK` mix.
    pub fn parse(text: &str) -> Result<Profile, ProfileError> {
        let trimmed = text.trim();
        if let Some(profile) = Profile::standard()
            .into_iter()
            .find(|p| p.name.eq_ignore_ascii_case(trimmed))
        {
            return Ok(profile);
        }
        let fail = |reason: String| ProfileError {
            text: text.to_string(),
            reason,
        };
        let parts: Vec<&str> = trimmed.split(':').collect();
        let [access, read, block] = parts[..] else {
            return Err(fail(format!(
                "not a standard profile ({STANDARD_NAMES}) nor a custom mix \
                 ACCESS:READ%:BLOCK such as random:70:8K"
            )));
        };
        let access = match access.to_ascii_lowercase().as_str() {
            "random" | "rand" => Access::Random,
            "sequential" | "seq" => Access::Sequential,
            other => {
                return Err(fail(format!(
                    "access {other:?} is neither random nor sequential"
                )))
            }
        };
        let read_percent = read
            .trim_end_matches('%')
            .parse::<u8>()
            .ok()
            .filter(|percent| *percent <= 100)
            .ok_or_else(|| {
                fail(format!(
                    "read share {read:?} is not a whole percent from 0 to 100"
                ))
            })?;
        let block_bytes = parse_block_size(block).map_err(|error| fail(error.to_string()))?;
        check_block(block_bytes).map_err(fail)?;
        let name = format!(
            "{}:{read_percent}:{}",
            access.as_str(),
            format_block_short(block_bytes)
        );
        Ok(Profile::new(
            &name,
            access,
            read_percent,
            block_bytes as u32,
        ))
    }

    /// Whether the profile reads (and so wants written data under it).
    pub fn reads(&self) -> bool {
        self.read_percent > 0
    }

    /// Whether the profile writes (and so destroys what the target held).
    pub fn writes(&self) -> bool {
        self.read_percent < 100
    }

    /// "random, 67 % read / 33 % write, 64 KiB" for titles.
    pub fn describe(&self) -> String {
        let mix = match self.read_percent {
            100 => "100 % read".to_string(),
            0 => "100 % write".to_string(),
            read => format!("{read} % read / {} % write", 100 - read),
        };
        format!(
            "{}, {mix}, {}",
            self.access.as_str(),
            format_block(u64::from(self.block_bytes))
        )
    }
}

fn check_block(bytes: u64) -> Result<(), String> {
    if !(BLOCK_MIN_BYTES..=BLOCK_MAX_BYTES).contains(&bytes)
        || !bytes.is_multiple_of(BLOCK_GRANULE_BYTES)
    {
        return Err(format!(
            "block size {bytes} is not a multiple of 512 from 512 to 32M"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_profiles_match_the_paper() {
        let profiles = Profile::standard();
        let names: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "file-copy",
                "file-server",
                "database",
                "streaming",
                "restore"
            ]
        );
        let database = Profile::parse("database").expect("standard");
        assert_eq!(
            (database.access, database.read_percent, database.block_bytes),
            (Access::Random, 67, 8192)
        );
        let restore = Profile::parse("Restore").expect("case-insensitive");
        assert_eq!(
            (restore.access, restore.read_percent),
            (Access::Sequential, 0)
        );
    }

    #[test]
    fn custom_mixes_parse_and_errors_say_why() {
        let custom = Profile::parse("random:70:8K").expect("custom");
        assert_eq!(custom.name, "random:70:8K");
        assert_eq!(
            (custom.access, custom.read_percent, custom.block_bytes),
            (Access::Random, 70, 8192)
        );
        let sequential = Profile::parse("seq:100%:1M").expect("custom");
        assert_eq!(sequential.access, Access::Sequential);
        assert_eq!(sequential.block_bytes, 1 << 20);
        let reason = |text: &str| Profile::parse(text).expect_err(text).reason;
        assert!(reason("fast").contains("random:70:8K"));
        assert!(reason("diagonal:50:8K").contains("neither random nor sequential"));
        assert!(reason("random:101:8K").contains("0 to 100"));
        assert!(reason("random:x:8K").contains("0 to 100"));
        assert!(reason("random:50:8G").contains("block size"));
        assert!(reason("random:50:1000").contains("multiple of 512"));
        assert!(reason("random:50:64M").contains("32M"));
    }

    #[test]
    fn descriptions() {
        let profiles = Profile::standard();
        assert_eq!(
            profiles[1].describe(),
            "random, 67 % read / 33 % write, 64 KiB"
        );
        assert_eq!(profiles[3].describe(), "sequential, 100 % read, 64 KiB");
        assert!(profiles[3].reads() && !profiles[4].reads());
    }
}

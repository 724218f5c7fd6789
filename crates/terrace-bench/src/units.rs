//! Durations and block sizes as people write them: `500ms`, `5s`, `1m`;
//! `512`, `8K`, `1M` (powers of 1024).

use std::time::Duration;

use terrace_io::size::parse_size;

/// A text that is not a duration or a block size; the message says what is
/// accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not {what}; write {hint}")]
pub struct UnitError {
    pub text: String,
    pub what: &'static str,
    pub hint: &'static str,
}

/// Parse `500ms`, `5s`, `2.5s`, `1m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let error = || UnitError {
        text: text.to_string(),
        what: "a duration",
        hint: "a number with ms, s, m or h, e.g. 500ms, 5s or 1m",
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let scale = match unit {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(error()),
    };
    if number.is_empty() || number.starts_with(['-', '+']) {
        return Err(error());
    }
    let value: f64 = number.parse().map_err(|_| error())?;
    Duration::try_from_secs_f64(value * scale).map_err(|_| error())
}

/// Parse a block size as every size is read (`8K`, `64KiB`, `1M`; see
/// [`parse_size`]).
pub fn parse_block_size(text: &str) -> Result<u64, UnitError> {
    parse_size(text).map_err(|_| UnitError {
        text: text.to_string(),
        what: "a block size",
        hint: "a number of bytes with an optional K or M suffix, e.g. 8K or 1M",
    })
}

/// `64 KiB`, `8 KiB`, `1 MiB`, `1536 B`: block sizes for titles.
pub fn format_block(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// `64K`, `8K`, `1M`, `1536`: block sizes in the `ACCESS:READ:BLOCK` form.
pub fn format_block_short(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{}K", bytes >> 10)
    } else {
        format!("{bytes}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        for bad in ["", "s", "-1s", "5x", "1e400s", "fast"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert!(parse_duration("5x")
            .unwrap_err()
            .to_string()
            .contains("500ms"));
    }

    #[test]
    fn block_sizes() {
        assert_eq!(parse_block_size("4096"), Ok(4096));
        assert_eq!(parse_block_size("8K"), Ok(8192));
        assert_eq!(parse_block_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_block_size("1M"), Ok(1 << 20));
        assert_eq!(parse_block_size("1.5K"), Ok(1536));
        for bad in ["", "K", "-8K", "8Q", "99999999999999999999"] {
            assert!(parse_block_size(bad).is_err(), "{bad}");
        }
        assert_eq!(format_block(64 << 10), "64 KiB");
        assert_eq!(format_block(1 << 20), "1 MiB");
        assert_eq!(format_block(1536), "1536 B");
        assert_eq!(format_block_short(8 << 10), "8K");
    }
}

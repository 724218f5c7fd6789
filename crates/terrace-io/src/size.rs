//! Sizes as people write them: `4096`, `256K`, `10G`, `1.5T` (powers of
//! 1024). The one parser of sizes: the CLI, the daemon, the benchmark and
//! the drive models' options all read sizes with it.

/// A text that is not a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a size; write a number with an optional K, M, G, T or P suffix, e.g. 256K or 1.5T")]
pub struct SizeError {
    pub text: String,
}

/// Bytes of `text`: a number, whole or decimal, with an optional K, M, G,
/// T or P suffix (either case, `KiB` and `KB` alike).
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let error = || SizeError {
        text: text.to_string(),
    };
    let trimmed = text.trim();
    let trimmed = trimmed.strip_suffix(['B', 'b']).unwrap_or(trimmed);
    let trimmed = trimmed.strip_suffix(['i']).unwrap_or(trimmed);
    let (number, shift) = match trimmed.char_indices().last() {
        Some((index, suffix)) if suffix.is_ascii_alphabetic() => {
            let shift = match suffix.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                'P' => 50,
                _ => return Err(error()),
            };
            (&trimmed[..index], shift)
        }
        _ => (trimmed, 0),
    };
    if number.is_empty() || number.starts_with(['-', '+']) {
        return Err(error());
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(1 << shift).ok_or_else(error);
    }
    let value: f64 = number.parse().map_err(|_| error())?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(error());
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_people_sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256K"), Ok(256 << 10));
        assert_eq!(parse_size("256k"), Ok(256 << 10));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("1.5T"), Ok(3 << 39));
        assert_eq!(parse_size(" 64M "), Ok(64 << 20));
        for bad in ["", "G", "-1G", "12Q", "1..5G", "99999999999P", "nan", "inf"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(parse_size("12Q").unwrap_err().to_string().contains("256K"));
    }
}

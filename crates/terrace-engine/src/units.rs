//! Sizes as people read them, for messages and listings alike.

/// `8.0G`, `256K`, `512`: one decimal below 10 units, none above.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}")
    } else if value < 10.0 && value.fract() != 0.0 {
        format!("{value:.1}{}", UNITS[unit])
    } else {
        format!("{value:.0}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_sizes_compactly() {
        assert_eq!(format_size(512), "512");
        assert_eq!(format_size(256 << 10), "256K");
        assert_eq!(format_size(3 << 29), "1.5G");
        assert_eq!(format_size(8 << 30), "8G");
        assert_eq!(format_size(100 << 30), "100G");
    }
}

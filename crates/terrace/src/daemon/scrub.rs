//! `pool scrub`, and the scrub schedule in the words `pool set --scrub`
//! takes and `pool status` shows: daily, weekly, monthly, off or a
//! duration (`36h`, `10d`, `2w`).

use super::control::{failure, find_pool, usage, Answer};
use super::registry::Registry;

const MINUTE_SECS: u64 = 60;
const HOUR_SECS: u64 = 60 * MINUTE_SECS;
const DAY_SECS: u64 = 24 * HOUR_SECS;
const WEEK_SECS: u64 = 7 * DAY_SECS;
/// "monthly" is the pool's default interval: four weeks.
const MONTH_SECS: u64 = terrace_engine::meta::model::SCRUB_INTERVAL_SECS_DEFAULT;
/// Shorter than an hour a scrub of any real pool would never end before
/// the next is due: a slip of the unit (5m for 5d), not a choice.
const INTERVAL_MIN_SECS: u64 = HOUR_SECS;
/// Below a megabyte a second a scrub of one disk takes weeks (as for the
/// repair rate).
const RATE_MIN_BYTES: u64 = 1 << 20;

/// The interval in seconds that `text` names (0: off).
pub fn interval_secs(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let secs = match text {
        "off" | "never" => return Ok(0),
        "daily" => DAY_SECS,
        "weekly" => WEEK_SECS,
        "monthly" => MONTH_SECS,
        _ => {
            let split = text
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(text.len());
            let (number, unit) = text.split_at(split);
            let unit_secs = match unit {
                "m" => MINUTE_SECS,
                "h" => HOUR_SECS,
                "d" => DAY_SECS,
                "w" => WEEK_SECS,
                _ => 0,
            };
            let number: u64 = number.parse().unwrap_or(0);
            if unit_secs == 0 || number == 0 {
                return Err(format!(
                    "a scrub interval is daily, weekly, monthly, off, or a duration such as \
                     36h, 10d or 2w; not {text:?}"
                ));
            }
            number.saturating_mul(unit_secs)
        }
    };
    if secs < INTERVAL_MIN_SECS {
        return Err(format!(
            "a scrub every {text} would start again before it ends: at least 1h, or off"
        ));
    }
    Ok(secs)
}

/// How `pool status` words an interval.
pub fn interval_words(secs: u64) -> String {
    match secs {
        0 => "off".into(),
        DAY_SECS => "daily".into(),
        WEEK_SECS => "weekly".into(),
        MONTH_SECS => "monthly (every 28 days)".into(),
        secs if secs % DAY_SECS == 0 => format!("every {} days", secs / DAY_SECS),
        secs if secs % HOUR_SECS == 0 => format!("every {} hours", secs / HOUR_SECS),
        secs => format!("every {} minutes", secs / MINUTE_SECS),
    }
}

/// Start a scrub of pool `name`, paced at `rate` bytes read a second.
pub async fn pool_scrub(registry: &Registry, name: &str, rate: Option<u64>) -> Answer {
    let rate = rate.unwrap_or(0);
    if rate != 0 && rate < RATE_MIN_BYTES {
        return Err(usage(format!(
            "a scrub rate of {rate} bytes a second would take weeks for one disk: \
             use at least 1M (e.g. 200M), or leave it out for the pool's repair rate"
        )));
    }
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, name)?;
    let id = entry.pool.start_scrub(rate).await.map_err(failure)?;
    super::control::job_answer(&entry, id).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_words_or_durations_and_read_back() {
        assert_eq!(interval_secs("daily"), Ok(DAY_SECS));
        assert_eq!(interval_secs("off"), Ok(0));
        assert_eq!(interval_secs("36h"), Ok(36 * HOUR_SECS));
        assert_eq!(interval_secs("2w"), Ok(2 * WEEK_SECS));
        for bad in ["5s", "10", "d", "0d", "30m", "yearly"] {
            assert!(interval_secs(bad).is_err(), "{bad}");
        }
        assert_eq!(interval_words(MONTH_SECS), "monthly (every 28 days)");
        assert_eq!(interval_words(36 * HOUR_SECS), "every 36 hours");
        assert_eq!(interval_words(10 * DAY_SECS), "every 10 days");
    }
}

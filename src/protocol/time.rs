//! The protocol's timestamp formats, in one place: ISO 8601 in UTC with a `Z`, with
//! milliseconds (admin and lease routes) or microseconds (message arrival times on pop and in
//! the dead-letter list).

use chrono::{DateTime, Utc};

/// Milliseconds, UTC, `Z`: `2023-11-14T22:13:20.123Z`.
pub fn iso_millis(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// Microseconds, UTC, `Z`: `2023-11-14T22:13:20.123456Z`.
pub fn iso_micros(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// [`iso_micros`] of a count of microseconds since the Unix epoch (out of range → the epoch).
pub fn micros_iso(micros: i64) -> String {
    iso_micros(DateTime::from_timestamp_micros(micros).unwrap_or_default())
}

/// Current time in microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    Utc::now().timestamp_micros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_millis_and_micros() {
        let t = DateTime::from_timestamp_micros(1_700_000_000_123_456).expect("in range");
        assert_eq!(iso_millis(t), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso_micros(t), "2023-11-14T22:13:20.123456Z");
        assert_eq!(
            micros_iso(1_700_000_000_123_456),
            "2023-11-14T22:13:20.123456Z"
        );
    }
}

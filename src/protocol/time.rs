//! The protocol's timestamp formats, in one place: ISO 8601 in UTC with a `Z`, with
//! milliseconds (admin and lease routes) or microseconds (message arrival times on pop and in
//! the dead-letter list).

use chrono::{DateTime, Datelike, Timelike, Utc};

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
    let mut out = Vec::with_capacity(27);
    push_micros_iso(&mut out, micros);
    String::from_utf8(out).expect("the timestamp is ASCII")
}

/// Appends [`micros_iso`] of `micros` to `out` without going through a format string: the pop
/// answer writes one per message.
pub fn push_micros_iso(out: &mut Vec<u8>, micros: i64) {
    let t = DateTime::from_timestamp_micros(micros).unwrap_or_default();
    let year = t.year();
    if !(0..=9999).contains(&year) {
        out.extend_from_slice(iso_micros(t).as_bytes());
        return;
    }
    push_digits(out, year as u32, 4);
    for (sep, value) in [
        (b'-', t.month()),
        (b'-', t.day()),
        (b'T', t.hour()),
        (b':', t.minute()),
        (b':', t.second()),
    ] {
        out.push(sep);
        push_digits(out, value, 2);
    }
    out.push(b'.');
    // chrono's %.6f prints a leap second's fraction modulo one second too.
    push_digits(out, (t.nanosecond() / 1_000) % 1_000_000, 6);
    out.push(b'Z');
}

/// `value` as exactly `width` decimal digits (zero-padded; `width` ≤ 6).
fn push_digits(out: &mut Vec<u8>, value: u32, width: usize) {
    let mut buf = [b'0'; 6];
    let mut v = value;
    for slot in buf[..width].iter_mut().rev() {
        *slot = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out.extend_from_slice(&buf[..width]);
}

/// Current time in microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    Utc::now().timestamp_micros()
}

/// The header saying when the lag figures of an answer were measured (docs/operations.md, "Lag
/// at scale").
pub const LAG_MEASURED_AT: &str = "X-Lag-Measured-At";

/// [`LAG_MEASURED_AT`]'s value: `request` when measured for this answer (`None`), else the end
/// of the background lag pass the figures come from, or `pending` while none has finished.
pub fn lag_measured_at(measured: Option<Option<DateTime<Utc>>>) -> String {
    match measured {
        None => "request".to_string(),
        Some(None) => "pending".to_string(),
        Some(Some(at)) => iso_millis(at),
    }
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

    #[test]
    fn the_fast_writer_agrees_with_chrono_everywhere() {
        for micros in [
            0,
            -1,
            1,
            999_999,
            1_700_000_000_000_000,
            1_700_000_000_123_456,
            -62_135_596_800_000_000, // 0001-01-01
            253_402_300_799_999_999, // 9999-12-31T23:59:59.999999
            253_402_300_800_000_000, // year 10000: the slow path
            i64::MAX,
            i64::MIN,
        ]
        .into_iter()
        .chain((0..2_000).map(|k| k * 987_654_321_987 - 1_000_000_000_000_000))
        {
            let t = DateTime::from_timestamp_micros(micros).unwrap_or_default();
            assert_eq!(micros_iso(micros), iso_micros(t), "{micros}");
        }
    }
}

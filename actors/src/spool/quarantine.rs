//! The quarantine: spooled records PostgreSQL refused on their own for a reason other than
//! being unreachable (a value it cannot store, say). Replay moves such a record here instead of
//! retrying it forever, so it never holds back the records behind it; it is kept (never lost),
//! counted, listed by `GET /api/v1/system/quarantine` and logged with its ids.
//!
//! One JSON object per line in `quarantine.jsonl` in the spool directory, appended and fsynced
//! before replay moves past the record:
//!
//! ```text
//! {"queue":…,"partition":…,"messageId":…,"transactionId":…,"producerSub":…,"traceId":…,
//!  "arrivedAtMicros":…,"payload":"<the payload's JSON text>","error":…,"quarantinedAtMicros":…}
//! ```
//! Strings are JSON-escaped, so a name holding a NUL character is kept as `\u0000`. An operator
//! can push the payloads again after fixing them; the file is theirs to move away.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::spool::record::Record;

/// The quarantine file's name in the spool directory.
pub const FILE_NAME: &str = "quarantine.jsonl";

/// A record refused by PostgreSQL, and why.
#[derive(Debug, Clone)]
pub struct Quarantined {
    /// The record as spooled.
    pub record: Record,
    /// PostgreSQL's refusal.
    pub error: String,
}

/// The quarantine file of the spool in `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

fn line(q: &Quarantined) -> String {
    let item = &q.record.item;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    json!({
        "queue": &*q.record.key.queue,
        "partition": &*q.record.key.partition,
        "messageId": item.message_id.to_string(),
        "transactionId": item.transaction_id,
        "producerSub": item.producer_sub,
        "traceId": item.trace_id,
        "arrivedAtMicros": item.arrived_at_micros,
        "payload": &*item.payload,
        "error": q.error,
        "quarantinedAtMicros": now,
    })
    .to_string()
}

/// Appends `entries` to the quarantine file of `dir` and makes them durable.
///
/// # Errors
///
/// Any I/O error; nothing may then be taken as quarantined.
pub fn append(dir: &Path, entries: &[Quarantined]) -> std::io::Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut text = String::new();
    for q in entries {
        text.push_str(&line(q));
        text.push('\n');
    }
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path(dir))?;
    file.write_all(text.as_bytes())?;
    file.sync_data()
}

/// Records in the quarantine file of `dir` (0 without one).
pub fn count(dir: &Path) -> u64 {
    let Ok(file) = std::fs::File::open(path(dir)) else {
        return 0;
    };
    BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter(|l| !l.trim().is_empty())
        .count() as u64
}

/// Up to `limit` quarantined records of `dir` from the `offset`-th on, oldest first (a line
/// that does not parse is shown as `{"unreadable": <its text>}`).
///
/// # Errors
///
/// Any I/O error other than the file not existing.
pub fn list(dir: &Path, offset: usize, limit: usize) -> std::io::Result<Vec<Value>> {
    let file = match std::fs::File::open(path(dir)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for text in BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter(|l| !l.trim().is_empty())
        .skip(offset)
        .take(limit)
    {
        out.push(serde_json::from_str(&text).unwrap_or_else(|_| json!({ "unreadable": text })));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::message::{Item, PartitionKey};

    #[test]
    fn entries_are_appended_counted_and_listed_with_nul_kept() {
        let dir = std::env::temp_dir().join(format!("quarantine-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(count(&dir), 0);
        assert!(list(&dir, 0, 10).unwrap().is_empty());
        let entry = |q: &str| Quarantined {
            record: Record {
                key: PartitionKey::new(q, "p"),
                item: Item {
                    message_id: Uuid::now_v7(),
                    transaction_id: "t".into(),
                    payload: r#"{"a":1}"#.into(),
                    producer_sub: None,
                    trace_id: None,
                    arrived_at_micros: 7,
                },
            },
            error: "refused".into(),
        };
        append(&dir, &[entry("bad\0q"), entry("b")]).unwrap();
        append(&dir, &[entry("c")]).unwrap();
        assert_eq!(count(&dir), 3);
        let listed = list(&dir, 1, 10).unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0]["queue"], "b");
        let first = &list(&dir, 0, 1).unwrap()[0];
        assert_eq!(first["queue"], "bad\0q");
        assert_eq!(first["payload"], r#"{"a":1}"#);
        assert_eq!(first["error"], "refused");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `POST /api/v1/fetch` (records by offset) and `POST /api/v1/partitions/changed` (partitions
//! written since a time), reference §2.6. Neither takes a lease, moves a cursor or writes a row.
//!
//! Fetch budgets (docs/reads-and-ephemeral.md): `maxBytes` bounds the payload bytes of each
//! entry and of the whole call (default and ceiling 8 MiB each). Entries are served in request
//! order; an entry whose turn comes while the call still has budget left answers at least its
//! first record, even when that record alone is larger than the budget (ambiguity 12: otherwise
//! a record larger than `maxBytes` could never be read and the client's loop would stop short).
//! Entries after the call budget is spent answer no records, with their watermarks.

use std::fmt::Write as _;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::Value;

use crate::http::body::{parse_json, read_body};
use crate::http::error::{with_db, ApiError};
use crate::protocol::params::check_name;
use crate::protocol::time::{iso_micros, push_micros_iso};
use crate::state::AppState;
use crate::storage::queues::reads::{self, Want};
use crate::storage::{segments::crypto, segments::frames};

/// Most entries one fetch call may carry.
pub const MAX_FETCH_ENTRIES: usize = 1024;
/// Default and ceiling of `maxBytes` (per entry and per call).
pub const MAX_FETCH_BYTES: i64 = 8 * 1024 * 1024;
/// Default and ceiling of a `partitions/changed` page.
pub const MAX_CHANGED_PAGE: i64 = 1000;
/// Entries one `partitions/changed` call may carry.
pub const MAX_CHANGED_ENTRIES: usize = 100;
/// How far `safeTime` stays behind the database's clock (beyond the start of any open
/// transaction, `storage::queues::reads::safe_time`).
pub const SAFE_TIME_MARGIN: std::time::Duration = std::time::Duration::from_millis(100);

const OUT_OF_RANGE: &str = "OFFSET_OUT_OF_RANGE";
const UNKNOWN: &str = "UNKNOWN_TOPIC_OR_PARTITION";

fn bad(text: impl Into<String>) -> ApiError {
    ApiError::BadRequest(text.into())
}

/// A name field of an entry.
fn name_field<'a>(entry: &'a Value, field: &str, index: usize) -> Result<&'a str, ApiError> {
    let value = entry
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("entries[{index}].{field} must be a string")))?;
    if value.is_empty() {
        return Err(bad(format!("entries[{index}].{field} must not be empty")));
    }
    check_name(&format!("entries[{index}].{field}"), value)?;
    Ok(value)
}

/// A non-negative integer field (absent → `default`); budgets are clamped to the ceiling.
fn int_field(entry: &Value, field: &str, default: i64, what: &str) -> Result<i64, ApiError> {
    match entry.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_i64()
            .filter(|n| *n >= 0)
            .ok_or_else(|| bad(format!("{what} must be a non-negative integer"))),
    }
}

struct FetchEntry<'a> {
    queue: &'a str,
    partition: &'a str,
    offset: i64,
    max_bytes: i64,
}

/// `POST /api/v1/fetch`.
pub async fn fetch(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let body = parse_json(&bytes)?;
    let raw = body
        .get("entries")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("entries must be an array"))?;
    if raw.len() > MAX_FETCH_ENTRIES {
        return Err(bad(format!(
            "at most {MAX_FETCH_ENTRIES} entries per fetch (got {})",
            raw.len()
        )));
    }
    let call_budget =
        int_field(&body, "maxBytes", MAX_FETCH_BYTES, "maxBytes")?.clamp(1, MAX_FETCH_BYTES);
    let mut entries = Vec::with_capacity(raw.len());
    for (i, e) in raw.iter().enumerate() {
        if !e.is_object() {
            return Err(bad(format!("entries[{i}] must be an object")));
        }
        entries.push(FetchEntry {
            queue: name_field(e, "queue", i)?,
            partition: name_field(e, "partition", i)?,
            offset: int_field(e, "offset", 0, &format!("entries[{i}].offset"))?,
            max_bytes: int_field(
                e,
                "maxBytes",
                MAX_FETCH_BYTES,
                &format!("entries[{i}].maxBytes"),
            )?
            .clamp(1, MAX_FETCH_BYTES),
        });
    }
    let queues: Vec<&str> = entries.iter().map(|e| e.queue).collect();
    let partitions: Vec<&str> = entries.iter().map(|e| e.partition).collect();
    let key = state.payload_key.as_ref();
    let (heads, results) = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        let heads = reads::heads(&mut conn, &queues, &partitions).await?;
        let wants: Vec<Want> = heads
            .iter()
            .filter_map(|h| {
                let e = &entries[h.ord as usize];
                (e.offset >= h.log_start && e.offset < h.next_offset).then_some(Want {
                    ord: h.ord,
                    partition_id: h.partition_id,
                    from: e.offset,
                    budget: e.max_bytes,
                })
            })
            .collect();
        let mut gone: std::collections::HashMap<i64, Vec<i64>> = Default::default();
        for (ord, offset) in reads::deleted(&mut conn, &wants).await? {
            gone.entry(ord).or_default().push(offset);
        }
        let by_ord: std::collections::HashMap<i64, &reads::Head> =
            heads.iter().map(|h| (h.ord, h)).collect();
        // Rounds: the statement bounds what it reads by stored segment sizes, which are larger
        // than the payloads counted here; an entry it cut off while the call still has room is
        // read in the next round, so the rule "an entry whose turn comes with budget left gets
        // at least its first record" holds exactly. One round in the common case.
        let mut results: std::collections::HashMap<i64, Vec<Record>> = Default::default();
        let mut call_used: i64 = 0;
        let mut next = 0;
        while next < wants.len() && call_used < call_budget {
            let remaining = call_budget - call_used;
            let round: Vec<Want> = wants[next..]
                .iter()
                .map(|w| Want {
                    budget: w.budget.min(remaining),
                    ..*w
                })
                .collect();
            let mut segments: std::collections::HashMap<i64, Vec<reads::ReadSegment>> =
                Default::default();
            for seg in reads::segments(&mut conn, &round, remaining).await? {
                segments.entry(seg.ord).or_default().push(seg);
            }
            let first = next;
            while next < wants.len() {
                let w = wants[next];
                let segs = match segments.remove(&w.ord) {
                    Some(segs) => segs,
                    // Cut off by this round's bound: the next round starts here.
                    None if next > first => break,
                    // The first entry of a round always gets its first segment, unless
                    // retention removed it since the heads were read: nothing to answer.
                    None => Vec::new(),
                };
                let head = by_ord[&w.ord];
                let entry = &entries[w.ord as usize];
                let records = take_records(
                    entry,
                    head,
                    &segs,
                    gone.get(&w.ord).map_or(&[][..], Vec::as_slice),
                    (&mut call_used, call_budget),
                    key,
                )?;
                results.insert(w.ord, records);
                next += 1;
                if call_used >= call_budget {
                    break;
                }
            }
        }
        Ok((heads, results))
    })
    .await?;

    let mut out: Vec<u8> = Vec::with_capacity(256 + entries.len() * 64);
    out.extend_from_slice(b"{\"entries\":[");
    let by_ord: std::collections::HashMap<i64, &reads::Head> =
        heads.iter().map(|h| (h.ord, h)).collect();
    for (ord, entry) in entries.iter().enumerate() {
        if ord > 0 {
            out.push(b',');
        }
        let Some(head) = by_ord.get(&(ord as i64)) else {
            let _ = write!(
                out_str(&mut out),
                "{{\"highWatermark\":0,\"logStartOffset\":0,\"records\":[],\"error\":\"{UNKNOWN}\"}}"
            );
            continue;
        };
        let _ = write!(
            out_str(&mut out),
            "{{\"highWatermark\":{},\"logStartOffset\":{},\"records\":[",
            head.next_offset,
            head.log_start
        );
        for (i, r) in results.get(&(ord as i64)).into_iter().flatten().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let _ = write!(
                out_str(&mut out),
                "{{\"offset\":{},\"transactionId\":",
                r.offset
            );
            out.extend_from_slice(
                serde_json::to_string(&r.transaction_id)
                    .expect("a string serialises")
                    .as_bytes(),
            );
            out.extend_from_slice(b",\"payload\":");
            out.extend_from_slice(r.payload.as_bytes());
            out.extend_from_slice(b",\"ts\":\"");
            push_micros_iso(&mut out, r.created_at_micros);
            out.extend_from_slice(b"\"}");
        }
        out.push(b']');
        if entry.offset < head.log_start || entry.offset > head.next_offset {
            let _ = write!(out_str(&mut out), ",\"error\":\"{OUT_OF_RANGE}\"");
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(out))
}

/// One record of a fetch answer.
struct Record {
    offset: i64,
    transaction_id: String,
    payload: String,
    created_at_micros: i64,
}

/// The records of one entry from its segments, within the budgets: a record is taken when it
/// fits both the entry's and the call's budget, or when it is the entry's first and the call
/// still has budget left (ambiguity 12). Stops at the head's high watermark.
fn take_records(
    entry: &FetchEntry<'_>,
    head: &reads::Head,
    segments: &[reads::ReadSegment],
    gone: &[i64],
    (call_used, call_budget): (&mut i64, i64),
    key: Option<&crypto::PayloadKey>,
) -> Result<Vec<Record>, crate::storage::StorageError> {
    let corrupt = |source| crate::storage::StorageError::CorruptSegment {
        partition: head.partition_id,
        source,
    };
    let mut out = Vec::new();
    let mut entry_used: i64 = 0;
    let mut next = entry.offset;
    for seg in segments {
        let skip = (next - seg.base_offset).max(0) as usize;
        let decoded = frames::decode_from(&seg.frames, skip).map_err(corrupt)?;
        for (offset, frame) in (seg.base_offset + skip as i64..).zip(decoded) {
            if offset >= head.next_offset {
                return Ok(out);
            }
            let frame = frame.map_err(corrupt)?;
            next = offset + 1;
            if gone.binary_search(&offset).is_ok() {
                continue;
            }
            let payload = if frame.encrypted {
                match crypto::open_with(key, frame.payload) {
                    Ok(text) => text,
                    Err(e) => {
                        tracing::error!(message_id = %frame.id, queue = entry.queue,
                            partition = entry.partition, error = %e,
                            "a stored payload cannot be decrypted; record left out of the fetch");
                        continue;
                    }
                }
            } else {
                frame.payload.to_string()
            };
            let size = payload.len() as i64;
            let first = out.is_empty() && *call_used < call_budget;
            let fits = entry_used + size <= entry.max_bytes && *call_used + size <= call_budget;
            if !(first || fits) {
                return Ok(out);
            }
            entry_used += size;
            *call_used += size;
            out.push(Record {
                offset,
                transaction_id: frame.transaction_id.to_string(),
                payload,
                created_at_micros: frame.created_at_micros,
            });
        }
    }
    Ok(out)
}

/// `fmt::Write` over the answer bytes (ASCII pieces only).
fn out_str(out: &mut Vec<u8>) -> impl std::fmt::Write + '_ {
    struct W<'a>(&'a mut Vec<u8>);
    impl std::fmt::Write for W<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.extend_from_slice(s.as_bytes());
            Ok(())
        }
    }
    W(out)
}

/// `since` as the client sends it: RFC 3339 with an offset or `Z`, or without one (UTC).
fn parse_since(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S",
    ]
    .iter()
    .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
    .map(|n| n.and_utc())
}

/// `POST /api/v1/partitions/changed`.
pub async fn changed(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let body = parse_json(&bytes)?;
    let raw = body
        .get("entries")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("entries must be an array"))?;
    if raw.len() > MAX_CHANGED_ENTRIES {
        return Err(bad(format!(
            "at most {MAX_CHANGED_ENTRIES} entries per call (got {})",
            raw.len()
        )));
    }
    struct Ask<'a> {
        queue: &'a str,
        since: Option<DateTime<Utc>>,
        after: i64,
        limit: i64,
    }
    let mut asks = Vec::with_capacity(raw.len());
    for (i, e) in raw.iter().enumerate() {
        if !e.is_object() {
            return Err(bad(format!("entries[{i}] must be an object")));
        }
        let since = match e.get("since") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(parse_since(s).ok_or_else(|| {
                bad(format!(
                    "entries[{i}].since must be an ISO-8601 time, got {s:?}"
                ))
            })?),
            Some(_) => return Err(bad(format!("entries[{i}].since must be a string"))),
        };
        let after = match e.get("after") {
            None | Some(Value::Null) => 0,
            Some(Value::String(s)) => {
                s.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                    bad(format!(
                        "entries[{i}].after is not a cursor this broker gave"
                    ))
                })?
            }
            Some(_) => return Err(bad(format!("entries[{i}].after must be a string"))),
        };
        let limit = int_field(e, "limit", MAX_CHANGED_PAGE, &format!("entries[{i}].limit"))?
            .clamp(1, MAX_CHANGED_PAGE);
        asks.push(Ask {
            queue: name_field(e, "queue", i)?,
            since,
            after,
            limit,
        });
    }
    let (safe, pages) = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        // First: what the listings below are sure to reflect (they take later snapshots).
        let safe = reads::safe_time(&mut conn, SAFE_TIME_MARGIN).await?;
        let mut pages = Vec::with_capacity(asks.len());
        for ask in &asks {
            let Some(queue_id) = reads::queue_id(&mut conn, ask.queue).await? else {
                pages.push(None);
                continue;
            };
            // One row past the page says whether another page follows.
            let mut rows =
                reads::changed(&mut conn, queue_id, ask.since, ask.after, ask.limit + 1).await?;
            let more = rows.len() as i64 > ask.limit;
            rows.truncate(ask.limit as usize);
            pages.push(Some((rows, more)));
        }
        Ok((safe, pages))
    })
    .await?;
    let entries: Vec<Value> = pages
        .into_iter()
        .map(|page| match page {
            None => serde_json::json!({ "partitions": [], "error": UNKNOWN }),
            Some((rows, more)) => {
                let mut entry = serde_json::json!({
                    "partitions": rows.iter().map(|r| serde_json::json!({
                        "name": r.name,
                        "id": r.uuid.to_string(),
                        "lastOffset": r.next_offset - 1,
                        "logStart": r.log_start,
                        "lastWriteAt": r.last_write_at.map(iso_micros),
                    })).collect::<Vec<_>>(),
                });
                if more {
                    if let Some(last) = rows.last() {
                        entry["next"] = last.id.to_string().into();
                    }
                }
                entry
            }
        })
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "safeTime": iso_micros(safe),
        "entries": entries,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_reads_the_clients_spellings() {
        let z = parse_since("2024-05-01T10:00:00.123456Z").expect("Z");
        assert_eq!(iso_micros(z), "2024-05-01T10:00:00.123456Z");
        assert_eq!(parse_since("2024-05-01T10:00:00.123456"), Some(z));
        assert_eq!(
            parse_since("2024-05-01T12:00:00.123456+02:00"),
            Some(z),
            "an offset is honoured"
        );
        assert!(parse_since("yesterday").is_none());
    }
}

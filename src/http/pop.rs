//! `GET /api/v1/pop/queue/{queue}`, `.../partition/{partition}` and `GET /api/v1/pop`
//! (namespace/task): parse the query, run the pop (long-polling with `wait=true`), and write
//! the messages out with their payloads verbatim (reference §4).
//!
//! The handler never decides who gets what: that is `storage::consume`, in PostgreSQL. It
//! only waits (on the wake hub, with a periodic re-check for lease expiry and delayed
//! messages) and formats.
//!
//! The payloads of an encrypted queue are opened where the answer is written (`respond`); a
//! message whose payload cannot be opened is logged with its id and left out of the answer (its
//! lease runs out as usual), so nothing sealed or unauthenticated reaches a consumer.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};

use crate::http::error::{with_db, ApiError};
use crate::protocol::time::push_micros_iso;
use crate::settings::Settings;
use crate::state::AppState;
use crate::storage::cache::WOKEN_FULL_POP_EVERY;
use crate::storage::conns::LazyConn;
use crate::storage::consume::{self, Delivery, PopRequest, Popped, SubscriptionStart, QUEUE_MODE};
use crate::storage::crypto::{self, PayloadKey};
use crate::storage::frames::Frame;
use crate::storage::StorageError;
use crate::wake::WakeKey;

/// What a pop query leaves out: `DEFAULT_BATCH_SIZE`, `DEFAULT_TIMEOUT`,
/// `DEFAULT_SUBSCRIPTION_MODE`.
#[derive(Debug, Clone, Copy)]
struct Defaults {
    batch: usize,
    timeout: Duration,
    subscription_new: bool,
}

impl Defaults {
    fn of(settings: &Settings) -> Self {
        Self {
            batch: settings.default_batch,
            timeout: settings.default_timeout,
            subscription_new: settings.default_subscription_new,
        }
    }
}

/// The query of the three pop routes, interpreted as Queen does (§1, §4.2).
#[derive(Debug, Clone)]
struct PopParams {
    batch: usize,
    partitions: usize,
    wait: bool,
    timeout: Duration,
    group: String,
    auto_ack: bool,
    start: SubscriptionStart,
    namespace: Option<String>,
    task: Option<String>,
}

fn flag(q: &HashMap<String, String>, key: &str) -> bool {
    matches!(q.get(key).map(String::as_str), Some("true" | "1"))
}

fn int<T: std::str::FromStr>(q: &HashMap<String, String>, key: &str, default: T) -> T {
    q.get(key)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

impl PopParams {
    fn parse(q: &HashMap<String, String>, defaults: Defaults) -> Self {
        let group = q
            .get("consumerGroup")
            .filter(|g| !g.is_empty())
            .cloned()
            .unwrap_or_else(|| QUEUE_MODE.to_string());
        let mode = q.get("subscriptionMode").map(String::as_str).unwrap_or("");
        let from = q.get("subscriptionFrom").map(String::as_str).unwrap_or("");
        let start = if from == "now" || mode == "new" || mode == "new-only" {
            SubscriptionStart::New
        } else if let Ok(t) = DateTime::parse_from_rfc3339(from) {
            SubscriptionStart::From(t.with_timezone(&Utc))
        } else if mode.is_empty() && from.is_empty() && defaults.subscription_new {
            SubscriptionStart::New
        } else {
            SubscriptionStart::All
        };
        Self {
            batch: int::<i64>(q, "batch", defaults.batch as i64).max(1) as usize,
            partitions: int::<i64>(q, "partitions", 1).max(1) as usize,
            wait: flag(q, "wait"),
            timeout: Duration::from_millis(int(q, "timeout", defaults.timeout.as_millis() as u64)),
            group,
            auto_ack: flag(q, "autoAck"),
            start,
            namespace: q.get("namespace").filter(|v| !v.is_empty()).cloned(),
            task: q.get("task").filter(|v| !v.is_empty()).cloned(),
        }
    }
}

/// Where a pop looks.
enum Source {
    Queue(String),
    Partition(String, String),
    Matching(Option<String>, Option<String>),
}

/// `GET /api/v1/pop/queue/{queue}`.
pub async fn pop_queue(
    path: web::Path<String>,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    serve(
        &state,
        &PopParams::parse(&query, Defaults::of(&state.settings)),
        Source::Queue(path.into_inner()),
    )
    .await
}

/// `GET /api/v1/pop/queue/{queue}/partition/{partition}`.
pub async fn pop_partition(
    path: web::Path<(String, String)>,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (queue, partition) = path.into_inner();
    serve(
        &state,
        &PopParams::parse(&query, Defaults::of(&state.settings)),
        Source::Partition(queue, partition),
    )
    .await
}

/// `GET /api/v1/pop?namespace=..&task=..` (§4.7): the first matching queue that yields.
pub async fn pop_matching(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let params = PopParams::parse(&query, Defaults::of(&state.settings));
    let source = Source::Matching(params.namespace.clone(), params.task.clone());
    serve(&state, &params, source).await
}

/// Runs pop attempts until one yields, or once without `wait`, or until the timeout.
async fn serve(
    state: &AppState,
    params: &PopParams,
    source: Source,
) -> Result<HttpResponse, ApiError> {
    if state.flags.pop_maintenance() {
        return Ok(HttpResponse::NoContent().finish());
    }
    let deadline = Instant::now() + params.timeout;
    let key = match &source {
        Source::Queue(q) if params.group == QUEUE_MODE => WakeKey::Queue(q.clone()),
        Source::Queue(q) => WakeKey::Group(q.clone(), params.group.clone()),
        Source::Partition(q, p) => WakeKey::Partition(q.clone(), p.clone()),
        Source::Matching(..) => WakeKey::Any,
    };
    let waiter = state.wake.subscribe(key.clone());
    // Every look of a long-poll counts as woken (`PopRequest::woken`), its first and the
    // re-check after a wake-up included: if it finds nothing it waits anyway, and what only the
    // lists and the full pop find is looked for by one such look of the group every
    // `WOKEN_FULL_POP_EVERY` on this broker, not by every waiting consumer in turn.
    // Whether the last wait ran out (the look after it was the re-check).
    let mut rechecked = false;
    loop {
        // Enabled before PostgreSQL is read, so a push committing in between still wakes us.
        let notified = waiter.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();

        let popped = with_db(state, async {
            // A lease needs no WAL flush of its own; a pop that commits the cursor (autoAck)
            // does.
            let pool = if params.auto_ack {
                &state.pool
            } else {
                &state.lease_pool
            };
            // Taken only if the pop runs a statement: one served by a lease claimed ahead or a
            // grouped hand-off claim touches no pool.
            let mut conn = LazyConn::new(pool);
            let (queue, partition) = match &source {
                Source::Queue(q) => (q.as_str(), None),
                Source::Partition(q, p) => (q.as_str(), Some(p.as_str())),
                Source::Matching(..) => ("", None),
            };
            let req = PopRequest {
                queue,
                partition,
                group: &params.group,
                batch: params.batch,
                partitions: params.partitions,
                auto_ack: params.auto_ack,
                start: params.start.clone(),
                owner: &state.broker_id,
                cache: &state.cache,
                woken: params.wait,
                handoffs: &state.handoffs,
                claims: &state.claims,
                ahead: &state.ahead,
            };
            match &source {
                Source::Matching(ns, task) => {
                    consume::pop_matching(&mut conn, ns.as_deref(), task.as_deref(), &req).await
                }
                _ => consume::pop(&mut conn, &req).await,
            }
        })
        .await?;
        if let Some(popped) = popped {
            let decoded = decode(&popped)?;
            if let Some(lease) = popped.lease_id {
                // The acks of this lease find their messages by these ids, not by reading the
                // segments again.
                for (d, frames) in &decoded {
                    let ids = frames.iter().map(|(o, f)| (*o, f.transaction_id));
                    state.cache.index_lease(lease, d.partition_uuid, ids);
                }
            }
            yield_to_consumers(state, &decoded);
            let messages: usize = popped.deliveries.iter().map(|d| d.count).sum();
            state.metrics.popped(
                messages as u64,
                decoded
                    .iter()
                    .flat_map(|(_, frames)| frames.iter().map(|(_, f)| f.created_at_micros)),
            );
            // A pop that filled its batch may have left more behind for the next waiter; one
            // that did not took all its partition had (other written partitions rang their
            // own wake-ups), so waking another waiter would only send it to PostgreSQL for
            // nothing.
            if params.wait && messages >= params.batch {
                state.wake.pass_on(&key);
            }
            return respond(&popped, &decoded, &params.group, state.payload_key.as_ref());
        }
        let now = Instant::now();
        if !params.wait || now >= deadline {
            return Ok(HttpResponse::NoContent().finish());
        }
        // Lease expiry and delayed messages make messages available without a push. A woken
        // look may have skipped the full pop (see `PopRequest::woken`): unless a wake-up comes
        // first, the next look is a moment later; after that re-check (which ran the full pop,
        // or another look of the group just had), the next is `pop_recheck` later.
        let recheck = if rechecked {
            state.settings.pop_recheck
        } else {
            state.settings.pop_recheck.min(2 * WOKEN_FULL_POP_EVERY)
        };
        rechecked = tokio::time::timeout((deadline - now).min(recheck), notified)
            .await
            .is_err();
    }
}

/// How long pushes commit one transaction at a time after a pop found its consumers behind.
const YIELD_FOR: Duration = Duration::from_millis(250);

/// Meanwhile the committer pauses after each transaction 1 ms for every `REST_PER_LAG` ms the
/// popped message waited beyond `QUEEN_CONSUMER_LAG_MS`,
const REST_PER_LAG: u64 = 4;

/// up to this long.
const MAX_REST: Duration = Duration::from_millis(30);

/// When the oldest message of this pop waited at least `QUEEN_CONSUMER_LAG_MS` since it became
/// visible (since this broker committed its segment; for a segment read from PostgreSQL, since
/// the push arrived), its consumers are behind: for a while, pushes commit one transaction at a
/// time (fuller transactions, cheaper per message, and CPU left to the consumers) rather than
/// spilling into parallel ones,
/// and pause between transactions the longer the further behind the consumers are, so the
/// producers (whose pushes are answered later) slow down to what the consumers can follow.
fn yield_to_consumers(state: &AppState, decoded: &Decoded<'_>) {
    let lag = state.settings.consumer_lag;
    if lag.is_zero() {
        return;
    }
    // Measured from the commit, not the push's arrival: a push waits for its commit longer
    // while pushes are held back for the consumers, and counting that wait would keep them
    // held back.
    let now = Utc::now().timestamp_micros();
    let waited = decoded
        .iter()
        .filter_map(|(d, frames)| match d.visible_since() {
            Some(at) => i64::try_from(at.elapsed().as_micros()).ok(),
            None => frames
                .first()
                .map(|(_, f)| now.saturating_sub(f.created_at_micros)),
        })
        .max();
    let Some(waited) = waited else {
        return;
    };
    let lag_us = i64::try_from(lag.as_micros()).unwrap_or(i64::MAX);
    if waited >= lag_us {
        // The further behind, the longer each pause between push transactions.
        let behind = u64::try_from(waited - lag_us).unwrap_or(0);
        let rest = Duration::from_micros(behind / REST_PER_LAG).min(MAX_REST);
        state.committers.serialize_for(YIELD_FOR, rest);
    }
}

/// `write!` into a `Vec<u8>`, which cannot fail.
macro_rules! write {
    ($out:expr, $($arg:tt)*) => {
        std::io::Write::write_fmt(&mut $out, format_args!($($arg)*))
            .expect("writing to a Vec cannot fail")
    };
}

/// The delivered frames of each delivery, decoded once for the answer and the metrics.
type Decoded<'p> = Vec<(&'p Delivery, Vec<(i64, Frame<'p>)>)>;

/// Decodes the delivered frames of every delivery of `popped`.
fn decode(popped: &Popped) -> Result<Decoded<'_>, ApiError> {
    let mut decoded = Vec::with_capacity(popped.deliveries.len());
    for d in &popped.deliveries {
        let frames = d.frames().map_err(|source| StorageError::CorruptSegment {
            partition: d.partition_id,
            source,
        })?;
        decoded.push((d, frames));
    }
    Ok(decoded)
}

/// Writes the pop answer (§4.3) straight from the stored frames: every payload was validated
/// JSON when it was pushed and is stored verbatim, so it is copied into the body as it is,
/// never parsed again. The other fields are JSON-escaped strings, UUIDs and integers.
fn respond(
    popped: &Popped,
    decoded: &Decoded<'_>,
    group: &str,
    key: Option<&PayloadKey>,
) -> Result<HttpResponse, ApiError> {
    let lease = popped.lease_id.map(|l| l.to_string()).unwrap_or_default();
    let first = popped
        .deliveries
        .first()
        .expect("a pop that yielded has a delivery");
    let size = 256
        + decoded
            .iter()
            .flat_map(|(_, frames)| frames.iter().map(|(_, f)| f.payload.len() + 400))
            .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    let lease_json = json_str(&lease);
    let group_json = json_str(group);
    let queue_json = json_str(&popped.queue);
    out.extend_from_slice(b"{\"success\":true,\"queue\":");
    out.extend_from_slice(queue_json.as_bytes());
    out.extend_from_slice(b",\"partition\":");
    out.extend_from_slice(json_str(&first.partition).as_bytes());
    write!(
        out,
        ",\"partitionId\":\"{}\",\"leaseId\":",
        first.partition_uuid
    );
    out.extend_from_slice(lease_json.as_bytes());
    out.extend_from_slice(b",\"consumerGroup\":");
    out.extend_from_slice(group_json.as_bytes());
    out.extend_from_slice(b",\"messages\":[");
    let mut comma = false;
    let mut uuid_buf = uuid::Uuid::encode_buffer();
    for (d, frames) in decoded {
        let partition_json = json_str(&d.partition);
        let partition_uuid = d.partition_uuid.hyphenated().to_string();
        let retry_count = d.retry_count.to_string();
        for (_, f) in frames {
            let opened;
            let payload = if f.encrypted {
                match crypto::open_with(key, f.payload) {
                    Ok(text) => {
                        opened = text;
                        opened.as_str()
                    }
                    Err(e) => {
                        tracing::error!(message_id = %f.id, queue = %popped.queue,
                            partition = %d.partition, error = %e,
                            "a stored payload cannot be decrypted; message left out of the pop");
                        continue;
                    }
                }
            } else {
                f.payload
            };
            if comma {
                out.push(b',');
            }
            comma = true;
            out.extend_from_slice(b"{\"id\":\"");
            out.extend_from_slice(f.id.hyphenated().encode_lower(&mut uuid_buf).as_bytes());
            out.extend_from_slice(b"\",\"transactionId\":");
            push_json_str(&mut out, f.transaction_id);
            out.extend_from_slice(b",\"partitionId\":\"");
            out.extend_from_slice(partition_uuid.as_bytes());
            out.extend_from_slice(b"\",\"partition\":");
            out.extend_from_slice(partition_json.as_bytes());
            out.extend_from_slice(b",\"queue\":");
            out.extend_from_slice(queue_json.as_bytes());
            out.extend_from_slice(b",\"leaseId\":");
            out.extend_from_slice(lease_json.as_bytes());
            out.extend_from_slice(b",\"consumerGroup\":");
            out.extend_from_slice(group_json.as_bytes());
            out.extend_from_slice(b",\"createdAt\":\"");
            push_micros_iso(&mut out, f.created_at_micros);
            out.extend_from_slice(b"\",\"data\":");
            out.extend_from_slice(payload.as_bytes());
            out.extend_from_slice(b",\"producerSub\":");
            push_opt_json_str(&mut out, f.producer_sub);
            out.extend_from_slice(b",\"traceId\":");
            push_opt_json_str(&mut out, f.trace_id);
            out.extend_from_slice(b",\"retryCount\":");
            out.extend_from_slice(retry_count.as_bytes());
            out.push(b'}');
        }
    }
    if !comma {
        // Every message failed to open (logged above): nothing to deliver.
        return Ok(HttpResponse::NoContent().finish());
    }
    write!(out, "],\"partitionsClaimed\":{}}}", popped.deliveries.len());
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "application/json"))
        .body(out))
}

/// A string as a JSON string literal.
fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

/// Appends a string as a JSON string literal.
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("a string serialises into a Vec");
}

/// Appends an optional string as a JSON string literal or `null`.
fn push_opt_json_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => push_json_str(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn query_is_read_the_way_queen_reads_it() {
        let d = Defaults {
            batch: 1,
            timeout: Duration::from_millis(30_000),
            subscription_new: false,
        };
        let p = PopParams::parse(&q(&[]), d);
        assert_eq!(
            (p.batch, p.partitions, p.wait, p.auto_ack),
            (1, 1, false, false)
        );
        assert_eq!(p.group, QUEUE_MODE);
        assert_eq!(p.timeout, Duration::from_millis(30_000));
        let p = PopParams::parse(
            &q(&[
                ("batch", "0"),
                ("wait", "1"),
                ("autoAck", "yes"),
                ("timeout", "abc"),
                ("consumerGroup", "g"),
                ("subscriptionMode", "new-only"),
            ]),
            d,
        );
        assert_eq!((p.batch, p.wait, p.auto_ack), (1, true, false));
        assert_eq!(p.timeout, Duration::from_millis(30_000));
        assert_eq!(p.start, SubscriptionStart::New);
        let p = PopParams::parse(&q(&[("subscriptionFrom", "2024-01-02T03:04:05Z")]), d);
        assert!(matches!(p.start, SubscriptionStart::From(_)));
        let p = PopParams::parse(&q(&[("subscriptionFrom", "yesterday")]), d);
        assert_eq!(p.start, SubscriptionStart::All);
    }

    #[test]
    fn the_default_settings_decide_what_the_query_leaves_out() {
        let d = Defaults {
            batch: 50,
            timeout: Duration::from_millis(2_000),
            subscription_new: true,
        };
        let p = PopParams::parse(&q(&[("consumerGroup", "g")]), d);
        assert_eq!((p.batch, p.timeout), (50, Duration::from_millis(2_000)));
        assert_eq!(p.start, SubscriptionStart::New);
        let p = PopParams::parse(&q(&[("batch", "3"), ("subscriptionMode", "all")]), d);
        assert_eq!((p.batch, p.start), (3, SubscriptionStart::All));
    }
}

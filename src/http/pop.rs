//! `GET /api/v1/pop/queue/{queue}`, `.../partition/{partition}` and `GET /api/v1/pop`
//! (namespace/task): parse the query, run the pop (long-polling with `wait=true`), and write
//! the messages out with their payloads verbatim (reference §4).
//!
//! The handler never decides who gets what: that is `storage::consume`, in PostgreSQL. It
//! only waits (on the wake hub, with a periodic re-check for lease expiry and delayed
//! messages) and formats.
//!
//! The payloads of an encrypted queue are opened where the answer is written (`respond`); a
//! message whose payload cannot be opened stops its partition there: the answer holds the
//! messages before it only, and `storage::queues::undecryptable` keeps the cursor from passing it
//! (nothing sealed or unauthenticated reaches a consumer, and nothing is skipped).
//!
//! The 2.x extensions (reference §2.8, docs/consuming-2x.md): `autopilot=true` lets the broker
//! size the knobs the query leaves out (`storage::consume::autopilot`) and echoes what it chose
//! with a wait advice; `conflation=true` asks for last-value delivery (a stored policy of the
//! group, `storage::consume::conflate`) and every answer of a conflating pop says so;
//! `leaseSeconds` sets the pop's own lease length. An answer that must carry one of these
//! echoes is a 200 with a body even when empty; any other empty answer stays a 204. A query
//! parameter the broker does not know is ignored (a 4xx would end a 2.x consumer).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};

use crate::http::error::{with_db, ApiError};
use crate::http::PeerSocket;
use crate::protocol::pop_framed;
use crate::protocol::time::push_micros_iso;
use crate::settings::Settings;
use crate::state::AppState;
use crate::storage::consume::autopilot::{self, Knobs, Seen};
use crate::storage::consume::conns::LazyConn;
use crate::storage::consume::lease_length::MAX_LEASE_SECONDS;
use crate::storage::consume::{self, Delivery, PopRequest, Popped, SubscriptionStart, QUEUE_MODE};
use crate::storage::queues::undecryptable;
use crate::storage::segments::cache::WOKEN_FULL_POP_EVERY;
use crate::storage::segments::crypto::{self, PayloadKey};
use crate::storage::segments::frames::Frame;
use crate::storage::StorageError;
use crate::wake::WakeKey;

/// `write!` into a `Vec<u8>`, which cannot fail.
macro_rules! write {
    ($out:expr, $($arg:tt)*) => {
        std::io::Write::write_fmt(&mut $out, format_args!($($arg)*))
            .expect("writing to a Vec cannot fail")
    };
}

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

/// The query of the three pop routes, interpreted as Queen does (§1, §4.2; 2.x §2.8).
#[derive(Debug, Clone)]
struct PopParams {
    /// `batch` as the query gives it (`None`: left out, or not a number).
    batch: Option<usize>,
    /// `partitions` as the query gives it.
    partitions: Option<usize>,
    /// `DEFAULT_BATCH_SIZE`, for a pop that leaves `batch` out without autopilot.
    default_batch: usize,
    /// `autopilot=true`: the broker sizes what the query leaves out, and says what it chose.
    autopilot: bool,
    wait: bool,
    timeout: Duration,
    group: String,
    auto_ack: bool,
    start: SubscriptionStart,
    namespace: Option<String>,
    task: Option<String>,
    /// `conflation=true`.
    conflation: bool,
    /// `leaseSeconds`.
    lease_seconds: Option<i32>,
    /// `frames=true`: answer `QPF1` (docs/binary-wire.md) where the messages allow it.
    frames: bool,
}

fn flag(q: &HashMap<String, String>, key: &str) -> bool {
    matches!(q.get(key).map(String::as_str), Some("true" | "1"))
}

fn int<T: std::str::FromStr>(q: &HashMap<String, String>, key: &str, default: T) -> T {
    q.get(key)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// A count parameter: `None` when absent or not a number, at least 1 otherwise.
fn count(q: &HashMap<String, String>, key: &str) -> Option<usize> {
    q.get(key)
        .and_then(|v| v.trim().parse::<i64>().ok())
        .map(|n| usize::try_from(n.max(1)).unwrap_or(usize::MAX))
}

impl PopParams {
    /// Reads the query; an unknown parameter is ignored, a value past its bounds or a
    /// combination the protocol refuses is a 400 naming it.
    fn parse(q: &HashMap<String, String>, defaults: Defaults) -> Result<Self, ApiError> {
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
        let lease_seconds = match q.get("leaseSeconds") {
            None => None,
            Some(v) => Some(
                v.trim()
                    .parse::<i32>()
                    .ok()
                    .filter(|n| (1..=MAX_LEASE_SECONDS).contains(n))
                    .ok_or_else(|| {
                        ApiError::BadRequest(format!(
                            "leaseSeconds must be a whole number of seconds from 1 to {MAX_LEASE_SECONDS}, got {v:?}"
                        ))
                    })?,
            ),
        };
        let conflation = flag(q, "conflation");
        let auto_ack = flag(q, "autoAck");
        if conflation && group == QUEUE_MODE {
            return Err(ApiError::BadRequest(
                "conflation=true needs a consumerGroup: conflation is a policy of a consumer group"
                    .into(),
            ));
        }
        if conflation && auto_ack {
            return Err(ApiError::BadRequest(
                "conflation=true cannot be combined with autoAck=true".into(),
            ));
        }
        Ok(Self {
            batch: count(q, "batch"),
            partitions: count(q, "partitions"),
            default_batch: defaults.batch.max(1),
            autopilot: flag(q, "autopilot"),
            wait: flag(q, "wait"),
            timeout: Duration::from_millis(int(q, "timeout", defaults.timeout.as_millis() as u64)),
            group,
            auto_ack,
            start,
            namespace: q.get("namespace").filter(|v| !v.is_empty()).cloned(),
            task: q.get("task").filter(|v| !v.is_empty()).cloned(),
            conflation,
            lease_seconds,
            frames: flag(q, "frames"),
        })
    }

    /// The knobs of a pop that does not engage autopilot: what the query says, else the
    /// defaults (`DEFAULT_BATCH_SIZE`, one partition).
    fn plain_knobs(&self) -> Knobs {
        Knobs {
            batch: self.batch.unwrap_or(self.default_batch),
            partitions: self.partitions.unwrap_or(1),
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
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    serve(
        &state,
        &PopParams::parse(&query, Defaults::of(&state.settings))?,
        Source::Queue(path.into_inner()),
        PeerSocket::of(&req),
    )
    .await
}

/// `GET /api/v1/pop/queue/{queue}/partition/{partition}`.
pub async fn pop_partition(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (queue, partition) = path.into_inner();
    serve(
        &state,
        &PopParams::parse(&query, Defaults::of(&state.settings))?,
        Source::Partition(queue, partition),
        PeerSocket::of(&req),
    )
    .await
}

/// `GET /api/v1/pop?namespace=..&task=..` (§4.7): the first matching queue that yields.
pub async fn pop_matching(
    req: HttpRequest,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let params = PopParams::parse(&query, Defaults::of(&state.settings))?;
    let source = Source::Matching(params.namespace.clone(), params.task.clone());
    serve(&state, &params, source, PeerSocket::of(&req)).await
}

/// What an answer says about conflation (reference §2.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Conflation {
    /// Nothing: the pop did not ask, and no conflating policy was seen.
    Silent,
    /// `"conflation": true`: the pop was served as the group's conflating policy says (every
    /// such answer carries it, empty ones too).
    Applied,
    /// `"conflationConflict": true` and no `conflation` key: the pop asked for conflation and
    /// the group's stored policy is not conflating (the stored policy wins).
    Conflict,
}

impl Conflation {
    /// The echo of a pop that asked for conflation (`requested`) when the group's stored policy
    /// is `stored` (`None`: not read, e.g. the queue does not exist yet).
    fn of(requested: bool, stored: Option<bool>) -> Self {
        match (requested, stored) {
            (true, Some(false)) => Self::Conflict,
            (true, _) | (false, Some(true)) => Self::Applied,
            (false, _) => Self::Silent,
        }
    }
}

/// What a pop answer carries beyond the messages.
#[derive(Debug, Clone, Copy)]
struct Echo {
    /// The knobs autopilot ran with and its wait advice (ms), when the pop engaged it.
    autopilot: Option<(Knobs, u64)>,
    conflation: Conflation,
}

impl Echo {
    /// Whether an empty answer must be a body (else a 204).
    fn needs_body(&self) -> bool {
        self.autopilot.is_some() || self.conflation != Conflation::Silent
    }

    /// The echo keys, each with a leading comma, for the end of the answer object.
    fn write(&self, out: &mut Vec<u8>) {
        if let Some((knobs, wait_ms)) = self.autopilot {
            write!(
                *out,
                ",\"autopilot\":{{\"partitions\":{},\"batch\":{},\"waitMs\":{}}}",
                knobs.partitions, knobs.batch, wait_ms
            );
        }
        match self.conflation {
            Conflation::Silent => {}
            Conflation::Applied => out.extend_from_slice(b",\"conflation\":true"),
            Conflation::Conflict => out.extend_from_slice(b",\"conflationConflict\":true"),
        }
    }
}

/// The answer of a pop that hands nothing out: 204, or, when the echo must be said, 200 with
/// `{"success": true, "messages": [], "partitionsClaimed": 0, ...echo}`.
fn nothing(echo: &Echo) -> HttpResponse {
    if !echo.needs_body() {
        return HttpResponse::NoContent().finish();
    }
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"{\"success\":true,\"messages\":[],\"partitionsClaimed\":0");
    echo.write(&mut out);
    out.push(b'}');
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "application/json"))
        .body(out)
}

/// Who the autopilot learns about: the pop's scope (queue; queue and partition; namespace and
/// task) as one key. Names never hold NUL (`http::inputs`), so NUL separates them.
fn scope(source: &Source) -> String {
    match source {
        Source::Queue(q) => q.clone(),
        Source::Partition(q, p) => format!("{q}\u{0}{p}"),
        Source::Matching(ns, task) => format!(
            "\u{0}{}\u{0}{}",
            ns.as_deref().unwrap_or(""),
            task.as_deref().unwrap_or("")
        ),
    }
}

/// The knobs of this pop: the autopilot's choice for what the query leaves out (reading the
/// ready partitions once when it has not seen the pair yet), or the plain defaults.
async fn knobs(
    state: &AppState,
    params: &PopParams,
    source: &Source,
    scope: &str,
) -> Result<Knobs, ApiError> {
    if !params.autopilot {
        return Ok(params.plain_knobs());
    }
    let mut ready = 0;
    if let Source::Queue(queue) = source {
        if params.partitions.is_none() {
            if state.autopilot.first_sight(scope, &params.group) {
                ready = with_db(state, async {
                    let mut conn = state.lease_pool.acquire().await?;
                    autopilot::ready_partitions(&mut conn, queue, &params.group).await
                })
                .await?;
            }
            // Partitions this broker's acks released with messages left are ready too.
            ready += state.handoffs.waiting(queue, &params.group);
        }
    }
    Ok(state
        .autopilot
        .choose(scope, &params.group, params.batch, params.partitions, ready))
}

/// Runs pop attempts until one yields, or once without `wait`, or until the timeout; after a
/// wait, only while the client (`peer`) is still there.
async fn serve(
    state: &AppState,
    params: &PopParams,
    source: Source,
    peer: Option<PeerSocket>,
) -> Result<HttpResponse, ApiError> {
    if state.flags.pop_maintenance() {
        // Nothing is handed out. An echo the client waits for is still said: a conflating
        // consumer takes a silent answer for a broker without conflation, and autopilot
        // advises the longest wait.
        return Ok(nothing(&Echo {
            autopilot: params
                .autopilot
                .then(|| (params.plain_knobs(), autopilot::MAX_WAIT_MS)),
            conflation: Conflation::of(params.conflation, None),
        }));
    }
    let scope = scope(&source);
    let knobs = knobs(state, params, &source, &scope).await?;
    // What autopilot learns from this pop's answer, and the echo it gets.
    let echo = |seen: Seen, stored: Option<bool>| Echo {
        autopilot: params.autopilot.then(|| {
            let wait_ms = state.autopilot.learn(
                &scope,
                &params.group,
                knobs,
                seen,
                params.batch.is_none(),
                params.partitions.is_none(),
            );
            (knobs, wait_ms)
        }),
        conflation: Conflation::of(params.conflation, stored),
    };
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
    let mut waited = false;
    // The group's stored conflation policy, as the last look that read it saw it.
    let mut stored: Option<bool> = None;
    loop {
        if waited && peer.is_some_and(PeerSocket::gone) {
            // The consumer hung up while waiting: nothing is claimed for it.
            return Ok(HttpResponse::NoContent().finish());
        }
        waited = true;
        // Enabled before PostgreSQL is read, so a push committing in between still wakes us.
        let notified = waiter.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();

        let looked = with_db(state, async {
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
                batch: knobs.batch,
                partitions: knobs.partitions,
                auto_ack: params.auto_ack,
                start: params.start.clone(),
                owner: &state.broker_id,
                cache: &state.cache,
                woken: params.wait,
                handoffs: &state.handoffs,
                claims: &state.claims,
                ahead: &state.ahead,
                conflation: params.conflation,
                lease_seconds: params.lease_seconds,
            };
            match &source {
                Source::Matching(ns, task) => {
                    consume::pop_matching(&mut conn, ns.as_deref(), task.as_deref(), &req).await
                }
                _ => consume::pop(&mut conn, &req).await,
            }
        })
        .await?;
        stored = looked.conflation.or(stored);
        if let Some(popped) = looked.popped {
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
            if params.wait && messages >= knobs.batch {
                state.wake.pass_on(&key);
            }
            let seen = Seen {
                messages,
                partitions: popped.deliveries.len(),
                left: popped.deliveries.iter().map(|d| d.left).sum(),
            };
            let echo = echo(seen, stored);
            let mut cuts = Vec::new();
            let framed = if params.frames {
                respond_framed(state, &popped, &decoded, &params.group, &mut cuts, &echo)
            } else {
                None
            };
            let answer = match framed {
                Some(answer) => answer,
                None => respond(
                    &popped,
                    &decoded,
                    &params.group,
                    state.payload_key.as_ref(),
                    &mut cuts,
                    &echo,
                ),
            };
            stop_at_unopenable(state, &popped, params, cuts).await?;
            return answer;
        }
        let now = Instant::now();
        if !params.wait || now >= deadline {
            return Ok(nothing(&echo(Seen::default(), stored)));
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

/// A message `respond` could not open: its delivery (index in `Popped::deliveries`), offset,
/// id and why. The answer holds nothing of that delivery from there on.
type Cut = (usize, i64, uuid::Uuid, crypto::CryptoError);

/// Stops the cursor of each cut partition at its unopenable message (logged, counted, listed
/// in `GET /api/v1/system/undecryptable`), and clears the stop of the partitions delivered in
/// full.
async fn stop_at_unopenable(
    state: &AppState,
    popped: &Popped,
    params: &PopParams,
    cuts: Vec<Cut>,
) -> Result<(), ApiError> {
    for (i, d) in popped.deliveries.iter().enumerate() {
        if !cuts.iter().any(|c| c.0 == i) {
            state
                .undecryptable
                .delivered(&popped.queue, &d.partition, &params.group);
        }
    }
    for (i, offset, message_id, error) in cuts {
        let d = &popped.deliveries[i];
        let held = with_db(state, async {
            let mut conn = state.pool.acquire().await?;
            undecryptable::hold_at(
                &mut conn,
                d.partition_id,
                &params.group,
                offset,
                params.auto_ack,
            )
            .await
        })
        .await?;
        tracing::error!(queue = %popped.queue, partition = %d.partition,
            consumer_group = %params.group, offset, message_id = %message_id, error = %error, held,
            "a stored payload cannot be decrypted with this broker's key; the partition stops there for the group until a broker with the right key pops it");
        state.metrics.undecryptable();
        state.undecryptable.record(undecryptable::Stop {
            queue: popped.queue.clone(),
            partition: d.partition.clone(),
            partition_id: d.partition_uuid,
            consumer_group: params.group.clone(),
            offset,
            message_id,
            error: error.to_string(),
            since: crate::protocol::time::iso_millis(Utc::now()),
            pops: 1,
        });
    }
    Ok(())
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
    cuts: &mut Vec<Cut>,
    echo: &Echo,
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
    for (i, (d, frames)) in decoded.iter().enumerate() {
        let partition_json = json_str(&d.partition);
        let partition_uuid = d.partition_uuid.hyphenated().to_string();
        let retry_count = d.retry_count.to_string();
        for (offset, f) in frames {
            let opened;
            let payload = if f.encrypted {
                match crypto::open_with(key, f.payload) {
                    Ok(text) => {
                        opened = text;
                        opened.as_str()
                    }
                    Err(e) => {
                        // Nothing from here on: the cursor must not pass this message.
                        cuts.push((i, *offset, f.id, e));
                        break;
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
        // The first message of every delivery failed to open (see `stop_at_unopenable`).
        return Ok(nothing(echo));
    }
    write!(out, "],\"partitionsClaimed\":{}", popped.deliveries.len());
    echo.write(&mut out);
    out.push(b'}');
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "application/json"))
        .body(out))
}

/// The framed answer `QPF1` (docs/binary-wire.md "Framed pop") of a pop that asked for
/// `frames=true`, with the same messages, lease, group and echo as [`respond`] writes. A claim
/// whose segments are in the framed layout sends its stored record frames as they are; the
/// others' messages are framed here. Records are compressed when the answer's payloads come to
/// `QUEEN_POP_FRAMES_COMPRESS_FROM` bytes (0: never). `None` when the answer cannot be framed,
/// and the caller answers JSON (which a client that asked for frames reads as well): a trace id
/// that is not a UUID (a frame carries 16 bytes; trace ids of transaction pushes are free text),
/// or a field too long for its length word.
fn respond_framed(
    state: &AppState,
    popped: &Popped,
    decoded: &Decoded<'_>,
    group: &str,
    cuts: &mut Vec<Cut>,
    echo: &Echo,
) -> Option<Result<HttpResponse, ApiError>> {
    let key = state.payload_key.as_ref();
    let mut claims = Vec::with_capacity(decoded.len());
    let mut payload_bytes = 0;
    // Sealed payloads are opened into `opened` before any claim borrows them; a cut found
    // there (an unopenable message) ends its claim's messages.
    let mut opened: Vec<Vec<String>> = Vec::with_capacity(decoded.len());
    let mut found_cuts = Vec::new();
    for (i, (_, frames)) in decoded.iter().enumerate() {
        let mut texts = Vec::new();
        for (offset, f) in frames.iter().filter(|(_, f)| f.encrypted) {
            match crypto::open_with(key, f.payload) {
                Ok(text) => texts.push(text),
                Err(e) => {
                    found_cuts.push((i, *offset, f.id, e));
                    break;
                }
            }
        }
        opened.push(texts);
    }
    for (i, (d, frames)) in decoded.iter().enumerate() {
        // Acks name the partition by the id this answer gives.
        state.cache.note_partition(d.partition_id, d.partition_uuid);
        let records = match d.stored_records() {
            Ok(Some(stored)) => {
                payload_bytes += stored.iter().map(|r| r.frames.len()).sum::<usize>();
                pop_framed::Records::Stored(
                    stored
                        .into_iter()
                        .map(|r| pop_framed::Record {
                            base_offset: u64::try_from(r.base_offset)
                                .expect("offsets are not negative"),
                            created_at_micros: r.created_at_micros,
                            count: r.count,
                            frames: r.frames,
                        })
                        .collect(),
                )
            }
            // Frames that decoded above and do not slice here are framed one by one.
            Ok(None) | Err(_) => {
                let cut_at = found_cuts
                    .iter()
                    .find(|(at, ..)| *at == i)
                    .map(|(_, offset, ..)| *offset);
                let mut sealed = opened[i].iter();
                let mut messages = Vec::with_capacity(frames.len());
                for (offset, f) in frames {
                    let trace_id = match f.trace_id {
                        None => None,
                        Some(t) => Some(uuid::Uuid::parse_str(t).ok()?),
                    };
                    if cut_at.is_some_and(|cut| *offset >= cut) {
                        // Nothing from the unopenable message on: the cursor must not pass it.
                        continue;
                    }
                    let payload = if f.encrypted {
                        sealed
                            .next()
                            .expect("an opened text per sealed frame before the cut")
                    } else {
                        f.payload
                    };
                    payload_bytes += payload.len();
                    messages.push(pop_framed::Message {
                        offset: u64::try_from(*offset).expect("offsets are not negative"),
                        id: f.id,
                        trace_id,
                        transaction_id: f.transaction_id,
                        producer_sub: f.producer_sub,
                        payload,
                        created_at_micros: f.created_at_micros,
                    });
                }
                pop_framed::Records::Messages(messages)
            }
        };
        let start = u64::try_from(d.first_offset).expect("offsets are not negative");
        claims.push(pop_framed::Claim {
            partition_id: u64::try_from(d.partition_id).expect("partition ids are positive"),
            partition: &d.partition,
            start,
            end: start + d.count.max(1) as u64 - 1,
            delivery_attempt: u32::try_from(d.retry_count.max(0))
                .unwrap_or(u32::MAX)
                .saturating_add(1),
            records,
        });
    }
    if claims.iter().all(|c| c.records.is_empty()) {
        // The first message of every delivery failed to open (see `stop_at_unopenable`).
        cuts.extend(found_cuts);
        return Some(Ok(nothing(echo)));
    }
    let mut own = Vec::new();
    echo.write(&mut own);
    let own = if own.is_empty() {
        String::new()
    } else {
        // `Echo::write` writes each key with a leading comma, for the end of an object.
        format!("{{{}}}", String::from_utf8_lossy(&own[1..]))
    };
    let lease = popped.lease_id.map(|l| l.to_string()).unwrap_or_default();
    let answer = pop_framed::Answer {
        own: &own,
        queue: &popped.queue,
        lease_id: &lease,
        consumer_group: group,
        claims,
    };
    let compress_from = state.settings.pop_frames_compress_from;
    let compress = compress_from > 0 && payload_bytes >= compress_from;
    let body = pop_framed::encode(&answer, compress).ok()?;
    cuts.extend(found_cuts);
    Some(Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, pop_framed::CONTENT_TYPE))
        .body(body)))
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

    const D: Defaults = Defaults {
        batch: 1,
        timeout: Duration::from_millis(30_000),
        subscription_new: false,
    };

    #[test]
    fn the_2x_parameters_are_read_and_their_bounds_are_400s() {
        let p = PopParams::parse(
            &q(&[
                ("autopilot", "true"),
                ("partitions", "3"),
                ("leaseSeconds", "86400"),
                ("conflation", "true"),
                ("consumerGroup", "g"),
                ("frames", "true"),
                ("somethingNew", "x"),
            ]),
            D,
        )
        .unwrap();
        assert!(p.autopilot && p.conflation);
        assert_eq!((p.batch, p.partitions), (None, Some(3)));
        assert_eq!(p.lease_seconds, Some(86_400));
        for bad in ["0", "86401", "-5", "1.5", "soon", ""] {
            let e = PopParams::parse(&q(&[("leaseSeconds", bad)]), D).unwrap_err();
            assert!(e.to_string().contains("leaseSeconds"), "{bad}: {e}");
        }
        let e = PopParams::parse(&q(&[("conflation", "true")]), D).unwrap_err();
        assert!(e.to_string().contains("consumerGroup"), "{e}");
        let e = PopParams::parse(
            &q(&[
                ("conflation", "true"),
                ("consumerGroup", "g"),
                ("autoAck", "true"),
            ]),
            D,
        )
        .unwrap_err();
        assert!(e.to_string().contains("autoAck"), "{e}");
        // conflation=false asks for nothing.
        assert!(PopParams::parse(&q(&[("conflation", "false"), ("autoAck", "true")]), D).is_ok());
    }

    #[test]
    fn the_echo_says_what_the_answer_must_say() {
        assert_eq!(Conflation::of(false, None), Conflation::Silent);
        assert_eq!(Conflation::of(false, Some(false)), Conflation::Silent);
        assert_eq!(Conflation::of(false, Some(true)), Conflation::Applied);
        assert_eq!(Conflation::of(true, None), Conflation::Applied);
        assert_eq!(Conflation::of(true, Some(true)), Conflation::Applied);
        assert_eq!(Conflation::of(true, Some(false)), Conflation::Conflict);
        let silent = Echo {
            autopilot: None,
            conflation: Conflation::Silent,
        };
        assert_eq!(nothing(&silent).status(), 204);
        let mut out = Vec::new();
        Echo {
            autopilot: Some((
                Knobs {
                    batch: 10,
                    partitions: 2,
                },
                100,
            )),
            conflation: Conflation::Conflict,
        }
        .write(&mut out);
        let v: serde_json::Value =
            serde_json::from_slice(&[b"{\"x\":0".as_slice(), &out, b"}"].concat()).unwrap();
        assert_eq!(v["autopilot"]["partitions"], 2);
        assert_eq!(v["autopilot"]["batch"], 10);
        assert_eq!(v["autopilot"]["waitMs"], 100);
        assert_eq!(v["conflationConflict"], true);
        assert!(v.get("conflation").is_none());
    }

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
        let p = PopParams::parse(&q(&[]), d).unwrap();
        let k = p.plain_knobs();
        assert_eq!(
            (k.batch, k.partitions, p.wait, p.auto_ack),
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
        )
        .unwrap();
        assert_eq!(
            (p.plain_knobs().batch, p.wait, p.auto_ack),
            (1, true, false)
        );
        assert_eq!(p.timeout, Duration::from_millis(30_000));
        assert_eq!(p.start, SubscriptionStart::New);
        let p = PopParams::parse(&q(&[("subscriptionFrom", "2024-01-02T03:04:05Z")]), d).unwrap();
        assert!(matches!(p.start, SubscriptionStart::From(_)));
        let p = PopParams::parse(&q(&[("subscriptionFrom", "yesterday")]), d).unwrap();
        assert_eq!(p.start, SubscriptionStart::All);
    }

    #[test]
    fn the_default_settings_decide_what_the_query_leaves_out() {
        let d = Defaults {
            batch: 50,
            timeout: Duration::from_millis(2_000),
            subscription_new: true,
        };
        let p = PopParams::parse(&q(&[("consumerGroup", "g")]), d).unwrap();
        assert_eq!(
            (p.plain_knobs().batch, p.timeout),
            (50, Duration::from_millis(2_000))
        );
        assert_eq!(p.start, SubscriptionStart::New);
        let p = PopParams::parse(&q(&[("batch", "3"), ("subscriptionMode", "all")]), d).unwrap();
        assert_eq!(
            (p.plain_knobs().batch, p.start),
            (3, SubscriptionStart::All)
        );
    }
}

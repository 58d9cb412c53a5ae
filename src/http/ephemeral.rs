//! The ephemeral queue routes (`/api/v1/ephemeral/*`, reference §2.7): configure, reset,
//! delete, push, pop (a real long poll), ack, queues and depth, over this broker's rings
//! (`crate::ephemeral`). Declarations are written to PostgreSQL (`storage::queues::ephemeral`) before
//! they take effect; nothing else here touches the database, except the one read of a queue's
//! declaration the first time this broker meets the queue.
//!
//! Only `depth` answers 404 (`ephemeral_queue_not_found`): push and pop create a queue they
//! do not know, reset answers `dropped: 0` and delete `deleted: false`.

use std::time::{Duration, Instant};

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::ephemeral::{
    AckStatus, EphemeralError, Options, DEFAULT_PARTITION, MAX_BATCH, QUEUE_MODE,
};
use crate::http::body::{parse_json, read_body};
use crate::http::error::{with_db, ApiError};
use crate::protocol::params::{check_name, check_text};
use crate::state::AppState;
use crate::storage::queues::ephemeral as declared;

/// Longest wait of a waiting pop (ms); a longer `timeout` is cut to it.
pub const MAX_WAIT_MS: u64 = 60_000;
/// A waiting pop looks again at least this often (a lease that ran out gives a message back
/// without a push; the upkeep wakes waiters too, this is the backstop).
const RECHECK: Duration = Duration::from_millis(500);

fn bad(text: impl Into<String>) -> ApiError {
    ApiError::Ephemeral(EphemeralError::BadRequest(text.into()))
}

/// A name field: non-empty and within the name rule.
fn checked_name(field: &str, value: &str) -> Result<(), ApiError> {
    if value.is_empty() {
        return Err(bad(format!("{field} must not be empty")));
    }
    check_name(field, value).map_err(|e| bad(e.0))
}

fn queue_of(body: &Value) -> Result<&str, ApiError> {
    let queue = body
        .get("queue")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("queue must be a string"))?;
    checked_name("queue", queue)?;
    Ok(queue)
}

/// Makes the queue known to this broker, with its stored declaration when it has one.
async fn ensure(state: &AppState, queue: &str) -> Result<(), ApiError> {
    if state.ephemeral.knows(queue) {
        return Ok(());
    }
    let stored = with_db(state, async {
        let mut conn = state.pool.acquire().await?;
        declared::get(&mut conn, queue).await
    })
    .await?;
    let options = stored.map(|o| Options::parse(Some(&o)).unwrap_or_default());
    state.ephemeral.ensure(queue, options);
    Ok(())
}

/// `POST /api/v1/ephemeral/configure` `{queue, options}` → `{configured, queue, options}`.
pub async fn configure(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let body = parse_json(&bytes)?;
    let queue = queue_of(&body)?;
    let options = Options::parse(body.get("options"))?;
    let stored = options.to_json();
    with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        declared::save(&mut conn, queue, &stored).await
    })
    .await?;
    state.ephemeral.configure(queue, options);
    Ok(HttpResponse::Ok().json(json!({ "configured": true, "queue": queue, "options": stored })))
}

/// `POST /api/v1/ephemeral/reset` `{queue}` → `{dropped}`.
pub async fn reset(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let body = parse_json(&bytes)?;
    let queue = queue_of(&body)?;
    Ok(HttpResponse::Ok().json(json!({ "dropped": state.ephemeral.reset(queue) })))
}

/// `DELETE /api/v1/ephemeral/queue/{queue}` → `{deleted}`: contents, cursors and declaration.
pub async fn delete(
    queue: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let was_declared = with_db(&state, async {
        let mut conn = state.pool.acquire().await?;
        declared::remove(&mut conn, &queue).await
    })
    .await?;
    let was_held = state.ephemeral.delete(&queue);
    Ok(HttpResponse::Ok().json(json!({ "deleted": was_declared || was_held })))
}

#[derive(Deserialize)]
struct PushBody {
    queue: String,
    #[serde(default)]
    partition: Option<String>,
    messages: Vec<PushMessage>,
}

#[derive(Deserialize)]
struct PushMessage {
    #[serde(default)]
    payload: Option<Box<RawValue>>,
}

/// `POST /api/v1/ephemeral/push` `{queue, partition?, messages: [{payload}]}` → `{pushed}`,
/// all or nothing. Without `partition` the messages go to `Default`.
pub async fn push(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let body: PushBody = serde_json::from_slice(&bytes).map_err(|e| {
        bad(format!(
            "body must be {{\"queue\", \"partition\"?, \"messages\": [{{\"payload\"}}]}}: {e}"
        ))
    })?;
    checked_name("queue", &body.queue)?;
    let partition = body.partition.as_deref().unwrap_or(DEFAULT_PARTITION);
    checked_name("partition", partition)?;
    if body.messages.is_empty() {
        return Ok(HttpResponse::Ok().json(json!({ "pushed": 0 })));
    }
    ensure(&state, &body.queue).await?;
    let payloads: Vec<String> = body
        .messages
        .into_iter()
        .map(|m| {
            m.payload
                .map_or_else(|| "null".to_string(), |p| p.get().to_string())
        })
        .collect();
    let pushed = state.ephemeral.push(&body.queue, partition, payloads)?;
    Ok(HttpResponse::Ok().json(json!({ "pushed": pushed })))
}

/// Query of the ephemeral pop.
#[derive(Debug, Deserialize)]
pub struct PopQuery {
    queue: Option<String>,
    partition: Option<String>,
    batch: Option<String>,
    wait: Option<String>,
    timeout: Option<String>,
    group: Option<String>,
    #[serde(rename = "autoAck")]
    auto_ack: Option<String>,
}

fn flag(value: Option<&str>) -> bool {
    matches!(value, Some("true" | "1" | "yes"))
}

/// `GET /api/v1/ephemeral/pop?queue=&partition=&batch=&wait=true&timeout=&group=&autoAck=`
/// → `{queue, messages: [{id, partition, payload, attempts}]}` (an empty list when nothing
/// came within the wait).
pub async fn pop(
    query: web::Query<PopQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let queue = query
        .queue
        .as_deref()
        .ok_or_else(|| bad("query parameter queue is required"))?;
    checked_name("queue", queue)?;
    let batch = match query.batch.as_deref() {
        None => 1,
        Some(b) => b
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_BATCH).contains(n))
            .ok_or_else(|| bad(format!("batch must be an integer from 1 to {MAX_BATCH}")))?,
    };
    let wait = flag(query.wait.as_deref());
    let timeout = match query.timeout.as_deref() {
        None => 30_000,
        Some(t) => t
            .parse::<u64>()
            .map_err(|_| bad("timeout must be a non-negative integer (ms)"))?
            .min(MAX_WAIT_MS),
    };
    let group = query
        .group
        .as_deref()
        .filter(|g| !g.is_empty())
        .unwrap_or(QUEUE_MODE);
    let partition = query.partition.as_deref().filter(|p| !p.is_empty());
    let auto_ack = flag(query.auto_ack.as_deref());
    ensure(&state, queue).await?;
    let deadline = Instant::now() + Duration::from_millis(if wait { timeout } else { 0 });
    let store = &state.ephemeral;
    let messages = loop {
        // Registered before looking, so a push between the look and the wait is not missed.
        let waker = store.waker(queue);
        let notified = waker.as_ref().map(|w| w.notified());
        tokio::pin!(notified);
        if let Some(n) = notified.as_mut().as_pin_mut() {
            n.enable();
        }
        let got = store.pop(queue, partition, group, batch, auto_ack);
        let now = Instant::now();
        if !got.is_empty() || now >= deadline {
            break got;
        }
        let nap = (deadline - now).min(RECHECK);
        match notified.as_mut().as_pin_mut() {
            Some(n) => {
                let _ = tokio::time::timeout(nap, n).await;
            }
            None => tokio::time::sleep(nap).await,
        }
    };
    let mut out = Vec::with_capacity(64 + messages.len() * 96);
    out.extend_from_slice(b"{\"queue\":");
    out.extend_from_slice(serde_json::to_string(queue).expect("string").as_bytes());
    out.extend_from_slice(b",\"messages\":[");
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"id\":\"");
        out.extend_from_slice(m.id.as_bytes());
        out.extend_from_slice(b"\",\"partition\":");
        out.extend_from_slice(
            serde_json::to_string(&m.partition)
                .expect("string")
                .as_bytes(),
        );
        out.extend_from_slice(b",\"payload\":");
        out.extend_from_slice(m.payload.as_bytes());
        out.extend_from_slice(format!(",\"attempts\":{}}}", m.attempts).as_bytes());
    }
    out.extend_from_slice(b"]}");
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(out))
}

/// `POST /api/v1/ephemeral/ack` `{queue, group?, acks: [{id, status?, error?}]}` →
/// `{results: [{id, outcome}]}`.
pub async fn ack(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let body = parse_json(&bytes)?;
    let queue = queue_of(&body)?;
    let group = match body.get("group") {
        None | Some(Value::Null) => QUEUE_MODE,
        Some(Value::String(g)) if g.is_empty() => QUEUE_MODE,
        Some(Value::String(g)) => {
            check_name("group", g).map_err(|e| bad(e.0))?;
            g.as_str()
        }
        Some(_) => return Err(bad("group must be a string")),
    };
    let acks = body
        .get("acks")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("acks must be an array"))?;
    let mut parsed = Vec::with_capacity(acks.len());
    for (i, a) in acks.iter().enumerate() {
        let id = a
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("acks[{i}].id must be a string")))?;
        let status = match a.get("status") {
            None | Some(Value::Null) => AckStatus::Completed,
            Some(Value::String(s)) => match s.as_str() {
                "completed" | "success" => AckStatus::Completed,
                "failed" | "retry" => AckStatus::Retry,
                other => {
                    return Err(bad(format!(
                        "acks[{i}].status must be completed, failed or retry, got {other:?}"
                    )))
                }
            },
            Some(Value::Bool(true)) => AckStatus::Completed,
            Some(Value::Bool(false)) => AckStatus::Retry,
            Some(_) => return Err(bad(format!("acks[{i}].status must be a string"))),
        };
        check_text(
            &format!("acks[{i}].error"),
            a.get("error").and_then(Value::as_str),
        )
        .map_err(|e| bad(e.0))?;
        parsed.push((id, status));
    }
    let results: Vec<Value> = parsed
        .into_iter()
        .map(|(id, status)| {
            let outcome = state.ephemeral.ack(queue, group, id, status);
            json!({ "id": id, "outcome": outcome.name() })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "results": results })))
}

/// `GET /api/v1/ephemeral/queues` → `{queues: [{queue, declared, length, bytes, partitions,
/// options, pushed, dropped}]}`: the queues this broker holds (declared ones included).
pub async fn queues(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "queues": state.ephemeral.list(),
        "usedBytes": state.ephemeral.used_bytes(),
        "budgetBytes": state.settings.ephemeral_max_bytes,
    }))
}

/// `GET /api/v1/ephemeral/queues/{queue}/depth` → the queue's gauges with per-group counts;
/// 404 `ephemeral_queue_not_found` when neither this broker nor PostgreSQL knows it.
pub async fn depth(
    queue: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if !state.ephemeral.knows(&queue) {
        let stored = with_db(&state, async {
            let mut conn = state.pool.acquire().await?;
            declared::get(&mut conn, &queue).await
        })
        .await?;
        match stored {
            Some(o) => state
                .ephemeral
                .ensure(&queue, Some(Options::parse(Some(&o)).unwrap_or_default())),
            None => return Err(EphemeralError::NotFound(queue.into_inner()).into()),
        }
    }
    state
        .ephemeral
        .depth(&queue)
        .map(|d| HttpResponse::Ok().json(d))
        .ok_or_else(|| EphemeralError::NotFound(queue.into_inner()).into())
}

//! Message traces (reference §9.4): `POST /api/v1/traces` (the SDKs' `message.trace()`),
//! `GET /api/v1/traces/{partitionId}/{transactionId}`, `/traces/by-name/{name}` and
//! `/traces/names`.
//!
//! One difference from Queen 0.15: a trace of an unknown message answers 404 (0.15: 500), since
//! the SDKs resend a 5xx twice more for nothing.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Map, Value};

use crate::http::body::{parse_json, read_body};
use crate::http::error::ApiError;
use crate::protocol::time::iso_millis;
use crate::protocol::Name;
use crate::state::AppState;
use crate::storage::observe::traces::{self, NewTrace, Trace};
use crate::storage::push::partitions;

/// A validated trace request.
#[derive(Debug, Clone, PartialEq)]
struct TraceRequest {
    /// `partitionId` as sent: the partition's UUID or its 64-bit id in decimal.
    partition: String,
    transaction_id: String,
    consumer_group: String,
    event_type: String,
    data: String,
    names: Vec<String>,
    worker_id: Option<String>,
}

/// A string field; absent, `null` or another type count as absent; at most 255 characters.
fn text(body: &Map<String, Value>, field: &str) -> Result<Option<String>, ApiError> {
    match body.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Name::new(s.as_str())
            .map(|n| Some(n.into_string()))
            .map_err(|too_long| ApiError::BadRequest(format!("{field} {too_long}"))),
        _ => Ok(None),
    }
}

fn parse_trace(body: &Value) -> Result<TraceRequest, ApiError> {
    let required = || ApiError::BadRequest("transactionId and partitionId are required".into());
    let body = body.as_object().ok_or_else(required)?;
    let transaction_id = text(body, "transactionId")?.ok_or_else(required)?;
    let partition = text(body, "partitionId")?.ok_or_else(required)?;
    let data = match body.get("data") {
        None | Some(Value::Null) => return Err(ApiError::BadRequest("data is required".into())),
        Some(v) => v.to_string(),
    };
    let names = match body.get("traceNames").or_else(|| body.get("traceName")) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::BadRequest("traceNames must be a string or an array of strings".into())
            })?,
        Some(_) => {
            return Err(ApiError::BadRequest(
                "traceNames must be a string or an array of strings".into(),
            ))
        }
    };
    for name in &names {
        Name::new(name.as_str())
            .map_err(|too_long| ApiError::BadRequest(format!("traceNames {too_long}")))?;
    }
    Ok(TraceRequest {
        // Neither form: no partition has that id, so the message is not found.
        partition,
        transaction_id,
        consumer_group: text(body, "consumerGroup")?
            .unwrap_or_else(|| "__QUEUE_MODE__".to_string()),
        event_type: text(body, "eventType")?.unwrap_or_else(|| "info".to_string()),
        data,
        names,
        worker_id: text(body, "workerId")?,
    })
}

/// `POST /api/v1/traces`.
pub async fn record(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let trace = parse_trace(&parse_json(&bytes)?)?;
    let not_found =
        || HttpResponse::NotFound().json(json!({"success": false, "error": "Message not found"}));
    let mut conn = state.pool.acquire().await?;
    let Some(partition) = partitions::uuid_of_text(&mut conn, &trace.partition).await? else {
        return Ok(not_found());
    };
    let recorded = traces::record(
        &mut conn,
        &NewTrace {
            partition,
            transaction_id: &trace.transaction_id,
            consumer_group: &trace.consumer_group,
            event_type: &trace.event_type,
            data: &trace.data,
            names: &trace.names,
            worker_id: trace.worker_id.as_deref(),
        },
    )
    .await?;
    Ok(match recorded {
        Some(id) => HttpResponse::Ok().json(json!({"success": true, "traceId": id})),
        None => not_found(),
    })
}

/// A trace as the read routes show it.
fn view(t: &Trace) -> Value {
    json!({
        "id": t.id,
        "transactionId": t.transaction_id,
        "partitionId": t.partition_uuid,
        "queueName": t.queue,
        "partitionName": t.partition,
        "eventType": t.event_type,
        // Stored from a parsed JSON value, so it parses back; a damaged row shows as text.
        "data": serde_json::from_str::<Value>(&t.data).unwrap_or_else(|_| Value::String(t.data.clone())),
        "consumerGroup": t.consumer_group,
        "workerId": t.worker_id,
        "createdAt": iso_millis(t.created_at),
        "traceNames": t.names,
    })
}

/// `GET /api/v1/traces/{partitionId}/{transactionId}`: the message's traces, oldest first.
pub async fn of_message(
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (partition, transaction_id) = path.into_inner();
    let mut conn = state.pool.acquire().await?;
    let list = match partitions::uuid_of_text(&mut conn, &partition).await? {
        Some(partition) => traces::of_message(&mut conn, partition, &transaction_id).await?,
        None => Vec::new(),
    };
    let views: Vec<Value> = list.iter().map(view).collect();
    Ok(HttpResponse::Ok().json(json!({"traces": views, "count": views.len()})))
}

fn page(q: &HashMap<String, String>, default_limit: i64) -> (i64, i64) {
    let int = |k: &str, d: i64| {
        q.get(k)
            .and_then(|v| v.trim().parse::<i64>().ok())
            .filter(|n| *n >= 0)
            .unwrap_or(d)
    };
    (int("limit", default_limit).clamp(1, 1000), int("offset", 0))
}

/// `GET /api/v1/traces/by-name/{name}?limit=100&offset=0`.
pub async fn by_name(
    path: web::Path<String>,
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (limit, offset) = page(&query, 100);
    let mut conn = state.pool.acquire().await?;
    let (list, total) = traces::by_name(&mut conn, &path, limit, offset).await?;
    let views: Vec<Value> = list.iter().map(view).collect();
    Ok(HttpResponse::Ok().json(json!({
        "traceName": path.as_str(),
        "traces": views,
        "total": total,
        "pagination": {"limit": limit, "offset": offset},
    })))
}

/// `GET /api/v1/traces/names?limit=50&offset=0`: most recently used first.
pub async fn names(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (limit, offset) = page(&query, 50);
    let mut conn = state.pool.acquire().await?;
    let (list, total) = traces::names(&mut conn, limit, offset).await?;
    let views: Vec<Value> = list
        .iter()
        .map(|n| {
            json!({
                "traceName": n.name,
                "traceCount": n.trace_count,
                "messageCount": n.message_count,
                "lastSeen": iso_millis(n.last_seen),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "traceNames": views,
        "total": total,
        "pagination": {"limit": limit, "offset": offset},
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: Value) -> String {
        parse_trace(&body).unwrap_err().to_string()
    }

    #[test]
    fn required_fields_and_types_are_named() {
        for body in [
            json!({}),
            json!({"transactionId": "t"}),
            json!({"partitionId": "p", "data": 1}),
            json!({"transactionId": 5, "partitionId": "p", "data": 1}),
            json!([1]),
        ] {
            assert_eq!(err(body), "transactionId and partitionId are required");
        }
        assert_eq!(
            err(json!({"transactionId": "t", "partitionId": "p"})),
            "data is required"
        );
        assert_eq!(
            err(json!({"transactionId": "t", "partitionId": "p", "data": {}, "traceNames": [1]})),
            "traceNames must be a string or an array of strings"
        );
        let r = parse_trace(&json!({"transactionId": "t", "partitionId": "not-a-uuid",
            "data": {"a": 1}, "traceNames": "flow", "consumerGroup": null}))
        .unwrap();
        assert_eq!(r.partition, "not-a-uuid");
        assert_eq!(
            (r.consumer_group.as_str(), r.event_type.as_str()),
            ("__QUEUE_MODE__", "info")
        );
        assert_eq!(r.names, ["flow"]);
        assert_eq!(r.data, r#"{"a":1}"#);
    }
}

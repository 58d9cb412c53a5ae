//! `POST /api/v1/configure` (reference §7): create a queue or replace all of its options.
//!
//! A full replace: every option left out (or `null`) goes back to its default, namespace and
//! task go back to "". The reply echoes the options now in force, `dedupWindowSeconds`
//! included, so a reset is visible. An option of the wrong type is a 400 naming it; so is
//! `encryptionEnabled: true` on a broker without `QUEEN_ENCRYPTION_KEY` (storing plaintext for a
//! queue that asked for encryption would be a lie). Unknown keys are ignored, as Queen does.
//! `maxQueueSize` (Queen's column name) is read as `maxSize` when `maxSize` is absent or 0.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Map, Value};

use crate::http::body::{parse_json, read_body};
use crate::http::error::ApiError;
use crate::protocol::Name;
use crate::state::AppState;
use crate::storage::queues::catalog::{self, QueueOptions};

/// A validated configure request.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigureRequest {
    /// Queue name.
    pub queue: String,
    /// Namespace ("" when absent or not a string).
    pub namespace: String,
    /// Task ("" when absent or not a string).
    pub task: String,
    /// Every option, defaults filled in.
    pub options: QueueOptions,
}

/// The request's `options` object; `null` counts as absent everywhere.
struct Options<'a>(&'a Map<String, Value>);

impl Options<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// An integer option; integral floats (`300.0`) count, anything else is a 400.
    fn int<T: TryFrom<i64>>(&self, name: &str, default: T, min: i64) -> Result<T, ApiError> {
        let Some(value) = self.get(name) else {
            return Ok(default);
        };
        let bad = || {
            let expected = if min == 0 {
                "a non-negative integer"
            } else {
                "an integer"
            };
            ApiError::BadRequest(format!("option {name} must be {expected}"))
        };
        let n = match value {
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                    .map(|f| f as i64)
            }),
            _ => None,
        }
        .filter(|n| *n >= min)
        .ok_or_else(bad)?;
        T::try_from(n).map_err(|_| ApiError::BadRequest(format!("option {name} is too large")))
    }

    fn boolean(&self, name: &str, default: bool) -> Result<bool, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::BadRequest(format!(
                "option {name} must be a boolean"
            ))),
        }
    }
}

/// Reads every option, defaults for the ones left out.
///
/// # Errors
///
/// [`ApiError::BadRequest`] naming the option.
pub fn parse_options(raw: &Map<String, Value>) -> Result<QueueOptions, ApiError> {
    let o = Options(raw);
    let d = QueueOptions::default();
    let mut parsed = QueueOptions {
        priority: o.int("priority", d.priority, i64::from(i32::MIN))?,
        lease_time: o.int("leaseTime", d.lease_time, 0)?,
        retry_limit: o.int("retryLimit", d.retry_limit, 0)?,
        retry_delay: o.int("retryDelay", d.retry_delay, 0)?,
        max_size: o.int("maxSize", d.max_size, 0)?,
        ttl: o.int("ttl", d.ttl, 0)?,
        dead_letter_queue: o.boolean("deadLetterQueue", d.dead_letter_queue)?,
        dlq_after_max_retries: o.boolean("dlqAfterMaxRetries", d.dlq_after_max_retries)?,
        delayed_processing: o.int("delayedProcessing", d.delayed_processing, 0)?,
        window_buffer: o.int("windowBuffer", d.window_buffer, 0)?,
        retention_seconds: o.int("retentionSeconds", d.retention_seconds, 0)?,
        completed_retention_seconds: o.int(
            "completedRetentionSeconds",
            d.completed_retention_seconds,
            0,
        )?,
        retention_enabled: o.boolean("retentionEnabled", d.retention_enabled)?,
        encryption_enabled: o.boolean("encryptionEnabled", d.encryption_enabled)?,
        max_wait_time_seconds: o.int("maxWaitTimeSeconds", d.max_wait_time_seconds, 0)?,
        dedup_window_seconds: o.int("dedupWindowSeconds", d.dedup_window_seconds, 0)?,
    };
    // Queen's server column is `maxQueueSize`; the clients send `maxSize`. Same option.
    let max_queue_size: i64 = o.int("maxQueueSize", 0, 0)?;
    if parsed.max_size == 0 {
        parsed.max_size = max_queue_size;
    }
    Ok(parsed)
}

/// A string field that may be absent, `null` or of another type (all mean ""), bounded in
/// length.
fn optional_name(body: &Map<String, Value>, field: &str) -> Result<String, ApiError> {
    let Some(Value::String(s)) = body.get(field) else {
        return Ok(String::new());
    };
    let name = Name::new(s.as_str())
        .map_err(|too_long| ApiError::BadRequest(format!("{field} {too_long}")))?;
    Ok(name.into_string())
}

/// Validates a configure body.
///
/// # Errors
///
/// [`ApiError::BadRequest`]: `queue is required`, an over-long name, or an option's problem.
pub fn parse_configure(body: &Value) -> Result<ConfigureRequest, ApiError> {
    let required = || ApiError::BadRequest("queue is required".into());
    let body = body.as_object().ok_or_else(required)?;
    let queue = match body.get("queue") {
        Some(Value::String(q)) if !q.is_empty() => Name::new(q.as_str())
            .map_err(|too_long| ApiError::BadRequest(format!("queue {too_long}")))?
            .into_string(),
        _ => return Err(required()),
    };
    let empty = Map::new();
    let options = match body.get("options") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(map)) => map,
        Some(_) => return Err(ApiError::BadRequest("options must be an object".into())),
    };
    Ok(ConfigureRequest {
        queue,
        namespace: optional_name(body, "namespace")?,
        task: optional_name(body, "task")?,
        options: parse_options(options)?,
    })
}

/// `POST /api/v1/configure`.
pub async fn configure(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let request = parse_configure(&parse_json(&bytes)?)?;
    if request.options.encryption_enabled && state.payload_key.is_none() {
        return Err(ApiError::BadRequest(
            "option encryptionEnabled needs QUEEN_ENCRYPTION_KEY (64 hexadecimal characters) \
             on the broker, and none is set"
                .into(),
        ));
    }
    let mut conn = state.pool.acquire().await?;
    let configured = catalog::configure(
        &mut conn,
        &request.queue,
        &request.namespace,
        &request.task,
        &request.options,
    )
    .await?;
    Ok(HttpResponse::Ok().json(json!({
        "configured": true,
        "queueId": configured.queue_uuid,
        "partitionId": configured.default_partition_uuid,
        "queue": request.queue,
        "namespace": request.namespace,
        "task": request.task,
        "options": request.options,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: Value) -> String {
        parse_configure(&body).unwrap_err().to_string()
    }

    #[test]
    fn omitted_options_take_their_defaults() {
        let r = parse_configure(&json!({"queue": "q", "namespace": 5, "task": null})).unwrap();
        assert_eq!(r.options, QueueOptions::default());
        assert_eq!((r.namespace.as_str(), r.task.as_str()), ("", ""));
        let r = parse_configure(&json!({"queue": "q", "options": {"leaseTime": null}})).unwrap();
        assert_eq!(r.options.lease_time, 300);
    }

    #[test]
    fn what_the_sdks_send_is_accepted() {
        let sdk = json!({"queue": "q", "namespace": null, "task": null, "options": {
            "leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0,
            "windowBuffer": 0, "maxSize": 0, "retentionSeconds": 0,
            "completedRetentionSeconds": 0, "encryptionEnabled": false}});
        assert_eq!(
            parse_configure(&sdk).unwrap().options,
            QueueOptions::default()
        );
    }

    #[test]
    fn a_wrongly_typed_option_is_named() {
        assert_eq!(
            err(json!({"queue": "q", "options": {"leaseTime": "60"}})),
            "option leaseTime must be a non-negative integer"
        );
        assert_eq!(
            err(json!({"queue": "q", "options": {"retryLimit": 1.5}})),
            "option retryLimit must be a non-negative integer"
        );
        assert_eq!(
            err(json!({"queue": "q", "options": {"dedupWindowSeconds": -1}})),
            "option dedupWindowSeconds must be a non-negative integer"
        );
        assert_eq!(
            err(json!({"queue": "q", "options": {"retentionEnabled": "true"}})),
            "option retentionEnabled must be a boolean"
        );
        assert_eq!(
            err(json!({"queue": "q", "options": {"leaseTime": 3_000_000_000_i64}})),
            "option leaseTime is too large"
        );
        assert_eq!(
            err(json!({"queue": "q", "options": 7})),
            "options must be an object"
        );
        let r =
            parse_configure(&json!({"queue": "q", "options": {"leaseTime": 60.0, "priority": -2}}))
                .unwrap();
        assert_eq!((r.options.lease_time, r.options.priority), (60, -2));
    }

    #[test]
    fn queue_is_required() {
        for body in [
            json!({}),
            json!({"queue": 3}),
            json!({"queue": ""}),
            json!([1]),
        ] {
            assert_eq!(err(body), "queue is required");
        }
    }

    #[test]
    fn size_limit_and_encryption_are_read() {
        let r = parse_configure(
            &json!({"queue": "q", "options": {"maxSize": 10, "encryptionEnabled": true}}),
        )
        .unwrap();
        assert_eq!(
            (r.options.max_size, r.options.encryption_enabled),
            (10, true)
        );
        let r =
            parse_configure(&json!({"queue": "q", "options": {"maxSize": 0, "maxQueueSize": 7}}))
                .unwrap();
        assert_eq!(r.options.max_size, 7);
        assert_eq!(
            err(json!({"queue": "q", "options": {"maxSize": "10"}})),
            "option maxSize must be a non-negative integer"
        );
        assert_eq!(
            err(json!({"queue": "q", "options": {"maxSize": -1}})),
            "option maxSize must be a non-negative integer"
        );
        assert_eq!(
            err(json!({"queue": "q", "options": {"encryptionEnabled": 1}})),
            "option encryptionEnabled must be a boolean"
        );
    }
}

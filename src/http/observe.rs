//! The outermost middleware: gives every request an id (the client's `X-Request-Id` when it
//! sends a usable one, else a fresh one), serves the request with that id on every log line
//! (`logging::with_request_id`), returns it as the `X-Request-Id` response header, counts the
//! request in the metrics (route pattern, method, status class, latency) and writes one
//! access line at debug level (target `queen_broker::access`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::web;

use crate::logging;
use crate::state::AppState;

/// The request id header, read and written.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A client's id is kept when it is 1-128 visible ASCII characters.
fn usable(id: &HeaderValue) -> Option<&str> {
    let text = id.to_str().ok()?;
    (!text.is_empty() && text.len() <= 128 && text.bytes().all(|b| b.is_ascii_graphic()))
        .then_some(text)
}

/// A fresh id: this process's random prefix and a counter (unique per process, cheap).
fn fresh_id() -> String {
    static PREFIX: OnceLock<String> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..12].to_string());
    format!("{prefix}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The middleware (`actix_web::middleware::from_fn(observe)`).
///
/// # Errors
///
/// None of its own; an error from inside is passed on (counted, without the id header).
pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let started = Instant::now();
    let id: Arc<str> = match req.headers().get(&REQUEST_ID).and_then(usable) {
        Some(given) => Arc::from(given),
        None => Arc::from(fresh_id()),
    };
    let metrics = req
        .app_data::<web::Data<AppState>>()
        .map(|s| s.metrics.clone());
    // (The request is not cloned before routing: actix needs it unshared to fill the match.)
    let mut res = match logging::with_request_id(id.clone(), next.call(req)).await {
        Ok(res) => res.map_into_boxed_body(),
        Err(e) => {
            // Handlers and the gate answer with responses; an error here has no request left
            // to answer with, so it is counted and passed on for actix to answer.
            let status = e.as_response_error().status_code().as_u16();
            if let Some(metrics) = metrics {
                metrics.request("unmatched", "-", status, started.elapsed());
            }
            tracing::debug!(target: "queen_broker::access", request_id = %id, status, "request failed before routing");
            return Err(e);
        }
    };
    let elapsed = started.elapsed();
    let status = res.status().as_u16();
    if let Ok(value) = HeaderValue::from_str(&id) {
        res.headers_mut().insert(REQUEST_ID, value);
    }
    let pattern = res.request().match_pattern();
    let route = pattern.as_deref().unwrap_or("unmatched");
    let method = res.request().method().as_str();
    if let Some(metrics) = metrics {
        metrics.request(route, method, status, elapsed);
    }
    tracing::debug!(
        target: "queen_broker::access",
        request_id = %id,
        method = %method,
        route = %route,
        path = %res.request().path(),
        status,
        latency_us = elapsed.as_micros() as u64,
        "request"
    );
    Ok(res)
}

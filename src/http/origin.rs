//! Browsers and origins: which origins may call the API from a page (`QUEEN_CORS_ORIGINS`,
//! written as `Access-Control-Allow-Origin`), and the refusal of cross-origin writes a browser
//! sends without a preflight.
//!
//! A page on any site can make a browser POST a form or `text/plain` body to the broker
//! without asking first (a "simple" request; CORS only hides the answer from the page). With
//! authentication off, that toggled maintenance mode from any web page. So a state-changing
//! request (any method but GET, HEAD, OPTIONS) that carries an `Origin` other than the broker's
//! own (`Host`) and whose content type is not JSON is answered 403 unless its origin is listed
//! by name in `QUEEN_CORS_ORIGINS` (`*` does not count). A JSON body makes the browser ask
//! first (preflight), and the SDKs and tools send no `Origin` at all: neither is affected.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::web;

use crate::http::error::ApiError;
use crate::state::AppState;

/// Whether `content_type` is JSON (`application/json`, `…+json`, with any parameters).
fn is_json(content_type: &str) -> bool {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// Whether `origin` (`scheme://host[:port]`) names the host the request was sent to.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else { return false };
    origin
        .split_once("://")
        .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(host))
}

/// The middleware (`actix_web::middleware::from_fn(origin::guard)`), outside the auth gate.
///
/// # Errors
///
/// None of its own; errors from inside are passed on.
pub async fn guard(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let allowed: Vec<String> = req
        .app_data::<web::Data<AppState>>()
        .map(|s| s.settings.cors_origins.clone())
        .unwrap_or_else(|| vec!["*".into()]);
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(origin) = &origin {
        let writes = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok());
        if writes
            && !is_json(&content_type)
            && !same_origin(origin, host)
            && !allowed.iter().any(|a| a == origin)
        {
            let refused = ApiError::CrossOriginWrite {
                method: req.method().to_string(),
                origin: origin.clone(),
                content_type,
            };
            return Ok(req.error_response(refused).map_into_boxed_body());
        }
    }
    let mut res = next.call(req).await?.map_into_boxed_body();
    let allow = if allowed.iter().any(|a| a == "*") {
        Some("*".to_string())
    } else {
        origin.filter(|o| allowed.iter().any(|a| a == o))
    };
    if let Some(value) = allow.and_then(|a| HeaderValue::from_str(&a).ok()) {
        let headers = res.headers_mut();
        if value != "*" {
            headers.insert(header::VARY, HeaderValue::from_static("Origin"));
        }
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_same_origin_are_recognised() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/merge-patch+json"));
        assert!(!is_json("text/plain"));
        assert!(!is_json(""));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(same_origin("http://127.0.0.1:6632", Some("127.0.0.1:6632")));
        assert!(!same_origin("http://evil.example", Some("127.0.0.1:6632")));
        assert!(!same_origin("null", Some("127.0.0.1:6632")));
    }
}

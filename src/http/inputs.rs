//! One check of every request's path parameters and query parameters before any handler runs
//! ([`crate::protocol::params::check_value`]): a NUL character, or a name past the name rule,
//! is a 400 naming the parameter, so no handler hands such a value to PostgreSQL.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Path, ResourceDef, ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::Error;

use crate::http::error::ApiError;
use crate::http::Route;
use crate::protocol::params::check_value;
use crate::protocol::ProtocolError;

/// The checks on one request's path and query; `patterns` are the route table's paths.
///
/// # Errors
///
/// [`ProtocolError`] naming the first parameter that breaks a rule.
pub fn check_request(
    patterns: &[ResourceDef],
    path: &str,
    query: &str,
) -> Result<(), ProtocolError> {
    // The literal head of a pattern rules most out with a string compare: a dynamic pattern's
    // match runs a regular expression, a few microseconds each (the router runs its own).
    for def in patterns
        .iter()
        .filter(|def| path.starts_with(Route::literal_head(def)))
    {
        let mut matched = Path::new(path.to_string());
        if def.capture_match_info(&mut matched) {
            for (name, value) in matched.iter() {
                check_value(name, value)?;
            }
            break;
        }
    }
    if path.contains('\0') {
        return Err(ProtocolError("path must not contain NUL characters".into()));
    }
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).unwrap_or_default();
    for (name, value) in &pairs {
        if name.contains('\0') {
            return Err(ProtocolError(
                "query parameter names must not contain NUL characters".into(),
            ));
        }
        check_value(name, value)?;
    }
    Ok(())
}

/// The middleware (through `actix_web::middleware::from_fn`); `patterns` are the paths of the
/// route table (`crate::http::route_patterns`).
///
/// # Errors
///
/// Whatever the inner service returns.
pub async fn checked(
    patterns: std::rc::Rc<Vec<ResourceDef>>,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let path = req.match_info().as_str().to_string();
    let verdict = check_request(&patterns, &path, req.query_string());
    if let Err(e) = verdict {
        return Ok(req.error_response(ApiError::from(e)));
    }
    next.call(req)
        .await
        .map(ServiceResponse::map_into_boxed_body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_query_parameters_are_named() {
        let p: Vec<ResourceDef> = [
            "/api/v1/pop/queue/{queue}",
            "/api/v1/pop/queue/{queue}/partition/{partition}",
            "/api/v1/consumer-groups/{group}",
            "/api/v1/messages",
        ]
        .into_iter()
        .map(ResourceDef::new)
        .collect();
        assert!(check_request(&p, "/api/v1/pop/queue/q", "consumerGroup=g&batch=5").is_ok());
        assert_eq!(
            check_request(&p, "/api/v1/pop/queue/q", "consumerGroup=g%00")
                .unwrap_err()
                .0,
            "consumerGroup must not contain NUL characters"
        );
        assert_eq!(
            check_request(&p, "/api/v1/pop/queue/q\0x", "")
                .unwrap_err()
                .0,
            "queue must not contain NUL characters"
        );
        let long = "g".repeat(256);
        assert_eq!(
            check_request(&p, &format!("/api/v1/consumer-groups/{long}"), "")
                .unwrap_err()
                .0,
            "group is longer than 255 characters"
        );
        assert_eq!(
            check_request(&p, "/api/v1/messages", "status=%00")
                .unwrap_err()
                .0,
            "status must not contain NUL characters"
        );
    }
}

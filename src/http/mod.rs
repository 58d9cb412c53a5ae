//! The HTTP routes (Queen's wire protocol, `../shared/reference/queen-http-api.md`).
//!
//! [`routes`] is the table of every route with its capability; [`configure`] registers exactly
//! those, so a route cannot exist without an access decision. The auth gate
//! (`crate::auth::Gate`) reads the same table for every request: a route added here is checked
//! with no other change, and with auth on a path missing from the table is never served.

pub mod body;
pub mod error;
pub mod health;
pub mod maintenance;
pub mod push;

use actix_web::http::{header, Method};
use actix_web::{web, HttpRequest, HttpResponse};

use crate::http::error::ApiError;

/// What a caller must be allowed to do to use a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Anyone.
    Public,
    /// Push messages.
    Produce,
    /// Pop, ack, renew leases.
    Consume,
    /// Both at once (`POST /api/v1/transaction`: pushes and acks in one transaction).
    ProduceAndConsume,
    /// Create and change queues and groups.
    Configure,
    /// Read-only views.
    Read,
    /// Operator actions.
    Admin,
}

/// One registered route.
pub struct Route {
    /// HTTP method.
    pub method: Method,
    /// Path pattern (actix syntax).
    pub path: &'static str,
    /// Who may call it.
    pub capability: Capability,
}

/// Every route the broker serves.
pub fn routes() -> Vec<Route> {
    vec![
        Route {
            method: Method::POST,
            path: "/api/v1/push",
            capability: Capability::Produce,
        },
        Route {
            method: Method::GET,
            path: "/health",
            capability: Capability::Public,
        },
        Route {
            method: Method::GET,
            path: "/health/live",
            capability: Capability::Public,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/system/maintenance",
            capability: Capability::Admin,
        },
        Route {
            method: Method::POST,
            path: "/api/v1/system/maintenance",
            capability: Capability::Admin,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/system/maintenance/pop",
            capability: Capability::Admin,
        },
        Route {
            method: Method::POST,
            path: "/api/v1/system/maintenance/pop",
            capability: Capability::Admin,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/system/shared-state",
            capability: Capability::Admin,
        },
    ]
}

/// Registers every route of [`routes`] with its handler.
pub fn configure(cfg: &mut web::ServiceConfig) {
    for route in routes() {
        let handler = match (route.method.as_str(), route.path) {
            ("POST", "/api/v1/push") => web::post().to(push::push),
            ("GET", "/health") => web::get().to(health::health),
            ("GET", "/health/live") => web::get().to(health::live),
            ("GET", "/api/v1/system/maintenance") => web::get().to(maintenance::get),
            ("POST", "/api/v1/system/maintenance") => web::post().to(maintenance::set),
            ("GET", "/api/v1/system/maintenance/pop") => web::get().to(maintenance::get_pop),
            ("POST", "/api/v1/system/maintenance/pop") => web::post().to(maintenance::set_pop),
            ("GET", "/api/v1/system/shared-state") => web::get().to(maintenance::shared_state),
            (method, path) => panic!("route {method} {path} is in the table but has no handler"),
        };
        cfg.route(route.path, handler);
    }
    cfg.default_service(web::to(fallback));
}

/// CORS preflight gets 204; everything else unmatched is the protocol's 404.
async fn fallback(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    if req.method() == Method::OPTIONS {
        return Ok(HttpResponse::NoContent().finish());
    }
    Err(ApiError::NoSuchRoute {
        method: req.method().to_string(),
        path: req.path().to_string(),
    })
}

/// The CORS headers every response carries.
pub fn cors_headers() -> actix_web::middleware::DefaultHeaders {
    actix_web::middleware::DefaultHeaders::new()
        .add((header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"))
        .add((
            header::ACCESS_CONTROL_ALLOW_METHODS,
            "GET, POST, PUT, DELETE, OPTIONS",
        ))
        .add((
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            "Content-Type, Authorization",
        ))
}

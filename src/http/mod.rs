//! The HTTP routes (Queen's wire protocol, `../shared/reference/queen-http-api.md`).
//!
//! [`ROUTES`] is the table of every route with its capability; [`configure`] registers exactly
//! those, so a route cannot exist without an access decision.

pub mod ack;
pub mod body;
pub mod dlq;
pub mod error;
pub mod groups;
pub mod health;
pub mod lease;
pub mod pop;
pub mod push;
pub mod transaction;

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
    /// Push and consume (`POST /api/v1/transaction`): needs both.
    Transaction,
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
            path: "/api/v1/pop/queue/{queue}",
            capability: Capability::Consume,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/pop/queue/{queue}/partition/{partition}",
            capability: Capability::Consume,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/pop",
            capability: Capability::Consume,
        },
        Route {
            method: Method::POST,
            path: "/api/v1/ack",
            capability: Capability::Consume,
        },
        Route {
            method: Method::POST,
            path: "/api/v1/ack/batch",
            capability: Capability::Consume,
        },
        Route {
            method: Method::POST,
            path: "/api/v1/lease/{lease_id}/extend",
            capability: Capability::Consume,
        },
        Route {
            method: Method::POST,
            path: "/api/v1/transaction",
            capability: Capability::Transaction,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/consumer-groups",
            capability: Capability::Read,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/consumer-groups/lagging",
            capability: Capability::Read,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/consumer-groups/{group}",
            capability: Capability::Read,
        },
        Route {
            method: Method::DELETE,
            path: "/api/v1/consumer-groups/{group}",
            capability: Capability::Admin,
        },
        Route {
            method: Method::DELETE,
            path: "/api/v1/consumer-groups/{group}/queues/{queue}",
            capability: Capability::Admin,
        },
        Route {
            method: Method::POST,
            path: "/api/v1/consumer-groups/{group}/subscription",
            capability: Capability::Configure,
        },
        Route {
            method: Method::POST,
            path: "/api/v1/consumer-groups/{group}/queues/{queue}/seek",
            capability: Capability::Configure,
        },
        Route {
            method: Method::POST,
            path: "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek",
            capability: Capability::Configure,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/dlq",
            capability: Capability::Read,
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
    ]
}

/// Registers every route of [`routes`] with its handler.
pub fn configure(cfg: &mut web::ServiceConfig) {
    for route in routes() {
        let handler = match (route.method.as_str(), route.path) {
            ("POST", "/api/v1/push") => web::post().to(push::push),
            ("GET", "/api/v1/pop/queue/{queue}") => web::get().to(pop::pop_queue),
            ("GET", "/api/v1/pop/queue/{queue}/partition/{partition}") => {
                web::get().to(pop::pop_partition)
            }
            ("GET", "/api/v1/pop") => web::get().to(pop::pop_matching),
            ("POST", "/api/v1/ack") => web::post().to(ack::ack),
            ("POST", "/api/v1/ack/batch") => web::post().to(ack::ack_batch),
            ("POST", "/api/v1/lease/{lease_id}/extend") => web::post().to(lease::extend),
            ("POST", "/api/v1/transaction") => web::post().to(transaction::transaction),
            ("GET", "/api/v1/consumer-groups") => web::get().to(groups::list),
            ("GET", "/api/v1/consumer-groups/lagging") => web::get().to(groups::lagging),
            ("GET", "/api/v1/consumer-groups/{group}") => web::get().to(groups::get),
            ("DELETE", "/api/v1/consumer-groups/{group}") => web::delete().to(groups::delete),
            ("DELETE", "/api/v1/consumer-groups/{group}/queues/{queue}") => {
                web::delete().to(groups::delete_for_queue)
            }
            ("POST", "/api/v1/consumer-groups/{group}/subscription") => {
                web::post().to(groups::subscription)
            }
            ("POST", "/api/v1/consumer-groups/{group}/queues/{queue}/seek") => {
                web::post().to(groups::seek_queue)
            }
            (
                "POST",
                "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek",
            ) => web::post().to(groups::seek_partition),
            ("GET", "/api/v1/dlq") => web::get().to(dlq::list),
            ("GET", "/health") => web::get().to(health::health),
            ("GET", "/health/live") => web::get().to(health::live),
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

//! The HTTP routes (Queen's wire protocol, `../shared/reference/queen-http-api.md`).
//!
//! [`routes`] is the table of every route with its capability; [`configure`] registers exactly
//! those, so a route cannot exist without an access decision. The auth gate
//! (`crate::auth::Gate`) reads the same table for every request: a route added here is checked
//! with no other change, and with auth on a path missing from the table is never served.

pub mod ack;
pub mod body;
pub mod configure;
pub mod dlq;
pub mod error;
pub mod groups;
pub mod health;
pub mod lease;
pub mod maintenance;
pub mod messages;
pub mod pop;
pub mod push;
pub mod resources;
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
            method: Method::POST,
            path: "/api/v1/configure",
            capability: Capability::Configure,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/resources/queues",
            capability: Capability::Read,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/resources/queues/{queue}",
            capability: Capability::Read,
        },
        Route {
            method: Method::DELETE,
            path: "/api/v1/resources/queues/{queue}",
            capability: Capability::Admin,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/resources/namespaces",
            capability: Capability::Read,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/resources/tasks",
            capability: Capability::Read,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/resources/overview",
            capability: Capability::Read,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/messages",
            capability: Capability::Read,
        },
        Route {
            method: Method::GET,
            path: "/api/v1/messages/{partitionId}/{transactionId}",
            capability: Capability::Read,
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
            capability: Capability::ProduceAndConsume,
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
            ("POST", "/api/v1/configure") => web::post().to(configure::configure),
            ("GET", "/api/v1/resources/queues") => web::get().to(resources::list_queues),
            ("GET", "/api/v1/resources/queues/{queue}") => web::get().to(resources::queue_detail),
            ("DELETE", "/api/v1/resources/queues/{queue}") => {
                web::delete().to(resources::delete_queue)
            }
            ("GET", "/api/v1/resources/namespaces") => web::get().to(resources::namespaces),
            ("GET", "/api/v1/resources/tasks") => web::get().to(resources::tasks),
            ("GET", "/api/v1/resources/overview") => web::get().to(resources::overview),
            ("GET", "/api/v1/messages") => web::get().to(messages::list),
            ("GET", "/api/v1/messages/{partitionId}/{transactionId}") => {
                web::get().to(messages::detail)
            }
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

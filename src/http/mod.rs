//! The HTTP routes (Queen's wire protocol, `../shared/reference/queen-http-api.md`).
//!
//! [`routes`] is the table of every route with its capability; [`configure()`] registers exactly
//! those, so a route cannot exist without an access decision. The auth gate
//! ([`gate`]) reads the same table for every request: a route added here is checked
//! with no other change, and with auth on a path missing from the table is never served.

pub mod access;
pub mod ack;
pub mod body;
pub mod configure;
pub mod dashboard;
pub mod depth;
pub mod dlq;
pub mod ephemeral;
pub mod error;
pub mod features;
pub mod gate;
pub mod groups;
pub mod health;
pub mod history;
pub mod inputs;
pub mod kafka_views;
pub mod kv;
pub mod lease;
pub mod locks;
pub mod maintenance;
pub mod messages;
pub mod metrics;
pub mod observe;
pub mod openapi;
pub mod origin;
pub mod peer;
pub mod pop;
pub mod push;
pub mod quarantine;
pub mod reads;
pub mod resources;
pub mod status;
pub mod streams;
pub mod timers;
pub mod traces;
pub mod transaction;
pub mod undecryptable;

use actix_web::http::{header, Method};
use actix_web::{web, HttpRequest, HttpResponse};

pub use crate::auth::roles::Capability;
pub use gate::{Gate, Gatekeeper};
pub use peer::PeerSocket;

use crate::http::error::ApiError;

/// One registered route.
pub struct Route {
    /// HTTP method.
    pub method: Method,
    /// Path pattern (actix syntax).
    pub path: &'static str,
    /// Who may call it.
    pub capability: Capability,
    /// Attaches the handler to an actix route for this method.
    pub handler: fn(actix_web::Route) -> actix_web::Route,
}

impl Route {
    /// The part of a route pattern before its first dynamic segment (all of a static one): a
    /// path that does not start with it cannot match, which a string compare tells before the
    /// pattern's regular expression runs (a few microseconds each).
    pub fn literal_head(def: &actix_web::dev::ResourceDef) -> &str {
        let pattern = def.pattern().unwrap_or("");
        &pattern[..pattern.find('{').unwrap_or(pattern.len())]
    }

    /// A route; `handler` is usually `|r| r.to(module::function)`.
    pub fn new(
        method: Method,
        path: &'static str,
        capability: Capability,
        handler: fn(actix_web::Route) -> actix_web::Route,
    ) -> Self {
        Self {
            method,
            path,
            capability,
            handler,
        }
    }
}

/// Every route the broker serves, each listed once: method, path, capability and handler.
#[rustfmt::skip]
pub fn routes() -> Vec<Route> {
    // The hot routes first: the auth gate and the input checks try the paths in this order on
    // every request.
    vec![
        Route::new(Method::POST, "/api/v1/push", Capability::Produce, |r| r.to(push::push)),
        Route::new(Method::GET, "/api/v1/pop/queue/{queue}", Capability::Consume, |r| r.to(pop::pop_queue)),
        Route::new(Method::POST, "/api/v1/ack/batch", Capability::Consume, |r| r.to(ack::ack_batch)),
        Route::new(Method::POST, "/api/v1/ack", Capability::Consume, |r| r.to(ack::ack)),
        Route::new(Method::POST, "/api/v1/configure", Capability::Configure, |r| r.to(configure::configure)),
        Route::new(Method::GET, "/api/v1/resources/queues", Capability::Read, |r| r.to(resources::list_queues)),
        Route::new(Method::GET, "/api/v1/resources/queues/{queue}", Capability::Read, |r| r.to(resources::queue_detail)),
        Route::new(Method::DELETE, "/api/v1/resources/queues/{queue}", Capability::Admin, |r| r.to(resources::delete_queue)),
        Route::new(Method::GET, "/api/v1/resources/namespaces", Capability::Read, |r| r.to(resources::namespaces)),
        Route::new(Method::GET, "/api/v1/resources/tasks", Capability::Read, |r| r.to(resources::tasks)),
        Route::new(Method::GET, "/api/v1/resources/overview", Capability::Read, |r| r.to(resources::overview)),
        Route::new(Method::GET, "/api/v1/kafka/topics", Capability::Read, |r| r.to(kafka_views::topics)),
        Route::new(Method::GET, "/api/v1/kafka/groups", Capability::Read, |r| r.to(kafka_views::groups)),
        Route::new(Method::GET, "/api/v1/messages", Capability::Read, |r| r.to(messages::list)),
        Route::new(Method::GET, "/api/v1/messages/{partitionId}/{transactionId}", Capability::Read, |r| r.to(messages::detail)),
        Route::new(Method::GET, "/api/v1/pop/queue/{queue}/partition/{partition}", Capability::Consume, |r| r.to(pop::pop_partition)),
        Route::new(Method::GET, "/api/v1/pop", Capability::Consume, |r| r.to(pop::pop_matching)),
        Route::new(Method::POST, "/api/v1/lease/{lease_id}/extend", Capability::Consume, |r| r.to(lease::extend)),
        Route::new(Method::POST, "/api/v1/transaction", Capability::ProduceAndConsume, |r| r.to(transaction::transaction)),
        Route::new(Method::GET, "/api/v1/consumer-groups", Capability::Read, |r| r.to(groups::list)),
        Route::new(Method::GET, "/api/v1/consumer-groups/lagging", Capability::Read, |r| r.to(groups::lagging)),
        Route::new(Method::GET, "/api/v1/consumer-groups/{group}", Capability::Read, |r| r.to(groups::get)),
        Route::new(Method::DELETE, "/api/v1/consumer-groups/{group}", Capability::Admin, |r| r.to(groups::delete)),
        Route::new(Method::DELETE, "/api/v1/consumer-groups/{group}/queues/{queue}", Capability::Admin, |r| r.to(groups::delete_for_queue)),
        Route::new(Method::POST, "/api/v1/consumer-groups/{group}/subscription", Capability::Configure, |r| r.to(groups::subscription)),
        Route::new(Method::POST, "/api/v1/consumer-groups/{group}/queues/{queue}/seek", Capability::Configure, |r| r.to(groups::seek_queue)),
        Route::new(Method::POST, "/api/v1/consumer-groups/{group}/queues/{queue}/partitions/{partition}/seek", Capability::Configure, |r| r.to(groups::seek_partition)),
        Route::new(Method::GET, "/api/v1/dlq", Capability::Read, |r| r.to(dlq::list)),
        Route::new(Method::GET, "/health", Capability::Public, |r| r.to(health::health)),
        Route::new(Method::GET, "/health/live", Capability::Public, |r| r.to(health::live)),
        Route::new(Method::GET, "/metrics", Capability::Public, |r| r.to(metrics::json)),
        Route::new(Method::GET, "/metrics/prometheus", Capability::Public, |r| r.to(metrics::prometheus)),
        Route::new(Method::GET, "/api/v1/system/maintenance", Capability::Admin, |r| r.to(maintenance::get)),
        Route::new(Method::POST, "/api/v1/system/maintenance", Capability::Admin, |r| r.to(maintenance::set)),
        Route::new(Method::GET, "/api/v1/system/maintenance/pop", Capability::Admin, |r| r.to(maintenance::get_pop)),
        Route::new(Method::POST, "/api/v1/system/maintenance/pop", Capability::Admin, |r| r.to(maintenance::set_pop)),
        Route::new(Method::GET, "/api/v1/system/shared-state", Capability::Admin, |r| r.to(maintenance::shared_state)),
        Route::new(Method::GET, "/api/v1/system/history", Capability::Read, |r| r.to(history::history)),
        Route::new(Method::GET, "/api/v1/access", Capability::Read, |r| r.to(access::access)),
        Route::new(Method::GET, "/", Capability::Public, |r| r.to(dashboard::index)),
        Route::new(Method::GET, "/dashboard/{file}", Capability::Public, |r| r.to(dashboard::file)),
        // Traces, status and analytics, stats refresh, message delete (reference §9.3, §9.4, §9.6).
        Route::new(Method::POST, "/api/v1/traces", Capability::Consume, |r| r.to(traces::record)),
        Route::new(Method::GET, "/api/v1/traces/names", Capability::Read, |r| r.to(traces::names)),
        Route::new(Method::GET, "/api/v1/traces/by-name/{name}", Capability::Read, |r| r.to(traces::by_name)),
        Route::new(Method::GET, "/api/v1/traces/{partitionId}/{transactionId}", Capability::Read, |r| r.to(traces::of_message)),
        Route::new(Method::GET, "/api/v1/status", Capability::Read, |r| r.to(status::overview)),
        Route::new(Method::GET, "/api/v1/status/queues", Capability::Read, |r| r.to(status::queues_list)),
        Route::new(Method::GET, "/api/v1/status/queues/{queue}", Capability::Read, |r| r.to(status::queue_detail)),
        Route::new(Method::GET, "/api/v1/status/queues/{queue}/messages", Capability::Read, |r| r.to(status::queue_messages)),
        Route::new(Method::GET, "/api/v1/status/analytics", Capability::Read, |r| r.to(status::analytics)),
        Route::new(Method::GET, "/api/v1/status/buffers", Capability::Read, |r| r.to(status::buffers_route)),
        Route::new(Method::GET, "/api/v1/analytics/{name}", Capability::Read, |r| r.to(status::named)),
        Route::new(Method::POST, "/api/v1/stats/refresh", Capability::Admin, |r| r.to(status::refresh)),
        Route::new(Method::DELETE, "/api/v1/messages/{partitionId}/{transactionId}", Capability::Configure, |r| r.to(messages::delete)),
        Route::new(Method::GET, "/api/v1/openapi.json", Capability::Read, |r| r.to(openapi_json)),
        Route::new(Method::GET, "/api/v1/system/quarantine", Capability::Admin, |r| r.to(quarantine::list)),
        Route::new(Method::GET, "/api/v1/system/undecryptable", Capability::Admin, |r| r.to(undecryptable::list)),
        // Reads without a lease and queue depth (2.x reference §2.6, §2.8).
        Route::new(Method::POST, "/api/v1/fetch", Capability::Read, |r| r.to(reads::fetch)),
        Route::new(Method::POST, "/api/v1/partitions/changed", Capability::Read, |r| r.to(reads::changed)),
        Route::new(Method::GET, "/api/v1/resources/queues/{queue}/depth", Capability::Read, |r| r.to(depth::depth)),
        // Ephemeral queues (2.x reference §2.7).
        Route::new(Method::POST, "/api/v1/ephemeral/configure", Capability::Configure, |r| r.to(ephemeral::configure)),
        Route::new(Method::POST, "/api/v1/ephemeral/reset", Capability::Configure, |r| r.to(ephemeral::reset)),
        Route::new(Method::DELETE, "/api/v1/ephemeral/queue/{queue}", Capability::Admin, |r| r.to(ephemeral::delete)),
        Route::new(Method::POST, "/api/v1/ephemeral/push", Capability::Produce, |r| r.to(ephemeral::push)),
        Route::new(Method::GET, "/api/v1/ephemeral/pop", Capability::Consume, |r| r.to(ephemeral::pop)),
        Route::new(Method::POST, "/api/v1/ephemeral/ack", Capability::Consume, |r| r.to(ephemeral::ack)),
        Route::new(Method::GET, "/api/v1/ephemeral/queues", Capability::Read, |r| r.to(ephemeral::queues)),
        Route::new(Method::GET, "/api/v1/ephemeral/queues/{queue}/depth", Capability::Read, |r| r.to(ephemeral::depth)),
        // 2.x state beside the queues: the KV store and locks kept as KV rows (docs/kv.md).
        Route::new(Method::POST, "/api/v1/kv", Capability::ProduceAndConsume, |r| r.to(kv::kv)),
        Route::new(Method::GET, "/api/v1/kv/namespaces", Capability::Read, |r| r.to(features::namespaces)),
        Route::new(Method::GET, "/api/v1/locks", Capability::Read, |r| r.to(features::locks)),
        Route::new(Method::GET, "/api/v1/timers", Capability::Read, |r| r.to(features::timers)),
        Route::new(Method::GET, "/streams/v1/queries", Capability::Read, |r| r.to(features::stream_queries)),
        Route::new(Method::POST, "/api/v1/locks", Capability::ProduceAndConsume, |r| r.to(locks::locks)),
        // Timers (2.x reference §2.3): the key is the rest of the path and may hold `/`.
        Route::new(Method::POST, "/api/v1/timers", Capability::Produce, |r| r.to(timers::batch)),
        Route::new(Method::GET, "/api/v1/timers/{queue}", Capability::Read, |r| r.to(timers::list)),
        Route::new(Method::GET, "/api/v1/timers/{queue}/{timerKey:.+}", Capability::Read, |r| r.to(timers::peek)),
        Route::new(Method::DELETE, "/api/v1/timers/{queue}/{timerKey:.+}", Capability::Produce, |r| r.to(timers::cancel)),
        // The streams runtime (2.x reference §2.11, docs/streams.md).
        Route::new(Method::POST, "/streams/v1/queries", Capability::ProduceAndConsume, |r| r.to(streams::register)),
        Route::new(Method::POST, "/streams/v1/state/get", Capability::Read, |r| r.to(streams::state_get)),
        Route::new(Method::POST, "/streams/v1/cycle", Capability::ProduceAndConsume, |r| r.to(streams::cycle)),
    ]
}

/// `GET /api/v1/openapi.json`: the OpenAPI document of [`routes`] ([`openapi`]), built once.
async fn openapi_json() -> HttpResponse {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let body = DOCUMENT.get_or_init(|| openapi::document(&routes()).to_string());
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body.as_str())
}

/// The paths of [`routes`], as the router matches them (for the input checks of [`inputs`]).
pub fn route_patterns() -> Vec<actix_web::dev::ResourceDef> {
    routes()
        .into_iter()
        .map(|r| actix_web::dev::ResourceDef::new(r.path))
        .collect()
}

/// Registers every route of [`routes`] with its handler.
pub fn configure(cfg: &mut web::ServiceConfig) {
    for route in routes() {
        cfg.route(
            route.path,
            (route.handler)(web::method(route.method.clone())),
        );
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
    // `Access-Control-Allow-Origin` is written by `origin::guard` (QUEEN_CORS_ORIGINS).
    actix_web::middleware::DefaultHeaders::new()
        .add((
            header::ACCESS_CONTROL_ALLOW_METHODS,
            "GET, POST, PUT, DELETE, OPTIONS",
        ))
        .add((
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            "Content-Type, Authorization",
        ))
}

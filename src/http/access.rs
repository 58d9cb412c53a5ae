//! `GET /api/v1/access`: what the caller's token may do, so a client (the dashboard) can offer
//! only the actions the broker would allow. With auth off everything is allowed.

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::auth::Caller;
use crate::http::Capability;
use crate::state::AppState;

/// The capabilities a client may ask about, by their names on the wire.
const NAMED: [(&str, Capability); 5] = [
    ("produce", Capability::Produce),
    ("consume", Capability::Consume),
    ("configure", Capability::Configure),
    ("read", Capability::Read),
    ("admin", Capability::Admin),
];

/// `GET /api/v1/access`: `{"authEnabled", "sub", "capabilities": [...]}`.
pub async fn access(caller: Caller, state: web::Data<AppState>) -> HttpResponse {
    let enabled = state.settings.jwt.enabled;
    let capabilities: Vec<&str> = NAMED
        .iter()
        .filter(|(_, capability)| !enabled || caller.roles.allow(*capability))
        .map(|(name, _)| *name)
        .collect();
    HttpResponse::Ok().json(json!({
        "authEnabled": enabled,
        "sub": caller.sub,
        "capabilities": capabilities,
    }))
}

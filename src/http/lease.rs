//! `POST /api/v1/lease/{leaseId}/extend` (reference §5.3, 2.x renew §2.5). The body is optional
//! (the Python SDK sends `{}`): `{"seconds": n}`, default 60, at most one day (a 400 beyond).
//! Failures stay 200 with `success: false`. The answer is a one-element list (as 0.15 answered):
//! `renewed` counts the partitions extended (0 when nothing was), and the new expiry is given
//! as `newExpiresAt`, `expiresAt` and `lease_expires_at` (the names the clients read), all
//! `null` when nothing was renewed.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;
use uuid::Uuid;

use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::protocol::ack::json_body;
use crate::protocol::params::lease_seconds;
use crate::protocol::time::iso_millis;
use crate::state::AppState;
use crate::storage::consume::leases::{self, ExtendError};

/// `seconds` when the body leaves it out.
const DEFAULT_SECONDS: i64 = 60;

/// `POST /api/v1/lease/{leaseId}/extend`.
pub async fn extend(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let lease = path.into_inner();
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let body = json_body(&bytes, true)?;
    let seconds = lease_seconds(body.get("seconds"), DEFAULT_SECONDS)?;
    let result = match Uuid::parse_str(&lease) {
        Ok(id) => {
            with_db(&state, async {
                let mut conn = state.pool.acquire().await?;
                leases::extend(&mut conn, id, seconds).await
            })
            .await?
        }
        Err(_) => Err(ExtendError::NotFound),
    };
    let item = match result {
        Ok(extended) => {
            let at = iso_millis(extended.expires_at);
            json!({
                "index": 0, "leaseId": lease, "success": true, "error": null,
                "renewed": extended.partitions,
                "newExpiresAt": at, "expiresAt": at, "lease_expires_at": at,
            })
        }
        Err(e) => json!({
            "index": 0, "leaseId": lease, "success": false, "error": e.as_str(),
            "renewed": 0,
            "newExpiresAt": null, "expiresAt": null, "lease_expires_at": null,
        }),
    };
    Ok(HttpResponse::Ok().json(vec![item]))
}

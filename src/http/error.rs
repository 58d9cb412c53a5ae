//! The one place that maps failures to HTTP: status codes and the protocol's `{"error": ...}`.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use broker_actors::PushError;

use crate::auth::AuthError;
use crate::ephemeral::EphemeralError;
use crate::protocol::timers::TimersError;
use crate::protocol::ProtocolError;
use crate::state::AppState;
use crate::storage::StorageError;

/// A request that could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is malformed or breaks a rule of the route.
    #[error("{0}")]
    BadRequest(String),
    /// A malformed request of a 2.x surface, answered in the envelope of reference 2.x §1.3:
    /// `{"error": code, "reason": stable id, "detail": prose}` (e.g. `kv_bad_request`).
    #[error("{detail}")]
    Named {
        /// The code clients branch on (`kv_bad_request`, `lock_bad_request`, ...).
        code: &'static str,
        /// The stable id of the broken rule.
        reason: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The body is larger than `QUEEN_MAX_BODY_BYTES`.
    #[error("request body exceeds QUEEN_MAX_BODY_BYTES ({limit} bytes)")]
    TooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// A push whose items alone need more memory than the write path may hold.
    #[error("request needs about {cost} bytes of memory, more than QUEEN_MAX_INFLIGHT_BYTES ({limit}); send fewer items per request")]
    TooMuchMemory {
        /// The estimated cost.
        cost: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The body comes in an encoding the broker does not decode.
    #[error("Content-Encoding {0:?} is not supported (send gzip, deflate or identity)")]
    UnsupportedEncoding(String),
    /// The body did not arrive in time.
    #[error("request body not received within {0:?} (QUEEN_BODY_TIMEOUT_MS)")]
    BodyTimeout(std::time::Duration),
    /// The write path is saturated; retry after the delay.
    #[error("broker is overloaded, retry later")]
    Overloaded {
        /// Seconds to wait.
        retry_after_secs: u64,
    },
    /// PostgreSQL is needed and did not answer.
    #[error("{0}")]
    Unavailable(String),
    /// The write path failed.
    #[error(transparent)]
    Push(#[from] PushError),
    /// No usable bearer token: missing, malformed, expired, badly signed (reference §10.3).
    #[error("{0}")]
    Unauthenticated(String),
    /// A valid token whose roles do not grant the route's capability.
    #[error("Insufficient permissions")]
    Forbidden,
    /// A browser's cross-origin write that it sent without asking first (a form or
    /// `text/plain`), from an origin `QUEEN_CORS_ORIGINS` does not name.
    #[error("cross-origin {method} from {origin} with content type {content_type:?} refused: send application/json, or list the origin in QUEEN_CORS_ORIGINS")]
    CrossOriginWrite {
        /// Request method.
        method: String,
        /// The `Origin` header.
        origin: String,
        /// The `Content-Type` header (empty when absent).
        content_type: String,
    },
    /// Tokens cannot be checked: key set unreachable or key material missing for this algorithm.
    #[error("{0}")]
    AuthUnavailable(String),
    /// The named thing does not exist (`Queue not found`, `Message not found`).
    #[error("{0}")]
    NotFound(String),
    /// A storage operation failed (PostgreSQL away: 503; anything else: 500).
    #[error("database error: {0}")]
    Database(#[from] StorageError),
    /// PostgreSQL did not answer in time.
    #[error("database did not answer within {0:?}")]
    DatabaseTimeout(std::time::Duration),
    /// An ephemeral queue call refused (400, 404, 429, 503; each with its `code`).
    #[error(transparent)]
    Ephemeral(#[from] EphemeralError),
    /// A malformed timer call: 400 with the 2.x envelope, code `timers_bad_request`.
    #[error(transparent)]
    Timers(#[from] TimersError),
    /// No route matches.
    #[error("no route for {method} {path}")]
    NoSuchRoute {
        /// Request method.
        method: String,
        /// Request path.
        path: String,
    },
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) | Self::Named { .. } | Self::Timers(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge { .. } | Self::TooMuchMemory { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Push(PushError::Overloaded(_)) => StatusCode::SERVICE_UNAVAILABLE,
            // Nothing was stored: a retry is safe and, with a stable transactionId, exact.
            Self::Push(PushError::CommitFailed(_) | PushError::ActorStopped) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden | Self::CrossOriginWrite { .. } => StatusCode::FORBIDDEN,
            Self::AuthUnavailable(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::NoSuchRoute { .. } | Self::NotFound(_) => StatusCode::NOT_FOUND,
            // Unreachable is retryable; anything else is ours.
            Self::Database(e) if e.is_unreachable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::DatabaseTimeout(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Ephemeral(e) => match e {
                EphemeralError::BadRequest(_) => StatusCode::BAD_REQUEST,
                EphemeralError::NotFound(_) => StatusCode::NOT_FOUND,
                EphemeralError::Full { .. } => StatusCode::TOO_MANY_REQUESTS,
                EphemeralError::Budget(_) => StatusCode::SERVICE_UNAVAILABLE,
            },
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        if status.is_server_error() {
            tracing::warn!(error = %self, status = status.as_u16(), "request failed");
        }
        let mut res = HttpResponse::build(status);
        let retry_after = match self {
            Self::Overloaded { retry_after_secs } => Some(*retry_after_secs),
            Self::Push(PushError::Overloaded(d)) => Some(d.as_secs().max(1)),
            Self::Push(_) | Self::Unavailable(_) => Some(1),
            Self::Database(_) | Self::DatabaseTimeout(_) if status.is_server_error() => Some(1),
            Self::Ephemeral(EphemeralError::Full { .. } | EphemeralError::Budget(_)) => Some(1),
            _ => None,
        };
        if let Some(secs) = retry_after {
            res.insert_header((header::RETRY_AFTER, secs.to_string()));
        }
        if let Self::BodyTimeout(_) = self {
            // The rest of the body may still trickle in: the connection is not reused.
            res.insert_header((header::CONNECTION, "close"));
        }
        if let Self::Unauthenticated(_) = self {
            res.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        let body = match self {
            Self::NoSuchRoute { .. } => {
                serde_json::json!({ "error": self.to_string(), "code": "no_such_route" })
            }
            Self::Ephemeral(e) => {
                serde_json::json!({ "error": e.code(), "code": e.code(), "detail": self.to_string() })
            }
            Self::Named {
                code,
                reason,
                detail,
            } => serde_json::json!({ "error": code, "reason": reason, "detail": detail }),
            // The 2.x envelope (reference 2x §1.3): code, stable reason, prose.
            Self::Timers(e) => serde_json::json!({
                "error": "timers_bad_request",
                "reason": e.reason,
                "detail": e.detail,
            }),
            _ => serde_json::json!({ "error": self.to_string() }),
        };
        res.json(body)
    }
}

impl ApiError {
    /// A `kv_bad_request` (reference 2.x §1.3).
    pub fn kv(e: crate::protocol::kv::BadKv) -> Self {
        Self::Named {
            code: "kv_bad_request",
            reason: e.reason,
            detail: e.detail,
        }
    }

    /// A binary body (`QPB1`, `QTB1`) that cannot be accepted: malformed is a 400 naming the
    /// byte offset and the field, inflating past `QUEEN_MAX_BODY_BYTES` a 413.
    pub fn binary(e: crate::protocol::push_binary::BinaryError) -> Self {
        match e {
            crate::protocol::push_binary::BinaryError::TooLarge { limit, .. } => {
                Self::TooLarge { limit }
            }
            malformed => Self::BadRequest(malformed.to_string()),
        }
    }

    /// A `lock_bad_request`.
    pub fn lock(e: crate::protocol::kv::BadKv) -> Self {
        Self::Named {
            code: "lock_bad_request",
            reason: e.reason,
            detail: e.detail,
        }
    }
}

impl From<ProtocolError> for ApiError {
    fn from(e: ProtocolError) -> Self {
        Self::BadRequest(e.0)
    }
}

/// Acquiring a pool connection in a handler: classified like any storage error.
impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(StorageError::from(e))
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthenticated(text) => Self::Unauthenticated(text),
            AuthError::Forbidden => Self::Forbidden,
            AuthError::Unavailable(text) => Self::AuthUnavailable(text),
        }
    }
}

/// Runs one database step under a deadline, so a vanished PostgreSQL turns into a prompt 503
/// instead of a hung request.
///
/// # Errors
///
/// [`ApiError::Database`] or [`ApiError::DatabaseTimeout`].
pub async fn with_db<T>(
    state: &AppState,
    step: impl std::future::Future<Output = Result<T, StorageError>>,
) -> Result<T, ApiError> {
    let limit = state
        .settings
        .statement_timeout
        .min(std::time::Duration::from_secs(10));
    match tokio::time::timeout(limit, step).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(ApiError::DatabaseTimeout(limit)),
    }
}

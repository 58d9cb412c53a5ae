//! `POST /api/v1/transaction`.
use actix_web::HttpResponse;
/// Placeholder.
pub async fn transaction() -> HttpResponse {
    HttpResponse::NotImplemented().finish()
}

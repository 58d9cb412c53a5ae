//! Consumer groups.
use actix_web::HttpResponse;
/// Placeholder.
pub async fn list() -> HttpResponse {
    HttpResponse::NotImplemented().finish()
}
/// Placeholder.
pub async fn lagging() -> HttpResponse {
    HttpResponse::NotImplemented().finish()
}
/// Placeholder.
pub async fn get() -> HttpResponse {
    HttpResponse::NotImplemented().finish()
}
/// Placeholder.
pub async fn delete() -> HttpResponse {
    HttpResponse::NotImplemented().finish()
}
/// Placeholder.
pub async fn delete_for_queue() -> HttpResponse {
    HttpResponse::NotImplemented().finish()
}
/// Placeholder.
pub async fn subscription() -> HttpResponse {
    HttpResponse::NotImplemented().finish()
}
/// Placeholder.
pub async fn seek_queue() -> HttpResponse {
    HttpResponse::NotImplemented().finish()
}
/// Placeholder.
pub async fn seek_partition() -> HttpResponse {
    HttpResponse::NotImplemented().finish()
}

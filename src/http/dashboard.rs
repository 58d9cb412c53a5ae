//! The operator dashboard: `GET /` and `GET /dashboard/{file}`. Plain HTML, CSS and JavaScript
//! from the repository's `dashboard/` folder, built into the binary (no separate server, no
//! network). The page reads everything through the broker's own HTTP API with the caller's
//! token, so it shows nothing an API user could not see; the assets themselves are public.

use actix_web::http::header;
use actix_web::{web, HttpResponse};

use crate::http::error::ApiError;

/// One built-in file: name, content type, bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../dashboard/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../dashboard/app.css"),
    ),
];

const INDEX: &str = include_str!("../../dashboard/index.html");

/// Only the built-in files, scripts from here only, the API on this origin.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

fn asset(content_type: &str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, content_type))
        .insert_header((header::CONTENT_SECURITY_POLICY, POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        // Built into the binary: a new broker version brings new files, so revalidate.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}

/// `GET /`: the page.
pub async fn index() -> HttpResponse {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /dashboard/{file}`: a script or style sheet of the page; 404 for any other name.
pub async fn file(name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    ASSETS
        .iter()
        .find(|(n, _, _)| *n == name.as_str())
        .map(|(_, content_type, body)| asset(content_type, body))
        .ok_or_else(|| ApiError::NotFound(format!("no dashboard file {:?}", name.as_str())))
}

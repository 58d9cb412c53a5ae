//! `GET /api/v1/system/history`: the broker's last hour of samples (`crate::history`) as
//! aligned columns, for the dashboard's charts; `?queue=` keeps that queue's (queue, group)
//! series only. Memory only: it reads no database.

use actix_web::{web, HttpResponse};
use serde::Deserialize;

use crate::state::AppState;

/// The route's query.
#[derive(Debug, Deserialize)]
pub struct HistoryQuery {
    /// Only this queue's backlog series.
    pub queue: Option<String>,
}

/// `GET /api/v1/system/history`.
pub async fn history(state: web::Data<AppState>, query: web::Query<HistoryQuery>) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-cache"))
        .json(state.history.snapshot(query.queue.as_deref()))
}

//! `POST /api/v1/ack` and `POST /api/v1/ack/batch` (reference §5.1, §5.2): validate, apply
//! every ack in one transaction (`storage::acks`), answer one result per ack. Business
//! failures are `success: false` items under 200; only a malformed request is a 400.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};

use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use crate::protocol::ack::{completed_answer, WireAck, WireOutcome};
use crate::state::AppState;
use crate::storage::acks::{self, Ack, AckMode, AckOutcome};

/// What answers an ack request.
enum Answer {
    /// Every ack was applied by the grouped statement: the answer is written from the acks.
    Completed {
        queue: std::sync::Arc<str>,
        partition: std::sync::Arc<str>,
        released: bool,
    },
    /// The general path's outcomes.
    Outcomes(Vec<AckOutcome>),
}

async fn apply(state: &AppState, list: Vec<Ack>) -> Result<HttpResponse, ApiError> {
    let answer = with_db(state, async {
        // The common ack joins the others waiting to be committed together.
        if let Some(plan) = acks::plan_completed_fast(&state.cache, &list)? {
            let (lease, partition, partition_id) =
                (plan.ack.lease, list[0].partition, plan.ack.partition_id);
            // The ack ends its lease whole: while its commit flushes, the group's next
            // partition is claimed for the consumer's next pop.
            if let Some(batch) = plan.batch {
                if plan.ack.end >= plan.ack.to && !state.flags.pop_maintenance() {
                    state.ahead.after_ack(&plan.queue, &list[0].group, batch);
                }
            }
            if let Some(applied) = state.ack_group.apply(plan.ack).await {
                if applied.released {
                    state.cache.forget_lease(lease, partition);
                }
                if applied.left_behind {
                    // The release left messages behind: the next pop of the group here claims
                    // the partition by its id, and a waiting consumer takes them now rather
                    // than at its next wake-up or re-check.
                    state
                        .handoffs
                        .offer(&plan.queue, &list[0].group, partition_id);
                    state.wake.wake(&plan.queue, &plan.partition);
                }
                return Ok(Answer::Completed {
                    queue: plan.queue,
                    partition: plan.partition,
                    released: applied.released,
                });
            }
        }
        let mut conn = state.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let outcomes = acks::apply(&mut tx, &state.cache, &list, AckMode::Consume).await?;
        tx.commit().await?;
        Ok(Answer::Outcomes(outcomes))
    })
    .await?;
    match answer {
        Answer::Completed {
            queue,
            partition,
            released,
        } => {
            state.metrics.acked_completed(list.len());
            Ok(HttpResponse::Ok()
                .insert_header((header::CONTENT_TYPE, "application/json"))
                .body(completed_answer(&list, &queue, &partition, released)))
        }
        Answer::Outcomes(outcomes) => {
            state.metrics.acked(&list, &outcomes);
            let body: Vec<WireOutcome> = outcomes.iter().map(WireOutcome::from).collect();
            Ok(HttpResponse::Ok().json(body))
        }
    }
}

/// `POST /api/v1/ack`.
pub async fn ack(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let v = WireAck::read(&bytes)?;
    let one = v.to_ack(
        0,
        v.group(),
        "transactionId is required",
        "partitionId is required to ensure message uniqueness",
    )?;
    apply(&state, vec![one]).await
}

/// `POST /api/v1/ack/batch`.
pub async fn ack_batch(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    let v = WireAck::read(&bytes)?;
    let items = v
        .items()
        .ok_or_else(|| ApiError::BadRequest("acknowledgments array is required".into()))?;
    // The top-level group applies to every item.
    let group = v.group();
    let list = items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.to_ack(
                index,
                group.clone(),
                "Each acknowledgment must have a valid transactionId string",
                "Each acknowledgment must have a valid partitionId string to ensure message uniqueness",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    apply(&state, list).await
}

//! `POST /api/v1/ack` and `POST /api/v1/ack/batch` (reference §5.1, §5.2): validate, apply
//! every ack in one transaction (`storage::consume::acks`), answer one result per ack. Business
//! failures are `success: false` items under 200; only a malformed request is a 400.
//!
//! The common ack (every ack `completed`, one lease this broker handed out) is applied by the
//! grouped statement instead (`storage::consume::ack_group`): one plan per partition of the lease, so
//! the batch ack of a multi-partition pop is one too. A plan the statement does not apply
//! takes the general path with its acks only.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};

use crate::http::body::read_body;
use crate::http::error::{with_db, ApiError};
use futures_util::future::join_all;

use crate::protocol::ack::{completed_answer, completed_answer_by, WireAck, WireOutcome};
use crate::state::AppState;
use crate::storage::consume::ack_group::Applied;
use crate::storage::consume::acks::{self, Ack, AckMode, AckOutcome, FastPlan};
use crate::storage::StorageError;

/// What answers an ack request.
enum Answer {
    /// Every ack was applied by the grouped statement (one plan per partition of the lease,
    /// with the positions of its acks and what applying it did): the answer is written from
    /// the acks.
    Completed(Vec<(FastPlan, Vec<usize>, Applied)>),
    /// The general path's outcomes (with those of plans the grouped statement applied, when
    /// only some were).
    Outcomes(Vec<AckOutcome>),
}

async fn apply(state: &AppState, mut list: Vec<Ack>) -> Result<HttpResponse, ApiError> {
    let answer = with_db(state, async {
        acks::resolve_partition_ids(&state.pool, &state.cache, &mut list).await?;
        // The common ack joins the others waiting to be committed together: one plan per
        // partition (several when one pop claimed several partitions under one lease).
        if let Some(plans) = acks::plan_completed_fast_by_partition(&state.cache, &list)? {
            let group = &list[0].group;
            for (plan, _) in &plans {
                // The ack ends its lease whole: while its commit flushes, the group's next
                // partition is claimed for the consumer's next pop.
                if let Some(batch) = plan.batch {
                    if plan.ack.end >= plan.ack.to && !state.flags.pop_maintenance() {
                        state.ahead.after_ack(&plan.queue, group, batch);
                    }
                }
            }
            let applied = match plans.as_slice() {
                [(plan, _)] => vec![state.ack_group.apply(plan.ack.clone()).await],
                _ => {
                    join_all(
                        plans
                            .iter()
                            .map(|(plan, _)| state.ack_group.apply(plan.ack.clone())),
                    )
                    .await
                }
            };
            for ((plan, positions), applied) in plans.iter().zip(&applied) {
                let Some(applied) = applied else { continue };
                if applied.released {
                    state
                        .cache
                        .forget_lease(plan.ack.lease, list[positions[0]].partition);
                }
                if applied.left_behind {
                    // The release left messages behind: the next pop of the group here claims
                    // the partition by its id, and a waiting consumer takes them now rather
                    // than at its next wake-up or re-check.
                    state
                        .handoffs
                        .offer(&plan.queue, group, plan.ack.partition_id);
                    state.wake.wake(&plan.queue, &plan.partition);
                }
            }
            if applied.iter().all(Option::is_some) {
                return Ok(Answer::Completed(
                    plans
                        .into_iter()
                        .zip(applied)
                        .filter_map(|((plan, positions), a)| a.map(|a| (plan, positions, a)))
                        .collect(),
                ));
            }
            // The plans not applied (a lease that ran out, a range that moved, ...) take the
            // general path; the others are answered as applied.
            let mut rest = Vec::new();
            let mut outcomes = Vec::with_capacity(list.len());
            for ((plan, positions), applied) in plans.iter().zip(&applied) {
                match applied {
                    None => rest.extend(positions.iter().map(|&n| list[n].clone())),
                    Some(applied) => {
                        let last = positions.len() - 1;
                        outcomes.extend(positions.iter().enumerate().map(|(k, &n)| AckOutcome {
                            index: list[n].index,
                            transaction_id: list[n].transaction_id.clone(),
                            success: true,
                            error: None,
                            queue_name: Some(plan.queue.to_string()),
                            partition_name: Some(plan.partition.to_string()),
                            lease_released: applied.released && k == last,
                            dlq: false,
                            noop: false,
                        }));
                    }
                }
            }
            outcomes.extend(general(state, &rest).await?);
            outcomes.sort_by_key(|o| o.index);
            return Ok(Answer::Outcomes(outcomes));
        }
        Ok(Answer::Outcomes(general(state, &list).await?))
    })
    .await?;
    match answer {
        Answer::Completed(done) => {
            state.metrics.acked_completed(list.len());
            let body = match done.as_slice() {
                [(plan, _, applied)] => {
                    completed_answer(&list, &plan.queue, &plan.partition, applied.released)
                }
                _ => {
                    let mut at: Vec<(&str, &str, bool)> = vec![("", "", false); list.len()];
                    for (plan, positions, applied) in &done {
                        let last = positions.len() - 1;
                        for (k, &n) in positions.iter().enumerate() {
                            at[n] = (&plan.queue, &plan.partition, applied.released && k == last);
                        }
                    }
                    completed_answer_by(&list, |n| at[n])
                }
            };
            Ok(HttpResponse::Ok()
                .insert_header((header::CONTENT_TYPE, "application/json"))
                .body(body))
        }
        Answer::Outcomes(outcomes) => {
            state.metrics.acked(&list, &outcomes);
            let body: Vec<WireOutcome> = outcomes.iter().map(WireOutcome::from).collect();
            Ok(HttpResponse::Ok().json(body))
        }
    }
}

/// The general path: `acks` applied in one transaction of their own.
async fn general(state: &AppState, acks: &[Ack]) -> Result<Vec<AckOutcome>, StorageError> {
    if acks.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = state.pool.acquire().await?;
    let mut tx = crate::storage::begin::begin(&mut conn).await?;
    let outcomes = acks::apply(&mut tx, &state.cache, acks, AckMode::Consume).await?;
    tx.commit().await?;
    Ok(outcomes)
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

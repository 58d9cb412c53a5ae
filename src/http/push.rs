//! `POST /api/v1/push`: validate the whole body, group items by (queue, partition) in body
//! order, hand each group to its partition actor, and answer one verdict per item in request
//! order. Nothing is written when any item is invalid.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use broker_actors::{Item, PartitionKey, Verdict};
use futures_util::future::join_all;
use uuid::Uuid;

use crate::auth::Caller;
use crate::http::body::read_body;
use crate::http::error::ApiError;
use crate::protocol::push::{mint, parse_push_body, push_item_count, ParsedItem, PushResult};
use crate::state::{admit, push_cost, AppState};

/// Pushes minted items (one per parsed item, same order) and returns one verdict per item.
///
/// # Errors
///
/// [`ApiError`] when a partition's write path refused or failed.
pub async fn push_items(
    state: &AppState,
    parsed: &[ParsedItem],
    items: Vec<Item>,
) -> Result<Vec<PushResult>, ApiError> {
    // Group by partition, keeping body order inside each group.
    let mut order: Vec<PartitionKey> = Vec::new();
    let mut groups: HashMap<PartitionKey, (Vec<usize>, Vec<Item>)> = HashMap::new();
    for (index, (p, item)) in parsed.iter().zip(items).enumerate() {
        let key = PartitionKey::new(&p.queue, &p.partition);
        let group = groups.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            (Vec::new(), Vec::new())
        });
        group.0.push(index);
        group.1.push(item);
    }
    let mut slots: Vec<Option<PushResult>> = vec![None; parsed.len()];
    let mut pending = Vec::with_capacity(order.len());
    for key in order {
        let (indexes, items) = groups.remove(&key).expect("every key has a group");
        let meta: Vec<(Uuid, String)> = items
            .iter()
            .map(|i| (i.message_id, i.transaction_id.clone()))
            .collect();
        let registry = state.registry.clone();
        pending.push(async move {
            let verdicts = registry.push(&key, items).await;
            (key, indexes, meta, verdicts)
        });
    }
    for (key, indexes, meta, verdicts) in join_all(pending).await {
        let verdicts = verdicts?;
        // The commit's NOTIFY wakes this broker's pops too, through its own LISTEN; a second,
        // local wake would send a second consumer after the same partition. Only while the
        // LISTEN connection is down do pushes wake the local pops themselves.
        if verdicts.contains(&Verdict::Queued) && !state.wake.listening() {
            state.wake.wake(&key.queue, &key.partition);
        }
        for ((index, (minted, transaction_id)), verdict) in
            indexes.into_iter().zip(meta).zip(verdicts)
        {
            let message_id = match verdict {
                Verdict::Duplicate(original) => original,
                _ => minted,
            };
            slots[index] = Some(PushResult {
                index,
                message_id,
                transaction_id,
                queue_name: parsed[index].queue.clone(),
                status: verdict.as_str().to_string(),
                error: match verdict {
                    Verdict::Refused(why) => Some(why.message(&key.queue)),
                    _ => None,
                },
            });
        }
    }
    Ok(slots
        .into_iter()
        .map(|s| s.expect("every item got a verdict"))
        .collect())
}

/// `POST /api/v1/push`.
///
/// `producerSub` is the verified token's `sub` ([`Caller`], set by the auth gate), never a
/// field of the body.
pub async fn push(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let bytes = read_body(&req, payload, state.settings.max_body_bytes).await?;
    // Admission before the items are built: what they will cost is known from their count.
    let limit = state.settings.max_inflight_bytes;
    let cost = push_cost(bytes.len(), push_item_count(&bytes));
    if cost > limit {
        return Err(ApiError::TooMuchMemory { cost, limit });
    }
    let Some(_admission) = admit(&state.inflight, cost, limit) else {
        return Err(ApiError::Overloaded {
            retry_after_secs: 1,
        });
    };
    let mut parsed = parse_push_body(&bytes)?;
    drop(bytes);
    if parsed.is_empty() {
        return Ok(HttpResponse::Created().json(Vec::<PushResult>::new()));
    }
    let items = mint(&mut parsed, caller.producer_sub());
    let results = push_items(&state, &parsed, items).await?;
    state
        .metrics
        .pushed(results.iter().map(|r| r.status.as_str()));
    // The one push whose trouble shows in the status: maintenance mode with a failed spool write.
    if state.spool.state.maintenance() && results.iter().any(|r| r.status == "failed") {
        return Ok(HttpResponse::InternalServerError().json(results));
    }
    Ok(HttpResponse::Created().json(results))
}

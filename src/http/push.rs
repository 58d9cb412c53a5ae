//! `POST /api/v1/push`: validate the whole body, group items by (queue, partition) in body
//! order, hand each group to its partition actor, and answer one verdict per item in request
//! order. Nothing is written when any item is invalid. The body is JSON, or `QPB1` (binary,
//! reference 2.x §2.9): both become the same validated items before anything else happens.

use std::collections::HashMap;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use broker_actors::{Item, PartitionKey, Verdict};
use futures_util::future::join_all;
use uuid::Uuid;

use crate::auth::Caller;
use crate::http::body::read_body;
use crate::http::error::ApiError;
use crate::protocol::push::{
    mint, parse_push_body, push_item_count, write_results, ParsedItem, PushCounts, PushResult,
};
use crate::protocol::push_binary;
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
    // Group by partition, keeping body order inside each group. Items of one partition
    // usually come together, so the previous item's group is tried first; a key is built
    // once per group.
    let mut order: Vec<(PartitionKey, Vec<usize>, Vec<Item>)> = Vec::new();
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    let mut last: Option<((&str, &str), usize)> = None;
    for (index, (p, item)) in parsed.iter().zip(items).enumerate() {
        let names = (p.queue.as_str(), p.partition.as_str());
        let group = match last {
            Some((prev, group)) if prev == names => group,
            _ => *seen.entry(names).or_insert_with(|| {
                order.push((PartitionKey::new(names.0, names.1), Vec::new(), Vec::new()));
                order.len() - 1
            }),
        };
        last = Some((names, group));
        order[group].1.push(index);
        order[group].2.push(item);
    }
    let mut slots: Vec<Option<PushResult>> = vec![None; parsed.len()];
    let mut pending = Vec::with_capacity(order.len());
    for (key, indexes, items) in order {
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

/// `POST /api/v1/push`: a JSON body, or with `Content-Type: application/x-queen-push` a
/// `QPB1` body (reference 2.x §2.9, [`crate::protocol::push_binary`]).
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
    let binary = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(push_binary::is_binary);
    if binary {
        return push_qpb1(&state, &caller, bytes).await;
    }
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
    let parsed = parse_push_body(&bytes)?;
    drop(bytes);
    answer(&state, &caller, parsed, false).await
}

/// A `QPB1` body. Admission comes in two steps, since a compressed body's item count is
/// known only once it is inflated: first the body and what its zstd frames declare they
/// inflate to (before a byte is inflated), then the items.
async fn push_qpb1(
    state: &AppState,
    caller: &Caller,
    bytes: bytes::Bytes,
) -> Result<HttpResponse, ApiError> {
    let limit = state.settings.max_inflight_bytes;
    let inflated = push_binary::declared_inflated_len(&bytes);
    let cost = push_cost(bytes.len().saturating_add(inflated), 0);
    if cost > limit {
        return Err(ApiError::TooMuchMemory { cost, limit });
    }
    let Some(_bytes_admitted) = admit(&state.inflight, cost, limit) else {
        return Err(ApiError::Overloaded {
            retry_after_secs: 1,
        });
    };
    let decoded = push_binary::decode_push(&bytes, state.settings.max_body_bytes)
        .map_err(ApiError::binary)?;
    drop(bytes);
    let items_cost = push_cost(0, decoded.items.len());
    if cost.saturating_add(items_cost) > limit {
        return Err(ApiError::TooMuchMemory {
            cost: cost.saturating_add(items_cost),
            limit,
        });
    }
    let Some(_items_admitted) = admit(&state.inflight, items_cost, limit) else {
        return Err(ApiError::Overloaded {
            retry_after_secs: 1,
        });
    };
    answer(state, caller, decoded.items, decoded.counts).await
}

/// Pushes validated items and answers: one result per item (or, with `counts`, the `QPB1`
/// flag-2 counts), 201; 500 only in maintenance mode with a failed spool write.
async fn answer(
    state: &AppState,
    caller: &Caller,
    mut parsed: Vec<ParsedItem>,
    counts: bool,
) -> Result<HttpResponse, ApiError> {
    if parsed.is_empty() {
        return Ok(if counts {
            HttpResponse::Created().json(PushCounts::default())
        } else {
            HttpResponse::Created().json(Vec::<PushResult>::new())
        });
    }
    let items = mint(&mut parsed, caller.producer_sub());
    let results = push_items(state, &parsed, items).await?;
    state
        .metrics
        .pushed(results.iter().map(|r| r.status.as_str()));
    // The one push whose trouble shows in the status: maintenance mode with a failed spool write.
    let mut reply =
        if state.spool.state.maintenance() && results.iter().any(|r| r.status == "failed") {
            HttpResponse::InternalServerError()
        } else {
            HttpResponse::Created()
        };
    Ok(if counts {
        reply.json(PushCounts::of(&results))
    } else {
        let mut body = Vec::new();
        write_results(&results, &mut body);
        reply.content_type("application/json").body(body)
    })
}

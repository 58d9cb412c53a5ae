//! The Kafka views (docs/kafka.md, "Views"): `GET /api/v1/kafka/topics` (the topics made over
//! Kafka with each partition's log start and end offsets) and `GET /api/v1/kafka/groups` (the
//! Kafka groups with their committed offsets and lag per partition, and their members when
//! they use this broker). Both are paged (`limit`, default [`KAFKA_PER_PAGE`], `offset`,
//! `search` on the name) and read through indexes only (`storage::observe::kafka`).

use std::collections::{BTreeMap, HashMap};

use actix_web::{web, HttpResponse};
use serde_json::{json, Value};

use crate::http::error::{with_db, ApiError};
use crate::protocol::params::page_params;
use crate::protocol::time::iso_millis;
use crate::state::AppState;
use crate::storage::observe::kafka;

/// Topics or groups per page when `limit` is not given.
pub const KAFKA_PER_PAGE: i64 = 50;
/// The largest `limit`.
const MAX_PER_PAGE: i64 = 500;

/// `GET /api/v1/kafka/topics[?limit=50&offset=0&search=text]`.
pub async fn topics(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let page = page_params(&query, KAFKA_PER_PAGE, MAX_PER_PAGE)?;
    let ((rows, total), offsets) = with_db(&state, async {
        let mut conn = state.admin_pool.acquire().await?;
        let listed =
            kafka::topics(&mut conn, page.search.as_deref(), page.limit, page.offset).await?;
        let ids: Vec<i64> = listed.0.iter().map(|t| t.queue_id).collect();
        let offsets = kafka::partition_offsets(&mut conn, &ids).await?;
        Ok((listed, offsets))
    })
    .await?;
    let mut by_topic: HashMap<i64, Vec<Value>> = HashMap::new();
    for o in offsets {
        by_topic.entry(o.queue_id).or_default().push(json!({
            "partition": o.partition,
            "logStartOffset": o.log_start,
            "endOffset": o.end,
            "records": o.end - o.log_start,
        }));
    }
    let topics: Vec<Value> = rows
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "partitions": t.partitions,
                "createdAt": iso_millis(t.created_at),
                "offsets": by_topic.remove(&t.queue_id).unwrap_or_default(),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "topics": topics,
        "total": total,
        "limit": page.limit,
        "offset": page.offset,
    })))
}

/// `GET /api/v1/kafka/groups[?limit=50&offset=0&search=text]`: `membersKnown` is false when
/// this broker's Kafka listener is off (members are in the memory of the broker they use);
/// each group's `coordinator` names the broker holding it (node id, address, lease end), or is
/// null when none does, so a group shown `Empty` here can be looked up where it lives.
pub async fn groups(
    query: web::Query<HashMap<String, String>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let page = page_params(&query, KAFKA_PER_PAGE, MAX_PER_PAGE)?;
    let live = state.kafka_members.groups();
    let mut members: BTreeMap<String, _> = live
        .iter()
        .flatten()
        .map(|g| (g.group.clone(), g.clone()))
        .collect();
    let here: Vec<String> = members.keys().cloned().collect();
    let ((names, total), offsets, coordinators) = with_db(&state, async {
        let mut conn = state.admin_pool.acquire().await?;
        let named = kafka::group_names(
            &mut conn,
            &here,
            page.search.as_deref(),
            page.limit,
            page.offset,
        )
        .await?;
        let offsets = kafka::group_offsets(&mut conn, &named.0).await?;
        let coordinators = kafka::group_coordinators(&mut conn, &named.0).await?;
        Ok((named, offsets, coordinators))
    })
    .await?;
    let mut coordinator_of: HashMap<String, Value> = coordinators
        .into_iter()
        .map(|c| {
            let v = json!({
                "nodeId": c.node_id,
                "host": c.host,
                "port": c.port,
                "leaseUntil": iso_millis(c.lease_until),
            });
            (c.group, v)
        })
        .collect();
    let mut by_group: HashMap<String, Vec<Value>> = HashMap::new();
    for o in offsets {
        by_group.entry(o.group.clone()).or_default().push(json!({
            "topic": o.topic,
            "partition": o.partition,
            "committedOffset": o.committed,
            "endOffset": o.end,
            "lag": o.lag,
        }));
    }
    let groups: Vec<Value> = names
        .iter()
        .map(|name| {
            let offsets = by_group.remove(name).unwrap_or_default();
            let lag: i64 = offsets.iter().filter_map(|o| o["lag"].as_i64()).sum();
            let live = members.remove(name);
            json!({
                "group": name,
                "state": live.as_ref().map_or("Empty", |g| g.state),
                "generation": live.as_ref().map(|g| g.generation),
                "protocol": live.as_ref().and_then(|g| g.protocol.clone()),
                "leader": live.as_ref().and_then(|g| g.leader.clone()),
                "members": live.map(|g| g.members).unwrap_or_default(),
                "lag": lag,
                "offsets": offsets,
                "coordinator": coordinator_of.remove(name).unwrap_or(Value::Null),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "groups": groups,
        "total": total,
        "limit": page.limit,
        "offset": page.offset,
        "membersKnown": live.is_some(),
    })))
}

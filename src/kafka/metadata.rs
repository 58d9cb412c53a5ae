//! Metadata, CreateTopics and DeleteTopics: topics are queues. Metadata lists the brokers on
//! the database (`crate::kafka::cluster`) and names the broker answering the leader of every
//! partition: every broker serves every partition, so a client fetches and produces through
//! whichever broker it last asked (a client that asks another broker hears the same of that
//! one, and after a broker dies the next answer names a live one).
//!
//! A topic named in a Metadata request (when the client allows it) or a Produce that does not
//! exist is created with `QUEEN_KAFKA_DEFAULT_PARTITIONS` partitions, as Kafka's
//! `auto.create.topics.enable` does.

use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::kafka::cluster;
use crate::kafka::{code, valid_topic, Kafka};
use crate::storage::kafka as store;
use crate::storage::StorageError;

/// The cluster id every broker of this front door reports.
const CLUSTER_ID: &str = "queen-broker";

/// The Kafka error for a storage failure: retriable when PostgreSQL is away.
pub fn storage_code(e: &StorageError) -> i16 {
    if e.is_unreachable() {
        code::KAFKA_STORAGE_ERROR
    } else {
        code::UNKNOWN_SERVER_ERROR
    }
}

/// Partition counts of `names`, creating the missing ones (valid names only) when `create`.
/// Names that do not exist (and were not created) are absent.
///
/// # Errors
///
/// Any database error.
pub async fn topic_counts(
    kafka: &Kafka,
    names: &[String],
    create: bool,
) -> Result<std::collections::HashMap<String, i32>, StorageError> {
    let mut conn = kafka.state.pool.acquire().await?;
    let mut found: std::collections::HashMap<String, i32> = store::topics(&mut conn, Some(names))
        .await?
        .into_iter()
        .map(|t| (t.name, t.partitions))
        .collect();
    if create {
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !found.contains_key(*n) && valid_topic(n))
            .collect();
        for name in missing {
            store::create_topic(&mut conn, name, kafka.settings.default_partitions).await?;
            tracing::info!(topic = %name, partitions = kafka.settings.default_partitions,
                "Kafka topic created on first use");
        }
        if found.len() < names.len() {
            found = store::topics(&mut conn, Some(names))
                .await?
                .into_iter()
                .map(|t| (t.name, t.partitions))
                .collect();
        }
    }
    Ok(found)
}

fn topic_entry(node: i32, name: &str, partitions: i32, error: i16) -> MetadataResponseTopic {
    let mut topic = MetadataResponseTopic::default();
    topic.name = Some(TopicName(StrBytes::from_string(name.to_string())));
    topic.error_code = error;
    topic.topic_authorized_operations = i32::MIN;
    topic.partitions = (0..partitions)
        .map(|i| {
            let mut p = MetadataResponsePartition::default();
            p.partition_index = i;
            p.leader_id = BrokerId(node);
            // -1: no leader epochs, so clients do not validate offsets with
            // OffsetForLeaderEpoch (not served).
            p.leader_epoch = -1;
            p.replica_nodes = vec![BrokerId(node)];
            p.isr_nodes = vec![BrokerId(node)];
            p
        })
        .collect();
    topic
}

/// Metadata: the brokers, and the topics asked for (every queue when the request names none).
pub async fn metadata(kafka: &Kafka, request: MetadataRequest, version: i16) -> MetadataResponse {
    metadata_creating(kafka, request, version, true).await
}

/// Metadata, creating the topics it names only when `may_create` (the caller may produce or
/// configure) and the request allows it.
pub async fn metadata_creating(
    kafka: &Kafka,
    request: MetadataRequest,
    version: i16,
    may_create: bool,
) -> MetadataResponse {
    let mut response = MetadataResponse::default();
    response.brokers = cluster::brokers(kafka)
        .into_iter()
        .map(|b| {
            let mut broker = MetadataResponseBroker::default();
            broker.node_id = BrokerId(b.node_id);
            broker.host = StrBytes::from_string(b.host);
            broker.port = b.port;
            broker
        })
        .collect();
    response.cluster_id = Some(StrBytes::from_static_str(CLUSTER_ID));
    response.cluster_authorized_operations = i32::MIN;
    // Not registered yet (PostgreSQL was away at the start): no node id to name as a leader;
    // LEADER_NOT_AVAILABLE is retriable.
    let Some(node) = kafka.cluster.node_id() else {
        response.controller_id = BrokerId(-1);
        if let Some(topics) = request.topics {
            response.topics = topics
                .into_iter()
                .filter_map(|t| t.name)
                .map(|n| topic_entry(-1, n.0.as_str(), 0, code::LEADER_NOT_AVAILABLE))
                .collect();
        }
        return response;
    };
    response.controller_id = BrokerId(node);
    // v0: an empty list means every topic; v1+: null means every topic.
    let named: Option<Vec<String>> = match request.topics {
        None => None,
        Some(t) if t.is_empty() && version == 0 => None,
        Some(t) => Some(
            t.into_iter()
                .filter_map(|t| t.name.map(|n| n.0.to_string()))
                .collect(),
        ),
    };
    let create = may_create && (version < 4 || request.allow_auto_topic_creation);
    match named {
        None => {
            let listed = async {
                let mut conn = kafka.state.pool.acquire().await?;
                store::topics(&mut conn, None).await
            }
            .await;
            match listed {
                Ok(topics) => {
                    response.topics = topics
                        .into_iter()
                        .filter(|t| valid_topic(&t.name))
                        .map(|t| topic_entry(node, &t.name, t.partitions, code::NONE))
                        .collect();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Kafka metadata: listing topics failed");
                }
            }
        }
        Some(names) => match topic_counts(kafka, &names, create).await {
            Ok(counts) => {
                response.topics = names
                    .iter()
                    .map(|n| match counts.get(n) {
                        Some(p) => topic_entry(node, n, *p, code::NONE),
                        None if !valid_topic(n) => {
                            topic_entry(node, n, 0, code::INVALID_TOPIC_EXCEPTION)
                        }
                        None => topic_entry(node, n, 0, code::UNKNOWN_TOPIC_OR_PARTITION),
                    })
                    .collect();
            }
            Err(e) => {
                tracing::warn!(error = %e, "Kafka metadata: reading topics failed");
                // LEADER_NOT_AVAILABLE is retriable: the client asks again.
                response.topics = names
                    .iter()
                    .map(|n| topic_entry(node, n, 0, code::LEADER_NOT_AVAILABLE))
                    .collect();
            }
        },
    }
    response
}

/// CreateTopics: a queue with partitions `0 .. num_partitions` for each topic (-1: the
/// default count); an existing queue is `TOPIC_ALREADY_EXISTS`.
pub async fn create_topics(
    kafka: &Kafka,
    request: CreateTopicsRequest,
    _version: i16,
) -> CreateTopicsResponse {
    let mut response = CreateTopicsResponse::default();
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let partitions = if topic.num_partitions == -1 {
            kafka.settings.default_partitions
        } else {
            topic.num_partitions
        };
        let mut result = CreatableTopicResult::default();
        result.name = topic.name.clone();
        result.num_partitions = partitions;
        result.replication_factor = 1;
        result.error_code = if !valid_topic(&name) {
            code::INVALID_TOPIC_EXCEPTION
        } else if !(1..=100_000).contains(&partitions) {
            code::INVALID_PARTITIONS
        } else if request.validate_only {
            code::NONE
        } else {
            let created = async {
                let mut conn = kafka.state.pool.acquire().await?;
                store::create_topic(&mut conn, &name, partitions).await
            }
            .await;
            match created {
                Ok(true) => {
                    tracing::info!(topic = %name, partitions, "Kafka topic created");
                    code::NONE
                }
                Ok(false) => code::TOPIC_ALREADY_EXISTS,
                Err(e) => {
                    tracing::warn!(topic = %name, error = %e, "Kafka CreateTopics failed");
                    result.error_message = Some(StrBytes::from_string(e.to_string()));
                    storage_code(&e)
                }
            }
        };
        response.topics.push(result);
    }
    response
}

/// DeleteTopics: deletes the queues (their messages, partitions and cursors).
pub async fn delete_topics(
    kafka: &Kafka,
    request: DeleteTopicsRequest,
    _version: i16,
) -> DeleteTopicsResponse {
    let mut names: Vec<TopicName> = request.topic_names;
    names.extend(request.topics.into_iter().filter_map(|t| t.name));
    let mut response = DeleteTopicsResponse::default();
    for name in names {
        let text = name.0.to_string();
        let deleted = async {
            let mut conn = kafka.state.pool.acquire().await?;
            crate::storage::queues::catalog::delete(&mut conn, &text).await
        }
        .await;
        let mut result = DeletableTopicResult::default();
        result.name = Some(name);
        result.error_code = match deleted {
            Ok(true) => {
                tracing::info!(topic = %text, "Kafka topic deleted");
                code::NONE
            }
            Ok(false) => code::UNKNOWN_TOPIC_OR_PARTITION,
            Err(e) => {
                tracing::warn!(topic = %text, error = %e, "Kafka DeleteTopics failed");
                storage_code(&e)
            }
        };
        response.responses.push(result);
    }
    response
}

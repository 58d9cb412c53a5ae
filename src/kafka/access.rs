//! What each Kafka API requires of an authenticated caller's roles, and the answer that
//! refuses it. The requirements are the HTTP route table's (`http::routes`, reference §10.4):
//! a Kafka API needs the capability of the HTTP route doing the same thing, so a token may do
//! the same over both doors. Refusals are the API's own error codes: per topic
//! `TOPIC_AUTHORIZATION_FAILED`, per group `GROUP_AUTHORIZATION_FAILED`, for the cluster-wide
//! ones `CLUSTER_AUTHORIZATION_FAILED`. Never decides who the caller is (`kafka::sasl`).

use bytes::Bytes;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{self as m, ApiKey};

use crate::auth::roles::Capability;
use crate::kafka::code;

/// The capability an API requires, beside the HTTP route doing the same (`None`: any
/// authenticated caller, as Metadata, which every client needs; it creates a topic only for a
/// caller that may produce, as a push creates a queue).
pub const REQUIRED: &[(ApiKey, Capability, &str)] = &[
    (ApiKey::Produce, Capability::Produce, "POST /api/v1/push"),
    (
        ApiKey::InitProducerId,
        Capability::Produce,
        "POST /api/v1/push",
    ),
    (
        ApiKey::Fetch,
        Capability::Consume,
        "GET /api/v1/pop/queue/{queue}",
    ),
    (
        ApiKey::ListOffsets,
        Capability::Consume,
        "GET /api/v1/pop/queue/{queue}",
    ),
    (
        ApiKey::FindCoordinator,
        Capability::Consume,
        "POST /api/v1/ack",
    ),
    (ApiKey::JoinGroup, Capability::Consume, "POST /api/v1/ack"),
    (ApiKey::SyncGroup, Capability::Consume, "POST /api/v1/ack"),
    (ApiKey::Heartbeat, Capability::Consume, "POST /api/v1/ack"),
    (ApiKey::LeaveGroup, Capability::Consume, "POST /api/v1/ack"),
    (
        ApiKey::OffsetCommit,
        Capability::Consume,
        "POST /api/v1/ack",
    ),
    (ApiKey::OffsetFetch, Capability::Consume, "POST /api/v1/ack"),
    (
        ApiKey::ListGroups,
        Capability::Read,
        "GET /api/v1/consumer-groups",
    ),
    (
        ApiKey::DescribeGroups,
        Capability::Read,
        "GET /api/v1/consumer-groups/{group}",
    ),
    (
        ApiKey::CreateTopics,
        Capability::Configure,
        "POST /api/v1/configure",
    ),
    (
        ApiKey::DeleteTopics,
        Capability::Admin,
        "DELETE /api/v1/resources/queues/{queue}",
    ),
];

/// The capability API `key` requires (`Public`: any authenticated caller).
pub fn required(key: ApiKey) -> Capability {
    REQUIRED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map_or(Capability::Public, |(_, capability, _)| *capability)
}

/// Produce refused: every partition `TOPIC_AUTHORIZATION_FAILED`.
pub fn produce(request: m::ProduceRequest, _version: i16) -> m::ProduceResponse {
    let mut response = m::ProduceResponse::default();
    for topic in request.topic_data {
        let mut entry = TopicProduceResponse::default();
        entry.name = topic.name;
        for p in topic.partition_data {
            let mut r = PartitionProduceResponse::default();
            r.index = p.index;
            r.error_code = code::TOPIC_AUTHORIZATION_FAILED;
            r.base_offset = -1;
            r.log_append_time_ms = -1;
            r.log_start_offset = -1;
            entry.partition_responses.push(r);
        }
        response.responses.push(entry);
    }
    response
}

/// InitProducerId refused: `CLUSTER_AUTHORIZATION_FAILED` (Kafka's answer without
/// IdempotentWrite).
pub fn init_producer_id(
    _request: m::InitProducerIdRequest,
    _version: i16,
) -> m::InitProducerIdResponse {
    let mut response = m::InitProducerIdResponse::default();
    response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
    response.producer_id = m::ProducerId(-1);
    response.producer_epoch = -1;
    response
}

/// Fetch refused: every partition `TOPIC_AUTHORIZATION_FAILED`.
pub fn fetch(request: m::FetchRequest, _version: i16) -> m::FetchResponse {
    let mut response = m::FetchResponse::default();
    for topic in request.topics {
        let mut entry = FetchableTopicResponse::default();
        entry.topic = topic.topic;
        entry.topic_id = topic.topic_id;
        for p in topic.partitions {
            let mut r = PartitionData::default();
            r.partition_index = p.partition;
            r.error_code = code::TOPIC_AUTHORIZATION_FAILED;
            r.high_watermark = -1;
            r.last_stable_offset = -1;
            r.log_start_offset = -1;
            r.records = Some(Bytes::new());
            entry.partitions.push(r);
        }
        response.responses.push(entry);
    }
    response
}

/// ListOffsets refused: every partition `TOPIC_AUTHORIZATION_FAILED`.
pub fn list_offsets(request: m::ListOffsetsRequest, _version: i16) -> m::ListOffsetsResponse {
    let mut response = m::ListOffsetsResponse::default();
    for topic in request.topics {
        let mut entry = ListOffsetsTopicResponse::default();
        entry.name = topic.name;
        for p in topic.partitions {
            let mut r = ListOffsetsPartitionResponse::default();
            r.partition_index = p.partition_index;
            r.error_code = code::TOPIC_AUTHORIZATION_FAILED;
            r.offset = -1;
            r.timestamp = -1;
            entry.partitions.push(r);
        }
        response.topics.push(entry);
    }
    response
}

/// FindCoordinator refused: `GROUP_AUTHORIZATION_FAILED` (per key from v4).
pub fn find_coordinator(
    request: m::FindCoordinatorRequest,
    version: i16,
) -> m::FindCoordinatorResponse {
    let mut response = m::FindCoordinatorResponse::default();
    response.node_id = m::BrokerId(-1);
    response.port = -1;
    if version >= 4 {
        for key in request.coordinator_keys {
            let mut c = Coordinator::default();
            c.key = key;
            c.node_id = m::BrokerId(-1);
            c.port = -1;
            c.error_code = code::GROUP_AUTHORIZATION_FAILED;
            response.coordinators.push(c);
        }
    } else {
        response.error_code = code::GROUP_AUTHORIZATION_FAILED;
    }
    response
}

macro_rules! group_refusal {
    ($name:ident, $req:ty, $resp:ty) => {
        /// Refused: `GROUP_AUTHORIZATION_FAILED`.
        pub fn $name(_request: $req, _version: i16) -> $resp {
            let mut response = <$resp>::default();
            response.error_code = code::GROUP_AUTHORIZATION_FAILED;
            response
        }
    };
}

group_refusal!(join_group, m::JoinGroupRequest, m::JoinGroupResponse);
group_refusal!(sync_group, m::SyncGroupRequest, m::SyncGroupResponse);
group_refusal!(heartbeat, m::HeartbeatRequest, m::HeartbeatResponse);
group_refusal!(leave_group, m::LeaveGroupRequest, m::LeaveGroupResponse);

/// OffsetCommit refused: every partition `GROUP_AUTHORIZATION_FAILED`.
pub fn offset_commit(request: m::OffsetCommitRequest, _version: i16) -> m::OffsetCommitResponse {
    let mut response = m::OffsetCommitResponse::default();
    for topic in request.topics {
        let mut entry = OffsetCommitResponseTopic::default();
        entry.name = topic.name;
        for p in topic.partitions {
            let mut r = OffsetCommitResponsePartition::default();
            r.partition_index = p.partition_index;
            r.error_code = code::GROUP_AUTHORIZATION_FAILED;
            entry.partitions.push(r);
        }
        response.topics.push(entry);
    }
    response
}

/// OffsetFetch refused: `GROUP_AUTHORIZATION_FAILED` at the top (v2+) and per partition.
pub fn offset_fetch(request: m::OffsetFetchRequest, _version: i16) -> m::OffsetFetchResponse {
    let mut response = m::OffsetFetchResponse::default();
    response.error_code = code::GROUP_AUTHORIZATION_FAILED;
    for topic in request.topics.unwrap_or_default() {
        let mut entry = OffsetFetchResponseTopic::default();
        entry.name = topic.name;
        for index in topic.partition_indexes {
            let mut r = OffsetFetchResponsePartition::default();
            r.partition_index = index;
            r.committed_offset = -1;
            r.committed_leader_epoch = -1;
            r.error_code = code::GROUP_AUTHORIZATION_FAILED;
            entry.partitions.push(r);
        }
        response.topics.push(entry);
    }
    response
}

/// ListGroups refused: `CLUSTER_AUTHORIZATION_FAILED`.
pub fn list_groups(_request: m::ListGroupsRequest, _version: i16) -> m::ListGroupsResponse {
    let mut response = m::ListGroupsResponse::default();
    response.error_code = code::CLUSTER_AUTHORIZATION_FAILED;
    response
}

/// DescribeGroups refused: every group `GROUP_AUTHORIZATION_FAILED`.
pub fn describe_groups(
    request: m::DescribeGroupsRequest,
    _version: i16,
) -> m::DescribeGroupsResponse {
    let mut response = m::DescribeGroupsResponse::default();
    for group in request.groups {
        let mut d = DescribedGroup::default();
        d.group_id = group;
        d.error_code = code::GROUP_AUTHORIZATION_FAILED;
        d.authorized_operations = i32::MIN;
        response.groups.push(d);
    }
    response
}

/// CreateTopics refused: every topic `TOPIC_AUTHORIZATION_FAILED`.
pub fn create_topics(request: m::CreateTopicsRequest, _version: i16) -> m::CreateTopicsResponse {
    let mut response = m::CreateTopicsResponse::default();
    for topic in request.topics {
        let mut r = CreatableTopicResult::default();
        r.name = topic.name;
        r.num_partitions = -1;
        r.replication_factor = -1;
        r.error_code = code::TOPIC_AUTHORIZATION_FAILED;
        response.topics.push(r);
    }
    response
}

/// DeleteTopics refused: every topic `TOPIC_AUTHORIZATION_FAILED`.
pub fn delete_topics(request: m::DeleteTopicsRequest, _version: i16) -> m::DeleteTopicsResponse {
    let mut response = m::DeleteTopicsResponse::default();
    // v0–5 name topics in `topic_names`, v6+ in `topics` (by name or id).
    let named = request
        .topic_names
        .into_iter()
        .map(|name| (Some(name), None))
        .chain(
            request
                .topics
                .into_iter()
                .map(|t| (t.name, Some(t.topic_id))),
        );
    for (name, id) in named {
        let mut r = DeletableTopicResult::default();
        r.name = name;
        if let Some(id) = id {
            r.topic_id = id;
        }
        r.error_code = code::TOPIC_AUTHORIZATION_FAILED;
        response.responses.push(r);
    }
    response
}

//! ApiVersions, the table of what this front door serves, and the answer to an API it does not
//! serve. ApiVersions is answered in both request styles: v0–v2 (classic) and v3 (flexible,
//! with the client's name). An ApiVersions version above ours is answered, as the protocol
//! says, in the v0 format with `UNSUPPORTED_VERSION` and the supported list, so the client
//! retries with a version from it.

use bytes::BytesMut;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};
use kafka_protocol::protocol::Encodable;

use crate::kafka::code;

/// Every API served, with the versions served (inside what the codec supports).
pub const SERVED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// The versions of `key` served, if it is served.
pub fn served(key: ApiKey) -> Option<(i16, i16)> {
    SERVED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, min, max)| (*min, *max))
}

/// The ApiVersions answer (at the request's version; `error` set when it is unsupported).
pub fn api_versions(error: i16) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = error;
    response.api_keys = SERVED
        .iter()
        .map(|(key, min, max)| {
            let mut v = ApiVersion::default();
            v.api_key = *key as i16;
            v.min_version = *min;
            v.max_version = *max;
            v
        })
        .collect();
    response
}

/// Encodes the answer to a request of an API this front door does not serve (or a version of
/// it the codec cannot read), as that API's response with its top-level error code set to
/// `UNSUPPORTED_VERSION`. `None` when the API has no top-level error code or the codec cannot write that
/// version: the caller closes the connection, since no answer the client could read exists.
pub fn unserved(key: ApiKey, version: i16, out: &mut BytesMut) -> Option<()> {
    let range = key.valid_versions();
    if !(range.min..=range.max).contains(&version) {
        return None;
    }
    macro_rules! answer {
        ($ty:ty, $code:expr) => {{
            let mut response = <$ty>::default();
            response.error_code = $code;
            response.encode(out, version).ok()
        }};
    }
    use kafka_protocol::messages as m;
    match key {
        ApiKey::DescribeAcls => answer!(m::DescribeAclsResponse, code::UNSUPPORTED_VERSION),
        ApiKey::EndTxn => answer!(m::EndTxnResponse, code::UNSUPPORTED_VERSION),
        ApiKey::AddOffsetsToTxn => answer!(m::AddOffsetsToTxnResponse, code::UNSUPPORTED_VERSION),
        ApiKey::AddPartitionsToTxn => {
            answer!(m::AddPartitionsToTxnResponse, code::UNSUPPORTED_VERSION)
        }
        ApiKey::DescribeCluster => answer!(m::DescribeClusterResponse, code::UNSUPPORTED_VERSION),
        ApiKey::DescribeClientQuotas => {
            answer!(m::DescribeClientQuotasResponse, code::UNSUPPORTED_VERSION)
        }
        ApiKey::CreateDelegationToken => {
            answer!(m::CreateDelegationTokenResponse, code::UNSUPPORTED_VERSION)
        }
        ApiKey::DescribeDelegationToken => {
            answer!(
                m::DescribeDelegationTokenResponse,
                code::UNSUPPORTED_VERSION
            )
        }
        ApiKey::ExpireDelegationToken => {
            answer!(m::ExpireDelegationTokenResponse, code::UNSUPPORTED_VERSION)
        }
        ApiKey::RenewDelegationToken => {
            answer!(m::RenewDelegationTokenResponse, code::UNSUPPORTED_VERSION)
        }
        ApiKey::ListPartitionReassignments => {
            answer!(
                m::ListPartitionReassignmentsResponse,
                code::UNSUPPORTED_VERSION
            )
        }
        ApiKey::DescribeUserScramCredentials => {
            answer!(
                m::DescribeUserScramCredentialsResponse,
                code::UNSUPPORTED_VERSION
            )
        }
        ApiKey::ConsumerGroupHeartbeat => {
            answer!(m::ConsumerGroupHeartbeatResponse, code::UNSUPPORTED_VERSION)
        }
        ApiKey::OffsetDelete => answer!(m::OffsetDeleteResponse, code::UNSUPPORTED_VERSION),
        // Our own APIs at a version the codec reads but we do not: their top-level error.
        ApiKey::InitProducerId => answer!(m::InitProducerIdResponse, code::UNSUPPORTED_VERSION),
        ApiKey::FindCoordinator => {
            answer!(m::FindCoordinatorResponse, code::UNSUPPORTED_VERSION)
        }
        ApiKey::Heartbeat => answer!(m::HeartbeatResponse, code::UNSUPPORTED_VERSION),
        ApiKey::SyncGroup => answer!(m::SyncGroupResponse, code::UNSUPPORTED_VERSION),
        ApiKey::JoinGroup => answer!(m::JoinGroupResponse, code::UNSUPPORTED_VERSION),
        ApiKey::LeaveGroup => answer!(m::LeaveGroupResponse, code::UNSUPPORTED_VERSION),
        ApiKey::Metadata => answer!(m::MetadataResponse, code::UNSUPPORTED_VERSION),
        _ => None,
    }
}

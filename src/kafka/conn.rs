//! One Kafka connection: read a size-prefixed frame, decode its header, answer it, in order.
//!
//! A frame larger than `QUEEN_KAFKA_MAX_FRAME_BYTES` (or smaller than a header), a frame
//! that arrives too slowly, bytes that do not decode and a client that does not read its
//! answers close this connection only; the others are served on. A frame's bytes count
//! against the front door's budget (`Kafka::frame_budget`) until its answer is written, so
//! memory stays bounded however many clients send at once. Nothing here panics on input.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::kafka::{fetch, groups, metadata, produce, versions, Kafka};

/// A connection silent this long between requests is closed (Kafka's
/// `connections.max.idle.ms` default).
const IDLE: Duration = Duration::from_secs(600);
/// A frame whose bytes take longer than this to arrive closes its connection.
const FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// An answer the client takes longer than this to read closes its connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a connection ends (logged at debug for a client that left, warn for a broken rule).
#[derive(Debug, thiserror::Error)]
enum Closed {
    #[error("the client closed the connection")]
    Eof,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("no request for {IDLE:?}")]
    Idle,
    #[error("a frame of {0} bytes is outside 8 ..= {1} (QUEEN_KAFKA_MAX_FRAME_BYTES)")]
    FrameSize(i64, usize),
    #[error("a frame did not arrive within {FRAME_TIMEOUT:?}")]
    SlowFrame,
    #[error("the client did not read its answer within {WRITE_TIMEOUT:?}")]
    SlowReader,
    #[error("api key {key} v{version}: {reason}")]
    Undecodable {
        key: i16,
        version: i16,
        reason: String,
    },
}

/// Serves one connection until it closes.
pub async fn serve_connection(mut stream: TcpStream, peer: SocketAddr, kafka: &Kafka) {
    let _ = stream.set_nodelay(true);
    match serve_frames(&mut stream, kafka).await {
        Err(Closed::Eof) | Ok(()) => tracing::debug!(%peer, "Kafka connection closed"),
        Err(e @ (Closed::Io(_) | Closed::Idle)) => {
            tracing::debug!(%peer, reason = %e, "Kafka connection closed")
        }
        Err(e) => tracing::warn!(%peer, reason = %e, "Kafka connection closed by the broker"),
    }
}

async fn serve_frames(stream: &mut TcpStream, kafka: &Kafka) -> Result<(), Closed> {
    let max = kafka.settings.max_frame_bytes;
    loop {
        let mut size = [0u8; 4];
        match tokio::time::timeout(IDLE, stream.read_exact(&mut size)).await {
            Err(_) => return Err(Closed::Idle),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(Closed::Eof),
            Ok(r) => r?,
        };
        let len = i32::from_be_bytes(size) as i64;
        if len < 8 || len as u64 > max as u64 {
            return Err(Closed::FrameSize(len, max));
        }
        let len = len as usize;
        // The budget is counted in KiB; a frame takes its share before its bytes are read.
        let kib = u32::try_from(len.div_ceil(1024)).unwrap_or(u32::MAX);
        let Ok(_permit) = kafka.frame_budget.acquire_many(kib).await else {
            return Ok(());
        };
        let mut frame = BytesMut::zeroed(len);
        match tokio::time::timeout(FRAME_TIMEOUT, stream.read_exact(&mut frame)).await {
            Err(_) => return Err(Closed::SlowFrame),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(Closed::Eof),
            Ok(r) => r?,
        };
        let Some(answer) = answer(frame.freeze(), kafka).await? else {
            continue; // acks=0 produce: no answer
        };
        match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&answer)).await {
            Err(_) => return Err(Closed::SlowReader),
            Ok(r) => r?,
        }
    }
}

/// A request's header, as far as dispatch needs it.
struct Head {
    key: ApiKey,
    version: i16,
    correlation_id: i32,
}

/// Encodes a whole answer: size, response header (in the API's header version), body.
fn frame_answer<R: Encodable>(
    head: &Head,
    response_header_version: i16,
    body: &R,
) -> Result<BytesMut, Closed> {
    let mut out = BytesMut::with_capacity(256);
    out.put_i32(0);
    let mut header = ResponseHeader::default();
    header.correlation_id = head.correlation_id;
    let encoded = header
        .encode(&mut out, response_header_version)
        .and_then(|()| body.encode(&mut out, head.version));
    if let Err(e) = encoded {
        return Err(Closed::Undecodable {
            key: head.key as i16,
            version: head.version,
            reason: format!("the answer does not encode: {e:#}"),
        });
    }
    let len = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Ok(out)
}

/// Decodes the body of a request of type `Req` at the header's version.
///
/// The codec is trusted not to panic, but a panic on hostile bytes would only end this
/// connection's task anyway; it is caught here so the connection is closed with a reason.
fn decode<Req: Decodable>(head: &Head, body: &mut Bytes) -> Result<Req, Closed> {
    let undecodable = |reason: String| Closed::Undecodable {
        key: head.key as i16,
        version: head.version,
        reason,
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Req::decode(body, head.version)
    })) {
        Ok(Ok(request)) => Ok(request),
        Ok(Err(e)) => Err(undecodable(format!("{e:#}"))),
        Err(_) => Err(undecodable("the decoder panicked".into())),
    }
}

/// Answers one frame (`None`: the request wants no answer).
async fn answer(mut frame: Bytes, kafka: &Kafka) -> Result<Option<BytesMut>, Closed> {
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let undecodable = |reason: String| Closed::Undecodable {
        key: raw_key,
        version,
        reason,
    };
    let Ok(key) = ApiKey::try_from(raw_key) else {
        return Err(undecodable("unknown API key".into()));
    };
    // ApiVersions first: its answer must reach a client of any version, in the v0 header.
    if key == ApiKey::ApiVersions {
        let correlation_id = if frame.len() >= 8 {
            i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]])
        } else {
            return Err(undecodable("truncated header".into()));
        };
        let (min, max) = versions::served(key).expect("ApiVersions is served");
        let head = Head {
            key,
            version,
            correlation_id,
        };
        if version < min || version > max {
            let v0 = Head { version: 0, ..head };
            return frame_answer(
                &v0,
                0,
                &versions::api_versions(crate::kafka::code::UNSUPPORTED_VERSION),
            )
            .map(Some);
        }
        // The body is read only to check it decodes (the client's name is not used).
        let header_version = key.request_header_version(version);
        RequestHeader::decode(&mut frame, header_version)
            .map_err(|e| undecodable(format!("header: {e:#}")))?;
        decode::<kafka_protocol::messages::ApiVersionsRequest>(&head, &mut frame)?;
        return frame_answer(&head, 0, &versions::api_versions(0)).map(Some);
    }
    let range = key.valid_versions();
    let codec_reads = (range.min..=range.max).contains(&version);
    let served = versions::served(key).is_some();
    if !codec_reads || !served {
        // Read the correlation id from the classic header position (it is the same place in
        // every header version), then answer with the API's error if it has one.
        if frame.len() < 8 {
            return Err(undecodable("truncated header".into()));
        }
        let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let mut body = BytesMut::new();
        if versions::unserved(key, version, &mut body).is_none() {
            return Err(undecodable("an API or version not served".into()));
        }
        tracing::debug!(
            ?key,
            version,
            "Kafka request of an API not served, answered with an error"
        );
        let mut out = BytesMut::with_capacity(body.len() + 16);
        out.put_i32(0);
        let mut header = ResponseHeader::default();
        header.correlation_id = correlation_id;
        header
            .encode(&mut out, key.response_header_version(version))
            .map_err(|e| undecodable(format!("answer header: {e:#}")))?;
        out.extend_from_slice(&body);
        let len = (out.len() - 4) as i32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        return Ok(Some(out));
    }
    let header = RequestHeader::decode(&mut frame, key.request_header_version(version))
        .map_err(|e| undecodable(format!("header: {e:#}")))?;
    let head = Head {
        key,
        version,
        correlation_id: header.correlation_id,
    };
    let mut body = frame;
    macro_rules! serve {
        ($req:ty, $handler:expr) => {{
            let request: $req = decode(&head, &mut body)?;
            let response = $handler(kafka, request, version).await;
            frame_answer(&head, key.response_header_version(version), &response).map(Some)
        }};
    }
    use kafka_protocol::messages as m;
    let answer = match key {
        ApiKey::Metadata => serve!(m::MetadataRequest, metadata::metadata),
        ApiKey::CreateTopics => serve!(m::CreateTopicsRequest, metadata::create_topics),
        ApiKey::DeleteTopics => serve!(m::DeleteTopicsRequest, metadata::delete_topics),
        ApiKey::Produce => {
            let request: m::ProduceRequest = decode(&head, &mut body)?;
            let acks = request.acks;
            let response = produce::produce(kafka, request, version).await;
            if acks == 0 {
                return Ok(None);
            }
            frame_answer(&head, key.response_header_version(version), &response).map(Some)
        }
        ApiKey::InitProducerId => serve!(m::InitProducerIdRequest, produce::init_producer_id),
        ApiKey::Fetch => serve!(m::FetchRequest, fetch::fetch),
        ApiKey::ListOffsets => serve!(m::ListOffsetsRequest, fetch::list_offsets),
        ApiKey::FindCoordinator => serve!(m::FindCoordinatorRequest, groups::find_coordinator),
        ApiKey::JoinGroup => serve!(m::JoinGroupRequest, groups::join_group),
        ApiKey::SyncGroup => serve!(m::SyncGroupRequest, groups::sync_group),
        ApiKey::Heartbeat => serve!(m::HeartbeatRequest, groups::heartbeat),
        ApiKey::LeaveGroup => serve!(m::LeaveGroupRequest, groups::leave_group),
        ApiKey::OffsetCommit => serve!(m::OffsetCommitRequest, groups::offset_commit),
        ApiKey::OffsetFetch => serve!(m::OffsetFetchRequest, groups::offset_fetch),
        ApiKey::ListGroups => serve!(m::ListGroupsRequest, groups::list_groups),
        ApiKey::DescribeGroups => serve!(m::DescribeGroupsRequest, groups::describe_groups),
        _ => Err(undecodable("an API not served".into())),
    };
    // A body with bytes left over is still answered; only one that does not decode closes
    // the connection.
    answer
}

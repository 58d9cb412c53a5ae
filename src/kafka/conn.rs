//! One Kafka connection: read size-prefixed frames, decode their headers, answer them in order.
//!
//! A frame larger than `QUEEN_KAFKA_MAX_FRAME_BYTES` (or smaller than a header), a frame
//! that arrives too slowly, bytes that do not decode and a client that does not read its
//! answers close this connection only; the others are served on. A frame's bytes count
//! against the front door's budget (`Kafka::frame_budget`) until its answer is written, so
//! memory stays bounded however many clients send at once. Nothing here panics on input.
//!
//! Produces are pipelined: a producer sends all its batches over one connection, several
//! requests ahead of its answers, so a produce is handed to its partition actors (which keep
//! the order of what they are handed) and the next request is read while it commits, up to
//! `PRODUCES_IN_FLIGHT` (32). Every other request waits until the answers owed before it are
//! written, so it is served as if requests came one at a time.
//!
//! Each connection carries its SASL session (`kafka::sasl`): with JWT auth on, only
//! ApiVersions and the SASL APIs are served before authentication (anything else closes the
//! connection, as Kafka does), a session ends at its token's expiry unless re-authenticated,
//! and each API is answered with its authorization error when the caller's roles lack what
//! `kafka::access` says it requires.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::future::LocalBoxFuture;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, SemaphorePermit};

use crate::auth::roles::Capability;
use crate::kafka::sasl::{Refusal, Session};
use crate::kafka::{access, fetch, groups, metadata, produce, versions, Kafka};

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
    #[error(transparent)]
    Sasl(#[from] Refusal),
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
    kafka.metrics.connections.inc();
    let served = serve_frames(&mut stream, kafka).await;
    kafka.metrics.connections.dec();
    match served {
        Err(Closed::Eof) | Ok(()) => tracing::debug!(%peer, "Kafka connection closed"),
        Err(e @ (Closed::Io(_) | Closed::Idle)) => {
            tracing::debug!(%peer, reason = %e, "Kafka connection closed")
        }
        Err(e) => tracing::warn!(%peer, reason = %e, "Kafka connection closed by the broker"),
    }
}

/// Produces a connection may have in flight at once. A Kafka producer sends all its batches
/// for a broker over one connection, several requests ahead of the answers; their commits
/// overlap here, and the answers leave in request order.
const PRODUCES_IN_FLIGHT: usize = 32;

/// An answer still being made (a produce waiting for its commits), with the frame's share of
/// the front door's budget, held until the answer is made.
type Owed<'a> = (
    LocalBoxFuture<'a, Result<Answer, Closed>>,
    SemaphorePermit<'a>,
);

/// Reads requests and writes their answers, in order. A Produce is handed to the partition
/// actors before the next request is read, and its answer is owed until its commits end;
/// any other request first waits until every answer owed before it is written, so it sees
/// what the connection produced and is answered as if the connection were served one request
/// at a time.
async fn serve_frames(stream: &mut TcpStream, kafka: &Kafka) -> Result<(), Closed> {
    let (mut reader, mut writer) = stream.split();
    let (owed_tx, mut owed_rx) = mpsc::channel::<Owed<'_>>(PRODUCES_IN_FLIGHT);
    let (written_tx, written_rx) = watch::channel(0u64);
    let read = read_frames(&mut reader, kafka, owed_tx, written_rx);
    let write_answers = async {
        let mut written = 0u64;
        while let Some((owed, permit)) = owed_rx.recv().await {
            let (answer, then_close) = owed.await?;
            if let Some(answer) = answer {
                write(&mut writer, &answer).await?;
            }
            drop(permit);
            // A refused SASL exchange: the client reads why, then the connection ends.
            if let Some(refusal) = then_close {
                return Err(Closed::Sasl(refusal));
            }
            written += 1;
            written_tx.send_replace(written);
        }
        Ok(())
    };
    tokio::pin!(read, write_answers);
    tokio::select! {
        // The client stopped sending or broke a rule: what it is owed is still written (it
        // may have only shut its sending side), unless the connection is gone.
        read_end = &mut read => {
            let written = write_answers.await;
            read_end.and(written)
        }
        written = &mut write_answers => written,
    }
}

/// Reads frames until the connection ends; each answer goes to the writer in order.
async fn read_frames<'a>(
    stream: &mut ReadHalf<'_>,
    kafka: &'a Kafka,
    owed: mpsc::Sender<Owed<'a>>,
    mut written: watch::Receiver<u64>,
) -> Result<(), Closed> {
    let max = kafka.settings.max_frame_bytes;
    let mut session = Session::new(kafka.verifier.is_some());
    let mut sent = 0u64;
    loop {
        let mut size = [0u8; 4];
        // A SASL session past its token's expiry is not closed while idle: as a Kafka broker
        // does (KIP-368), the connection closes at its next request that is not a
        // re-authentication (`Session::admit`), so a client re-authenticating late is not cut.
        match tokio::time::timeout(IDLE, stream.read_exact(&mut size)).await {
            Err(_) => return Err(Closed::Idle),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(Closed::Eof),
            Ok(r) => r?,
        };
        let len = i32::from_be_bytes(size) as i64;
        // A raw SASL token (after a v0 handshake) has no header and may be short.
        let least = if session.expects_raw_token() { 1 } else { 8 };
        if len < least || len as u64 > max as u64 {
            return Err(Closed::FrameSize(len, max));
        }
        let len = len as usize;
        // The budget is counted in KiB; a frame takes its share before its bytes are read.
        let kib = u32::try_from(len.div_ceil(1024)).unwrap_or(u32::MAX);
        let Ok(permit) = kafka.frame_budget.acquire_many(kib).await else {
            return Ok(());
        };
        let mut frame = BytesMut::zeroed(len);
        match tokio::time::timeout(FRAME_TIMEOUT, stream.read_exact(&mut frame)).await {
            Err(_) => return Err(Closed::SlowFrame),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(Closed::Eof),
            Ok(r) => r?,
        };
        let raw_token = session.expects_raw_token();
        let produce =
            !raw_token && i16::from_be_bytes([frame[0], frame[1]]) == ApiKey::Produce as i16;
        if !produce {
            // Served one at a time: every earlier answer is written first.
            if written.wait_for(|w| *w == sent).await.is_err() {
                return Ok(());
            }
        }
        let step: LocalBoxFuture<'a, Result<Answer, Closed>> = if raw_token {
            session.raw_token(kafka.verifier.as_deref(), &frame).await?;
            let answer: Answer = (
                Some(BytesMut::from(&crate::kafka::sasl::raw_success()[..])),
                None,
            );
            Box::pin(std::future::ready(Ok(answer)))
        } else {
            let began = std::time::Instant::now();
            let api = ApiKey::try_from(i16::from_be_bytes([frame[0], frame[1]]))
                .map_or_else(|_| "unknown".to_string(), |key| format!("{key:?}"));
            let step = match answer(frame.freeze(), kafka, &mut session).await {
                Ok(step) => step,
                // Nothing more is read; the answers owed before this one are still written.
                Err(e) => {
                    kafka.metrics.request(&api, false, began.elapsed());
                    return Err(e);
                }
            };
            Box::pin(async move {
                let answered = match step {
                    Step::Ready(answer) => Ok(answer),
                    Step::Owed(owed) => owed.await,
                };
                kafka
                    .metrics
                    .request(&api, answered.is_ok(), began.elapsed());
                answered
            })
        };
        if owed.send((step, permit)).await.is_err() {
            return Ok(());
        }
        sent += 1;
    }
}

async fn write(stream: &mut WriteHalf<'_>, bytes: &[u8]) -> Result<(), Closed> {
    match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(bytes)).await {
        Err(_) => Err(Closed::SlowReader),
        Ok(r) => Ok(r?),
    }
}

/// An answer (`None`: the request wants none) and, after a refused SASL exchange, why the
/// connection closes once the answer is written.
type Answer = (Option<BytesMut>, Option<Refusal>);

/// A request answered at once, or a produce whose answer waits for its commits.
enum Step<'a> {
    Ready(Answer),
    Owed(LocalBoxFuture<'a, Result<Answer, Closed>>),
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

/// Answers one frame; a produce's answer is owed until its commits end.
async fn answer<'a>(
    mut frame: Bytes,
    kafka: &'a Kafka,
    session: &mut Session,
) -> Result<Step<'a>, Closed> {
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
            .map(|a| Step::Ready((Some(a), None)));
        }
        // The body is read only to check it decodes (the client's name is not used).
        let header_version = key.request_header_version(version);
        RequestHeader::decode(&mut frame, header_version)
            .map_err(|e| undecodable(format!("header: {e:#}")))?;
        decode::<kafka_protocol::messages::ApiVersionsRequest>(&head, &mut frame)?;
        return frame_answer(&head, 0, &versions::api_versions(0))
            .map(|a| Step::Ready((Some(a), None)));
    }
    session.admit(key)?;
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
        return Ok(Step::Ready((Some(out), None)));
    }
    let header = RequestHeader::decode(&mut frame, key.request_header_version(version))
        .map_err(|e| undecodable(format!("header: {e:#}")))?;
    let head = Head {
        key,
        version,
        correlation_id: header.correlation_id,
    };
    let mut body = frame;
    let response_header_version = key.response_header_version(version);
    let allowed = session.allows(access::required(key));
    if !allowed {
        tracing::debug!(
            ?key,
            "Kafka request refused: the token's roles do not allow it"
        );
    }
    // Served when the caller's roles allow it, else answered with the API's refusal.
    macro_rules! serve {
        ($req:ty, $handler:expr, $refuse:expr) => {{
            let request: $req = decode(&head, &mut body)?;
            let response = if allowed {
                $handler(kafka, request, version).await
            } else {
                $refuse(request, version)
            };
            frame_answer(&head, response_header_version, &response).map(|a| (Some(a), None))
        }};
    }
    use kafka_protocol::messages as m;
    let answer = match key {
        ApiKey::SaslHandshake => {
            let request: m::SaslHandshakeRequest = decode(&head, &mut body)?;
            let (response, outcome) = session.handshake(&request, version);
            frame_answer(&head, response_header_version, &response)
                .map(|a| (Some(a), outcome.err()))
        }
        ApiKey::SaslAuthenticate => {
            let request: m::SaslAuthenticateRequest = decode(&head, &mut body)?;
            let (response, outcome) = session
                .authenticate(kafka.verifier.as_deref(), &request)
                .await;
            frame_answer(&head, response_header_version, &response)
                .map(|a| (Some(a), outcome.err()))
        }
        ApiKey::Metadata => {
            let request: m::MetadataRequest = decode(&head, &mut body)?;
            // Creating a topic on first use is what a push does for a queue (or a configure).
            let may_create =
                session.allows(Capability::Produce) || session.allows(Capability::Configure);
            let response = metadata::metadata_creating(kafka, request, version, may_create).await;
            frame_answer(&head, response_header_version, &response).map(|a| (Some(a), None))
        }
        ApiKey::CreateTopics => serve!(
            m::CreateTopicsRequest,
            metadata::create_topics,
            access::create_topics
        ),
        ApiKey::DeleteTopics => serve!(
            m::DeleteTopicsRequest,
            metadata::delete_topics,
            access::delete_topics
        ),
        ApiKey::Produce => {
            let request: m::ProduceRequest = decode(&head, &mut body)?;
            let acks = request.acks;
            // Allowed, the records are with their partition actors once `hand_over` returns;
            // the answer waits for their commits while the connection reads on.
            let response: LocalBoxFuture<'a, m::ProduceResponse> = if allowed {
                Box::pin(
                    produce::hand_over(kafka, request, session.sub())
                        .await
                        .answer(),
                )
            } else {
                Box::pin(std::future::ready(access::produce(request, version)))
            };
            return Ok(Step::Owed(Box::pin(async move {
                let response = response.await;
                if acks == 0 {
                    return Ok((None, None));
                }
                frame_answer(&head, response_header_version, &response).map(|a| (Some(a), None))
            })));
        }
        ApiKey::InitProducerId => serve!(
            m::InitProducerIdRequest,
            produce::init_producer_id,
            access::init_producer_id
        ),
        ApiKey::Fetch => serve!(m::FetchRequest, fetch::fetch, access::fetch),
        ApiKey::ListOffsets => serve!(
            m::ListOffsetsRequest,
            fetch::list_offsets,
            access::list_offsets
        ),
        ApiKey::FindCoordinator => serve!(
            m::FindCoordinatorRequest,
            groups::find_coordinator,
            access::find_coordinator
        ),
        ApiKey::JoinGroup => serve!(m::JoinGroupRequest, groups::join_group, access::join_group),
        ApiKey::SyncGroup => serve!(m::SyncGroupRequest, groups::sync_group, access::sync_group),
        ApiKey::Heartbeat => serve!(m::HeartbeatRequest, groups::heartbeat, access::heartbeat),
        ApiKey::LeaveGroup => serve!(
            m::LeaveGroupRequest,
            groups::leave_group,
            access::leave_group
        ),
        ApiKey::OffsetCommit => serve!(
            m::OffsetCommitRequest,
            groups::offset_commit,
            access::offset_commit
        ),
        ApiKey::OffsetFetch => serve!(
            m::OffsetFetchRequest,
            groups::offset_fetch,
            access::offset_fetch
        ),
        ApiKey::ListGroups => serve!(
            m::ListGroupsRequest,
            groups::list_groups,
            access::list_groups
        ),
        ApiKey::DescribeGroups => serve!(
            m::DescribeGroupsRequest,
            groups::describe_groups,
            access::describe_groups
        ),
        _ => Err(undecodable("an API not served".into())),
    };
    // A body with bytes left over is still answered; only one that does not decode closes
    // the connection.
    answer.map(Step::Ready)
}

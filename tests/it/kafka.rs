//! The Kafka listener at the wire (docs/kafka.md), with requests encoded by the
//! `kafka-protocol` crate against a real broker and PostgreSQL: ApiVersions in both request
//! styles, an API not served answered with its error, hostile frames closing only their own
//! connection, produce → fetch → HTTP pop with keys and headers, idempotent retries stored
//! once, a fetch long poll woken by an HTTP push, and SASL (PLAIN, OAUTHBEARER; both exchange
//! styles) with the HTTP tokens and roles when JWT auth is on. Real clients (librdkafka, kafka-python,
//! kcat) run in tests/compat/kafka.sh.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, EndTxnRequest, EndTxnResponse,
    FetchRequest, FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, InitProducerIdRequest, InitProducerIdResponse,
    JoinGroupRequest, JoinGroupResponse, ListGroupsRequest, ListGroupsResponse, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, ProduceRequest, ProduceResponse,
    ProducerId, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::auth;
use crate::support::consuming::{messages, pop_partition};
use crate::support::{eventually, fresh_db, spawn_app_with, test_settings, TestApp, TestDb};
use queen_broker::state::{inflight_bytes, ITEM_MEMORY_BYTES};

async fn kafka_app(db: &TestDb, extra: &[(&str, &str)]) -> (TestApp, u16) {
    let mut vars = vec![("QUEEN_KAFKA_PORT", "0")];
    vars.extend_from_slice(extra);
    let app = spawn_app_with(test_settings(db, &vars)).await;
    let port = app.broker.kafka_port.expect("the Kafka listener is on");
    (app, port)
}

/// A raw Kafka connection.
struct Conn {
    stream: TcpStream,
    correlation: i32,
}

impl Conn {
    async fn open(port: u16) -> Self {
        Self {
            stream: TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect"),
            correlation: 0,
        }
    }

    async fn send_frame(&mut self, frame: &[u8]) {
        let mut out = (frame.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(frame);
        self.stream.write_all(&out).await.expect("write");
    }

    /// The next answer's bytes (`None`: the broker closed the connection).
    async fn read_frame(&mut self) -> Option<Bytes> {
        let mut size = [0u8; 4];
        let read = tokio::time::timeout(Duration::from_secs(20), self.stream.read_exact(&mut size))
            .await
            .expect("an answer or a close within 20 s");
        read.ok()?;
        let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
        self.stream.read_exact(&mut body).await.ok()?;
        Some(Bytes::from(body))
    }

    /// Sends a request and decodes its answer.
    async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        request: &Req,
    ) -> Resp {
        let correlation = self.send(key, version, request).await;
        self.receive(key, version, correlation).await
    }

    /// Sends a request without reading its answer; returns its correlation id.
    async fn send<Req: Encodable>(&mut self, key: ApiKey, version: i16, request: &Req) -> i32 {
        self.correlation += 1;
        let mut header = RequestHeader::default();
        header.request_api_key = key as i16;
        header.request_api_version = version;
        header.correlation_id = self.correlation;
        header.client_id = Some(StrBytes::from_static_str("it"));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, key.request_header_version(version))
            .expect("header encodes");
        request.encode(&mut buf, version).expect("request encodes");
        self.send_frame(&buf).await;
        self.correlation
    }

    /// Reads the next answer, which must be the one to request `correlation`, and decodes it.
    async fn receive<Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        correlation: i32,
    ) -> Resp {
        let mut answer = self.read_frame().await.expect("an answer");
        let header = ResponseHeader::decode(&mut answer, key.response_header_version(version))
            .expect("response header");
        assert_eq!(
            header.correlation_id, correlation,
            "answers come in request order"
        );
        Resp::decode(&mut answer, version).expect("response decodes")
    }

    /// Whether the broker closed this connection (reads EOF within 10 s).
    async fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut byte)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

/// A request's bytes (header and body), without its size.
fn raw_request<Req: Encodable>(key: ApiKey, version: i16, request: &Req) -> BytesMut {
    let mut header = RequestHeader::default();
    header.request_api_key = key as i16;
    header.request_api_version = version;
    header.correlation_id = 1;
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, key.request_header_version(version))
        .expect("header encodes");
    request.encode(&mut buf, version).expect("request encodes");
    buf
}

fn versions_of(response: &ApiVersionsResponse, key: ApiKey) -> Option<(i16, i16)> {
    response
        .api_keys
        .iter()
        .find(|k| k.api_key == key as i16)
        .map(|k| (k.min_version, k.max_version))
}

#[actix_web::test]
async fn api_versions_answers_the_classic_and_the_flexible_request_and_refuses_unknown_versions() {
    let db = fresh_db().await;
    let (_app, port) = kafka_app(&db, &[]).await;
    let mut conn = Conn::open(port).await;

    // v0: the request style of old clients (Debian's kcat, librdkafka 2.0.2 starts here).
    let v0: ApiVersionsResponse = conn
        .call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())
        .await;
    assert_eq!(v0.error_code, 0);
    assert_eq!(versions_of(&v0, ApiKey::ApiVersions), Some((0, 3)));
    assert!(versions_of(&v0, ApiKey::Produce).is_some());
    assert!(versions_of(&v0, ApiKey::Fetch).is_some());

    // v3: flexible, with the client's name.
    let mut request = ApiVersionsRequest::default();
    request.client_software_name = StrBytes::from_static_str("it");
    request.client_software_version = StrBytes::from_static_str("1.0");
    let v3: ApiVersionsResponse = conn.call(ApiKey::ApiVersions, 3, &request).await;
    assert_eq!(v3.error_code, 0);
    assert_eq!(v3.api_keys, v0.api_keys);

    // A version above ours: UNSUPPORTED_VERSION (35) and the list, in the v0 format.
    let mut header = RequestHeader::default();
    header.request_api_key = ApiKey::ApiVersions as i16;
    header.request_api_version = 9;
    header.correlation_id = 77;
    let mut buf = BytesMut::new();
    header.encode(&mut buf, 2).expect("header encodes");
    buf.extend_from_slice(&[0, 0, 0]); // some body the broker need not understand
    conn.send_frame(&buf).await;
    let mut answer = conn.read_frame().await.expect("an answer");
    let header = ResponseHeader::decode(&mut answer, 0).expect("v0 header");
    assert_eq!(header.correlation_id, 77);
    let refused = ApiVersionsResponse::decode(&mut answer, 0).expect("v0 body");
    assert_eq!(refused.error_code, 35);
    assert_eq!(refused.api_keys, v0.api_keys);

    // The connection is still served.
    let again: ApiVersionsResponse = conn
        .call(ApiKey::ApiVersions, 1, &ApiVersionsRequest::default())
        .await;
    assert_eq!(again.error_code, 0);
}

#[actix_web::test]
async fn an_api_not_served_is_answered_with_its_error_and_the_connection_stays() {
    let db = fresh_db().await;
    let (_app, port) = kafka_app(&db, &[]).await;
    let mut conn = Conn::open(port).await;

    let txn: EndTxnResponse = conn
        .call(ApiKey::EndTxn, 1, &EndTxnRequest::default())
        .await;
    assert_eq!(txn.error_code, 35, "UNSUPPORTED_VERSION");

    let groups: ListGroupsResponse = conn
        .call(ApiKey::ListGroups, 2, &ListGroupsRequest::default())
        .await;
    assert_eq!((groups.error_code, groups.groups.len()), (0, 0));

    let metadata: MetadataResponse = conn
        .call(ApiKey::Metadata, 9, &MetadataRequest::default())
        .await;
    assert_eq!(metadata.brokers.len(), 1);
    assert_eq!(metadata.brokers[0].port, i32::from(port));
}

#[actix_web::test]
async fn oversized_garbage_and_truncated_frames_close_only_their_own_connection() {
    let db = fresh_db().await;
    let (app, port) = kafka_app(&db, &[("QUEEN_KAFKA_MAX_FRAME_BYTES", "4096")]).await;
    let mut bystander = Conn::open(port).await;
    let _: ApiVersionsResponse = bystander
        .call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())
        .await;

    // Declares 1 MiB, over the 4 KiB limit: closed before a byte of it is read.
    let mut oversized = Conn::open(port).await;
    oversized
        .stream
        .write_all(&(1i32 << 20).to_be_bytes())
        .await
        .expect("write");
    assert!(
        oversized.closed().await,
        "an oversized frame closes its connection"
    );

    // A negative size.
    let mut negative = Conn::open(port).await;
    negative
        .stream
        .write_all(&(-5i32).to_be_bytes())
        .await
        .expect("write");
    assert!(
        negative.closed().await,
        "a negative size closes its connection"
    );

    // An unknown API key with garbage after it.
    let mut garbage = Conn::open(port).await;
    garbage
        .send_frame(&[0x7f, 0x7f, 0, 1, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef])
        .await;
    assert!(garbage.closed().await, "garbage closes its connection");

    // A Metadata request whose body stops in the middle of a topic name.
    let mut header = RequestHeader::default();
    header.request_api_key = ApiKey::Metadata as i16;
    header.request_api_version = 4;
    header.correlation_id = 1;
    let mut buf = BytesMut::new();
    header.encode(&mut buf, 1).expect("header");
    buf.extend_from_slice(&[0, 0, 0, 1, 0, 50, b'a']);
    let mut undecodable = Conn::open(port).await;
    undecodable.send_frame(&buf).await;
    assert!(
        undecodable.closed().await,
        "a body that does not decode closes its connection"
    );

    // Array counts far past the frame's bytes (2^31 - 1 topics in a classic array, 2^32 - 2 in
    // a compact one): refused without reserving room for them.
    for (version, count) in [
        (4i16, vec![0x7f, 0xff, 0xff, 0xff]),
        (9, vec![0xff, 0xff, 0xff, 0xff, 0x0f]),
    ] {
        let mut header = RequestHeader::default();
        header.request_api_key = ApiKey::Metadata as i16;
        header.request_api_version = version;
        header.correlation_id = 2;
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, ApiKey::Metadata.request_header_version(version))
            .expect("header");
        buf.extend_from_slice(&count);
        buf.extend_from_slice(&[0, 1, b'a']);
        let mut huge = Conn::open(port).await;
        huge.send_frame(&buf).await;
        assert!(
            huge.closed().await,
            "an array count past the frame closes its connection (v{version})"
        );
    }

    // A frame that never finishes: the client goes away mid-frame.
    let mut truncated = Conn::open(port).await;
    truncated
        .stream
        .write_all(&100i32.to_be_bytes())
        .await
        .expect("write");
    truncated
        .stream
        .write_all(&[0, 18, 0, 0])
        .await
        .expect("write");
    drop(truncated);

    // Corrupt records in a well-formed Produce: an error for that partition, not a close.
    let produce = produce_request("hostile", 0, Bytes::from_static(b"not a record batch"), -1);
    let answer: ProduceResponse = bystander.call(ApiKey::Produce, 7, &produce).await;
    assert_eq!(
        answer.responses[0].partition_responses[0].error_code, 2,
        "CORRUPT_MESSAGE"
    );

    // Everyone else is still served: the bystander, a new connection and HTTP.
    let v: ApiVersionsResponse = bystander
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(v.error_code, 0);
    let mut fresh = Conn::open(port).await;
    let v: ApiVersionsResponse = fresh
        .call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())
        .await;
    assert_eq!(v.error_code, 0);
    assert_eq!(app.get("/health").await.status, 200);
}

fn record(
    offset: i64,
    key: Option<&'static [u8]>,
    value: &'static [u8],
    header: Option<(&'static str, &'static [u8])>,
) -> Record {
    let mut headers = IndexMap::new();
    if let Some((k, v)) = header {
        headers.insert(StrBytes::from_static_str(k), Some(Bytes::from_static(v)));
    }
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: -1,
        timestamp: 1_700_000_000_000 + offset,
        key: key.map(Bytes::from_static),
        value: Some(Bytes::from_static(value)),
        headers,
    }
}

fn batch(records: &[Record], compression: Compression) -> Bytes {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .expect("batch encodes");
    buf.freeze()
}

fn produce_request(
    topic: &'static str,
    partition: i32,
    records: Bytes,
    acks: i16,
) -> ProduceRequest {
    let mut p = PartitionProduceData::default();
    p.index = partition;
    p.records = Some(records);
    let mut t = TopicProduceData::default();
    t.name = TopicName(StrBytes::from_static_str(topic));
    t.partition_data = vec![p];
    let mut request = ProduceRequest::default();
    request.acks = acks;
    request.timeout_ms = 5000;
    request.topic_data = vec![t];
    request
}

fn fetch_request(
    topic: &'static str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
) -> FetchRequest {
    let mut p = FetchPartition::default();
    p.partition = partition;
    p.fetch_offset = offset;
    p.partition_max_bytes = 1 << 20;
    p.current_leader_epoch = -1;
    let mut t = FetchTopic::default();
    t.topic = TopicName(StrBytes::from_static_str(topic));
    t.partitions = vec![p];
    let mut request = FetchRequest::default();
    request.replica_id = BrokerId(-1);
    request.max_wait_ms = max_wait_ms;
    request.min_bytes = 1;
    request.max_bytes = 1 << 20;
    request.topics = vec![t];
    request
}

fn fetched(response: &FetchResponse) -> Vec<Record> {
    let mut bytes = response.responses[0].partitions[0]
        .records
        .clone()
        .unwrap_or_default();
    RecordBatchDecoder::decode_all(&mut bytes)
        .expect("fetched batches decode")
        .into_iter()
        .flat_map(|set| set.records)
        .collect()
}

#[actix_web::test]
async fn produced_records_are_fetched_with_keys_and_headers_and_popped_over_http() {
    let db = fresh_db().await;
    let (app, port) = kafka_app(&db, &[]).await;
    let mut conn = Conn::open(port).await;

    let sent = vec![
        record(0, None, br#"{"n":0}"#, None),
        record(1, Some(b"k1"), b"plain text", Some(("h", b"v1"))),
        record(2, Some(b"k2"), br#"{"n":2}"#, None),
    ];
    for (compression, first) in [(Compression::Gzip, 0), (Compression::Zstd, 3)] {
        let answer: ProduceResponse = conn
            .call(
                ApiKey::Produce,
                9,
                &produce_request("orders", 0, batch(&sent, compression), -1),
            )
            .await;
        let p = &answer.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (0, first), "{compression:?}");
    }

    let answer: FetchResponse = conn
        .call(ApiKey::Fetch, 12, &fetch_request("orders", 0, 0, 0))
        .await;
    let partition = &answer.responses[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    assert_eq!(partition.high_watermark, 6);
    let got = fetched(&answer);
    assert_eq!(
        got.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4, 5]
    );
    for (i, r) in got.iter().enumerate() {
        let want = &sent[i % 3];
        assert_eq!(r.key, want.key, "record {i}");
        assert_eq!(r.value, want.value, "record {i}");
        assert_eq!(r.headers, want.headers, "record {i}");
        if want.key.is_some() {
            assert_eq!(
                r.timestamp, want.timestamp,
                "an envelope keeps the timestamp"
            );
        }
    }

    // The listener's metric families count what happened (docs/kafka.md, "Metrics").
    let (status, text) = app.get_text("/metrics/prometheus").await;
    assert_eq!(status, 200);
    for line in [
        "queen_kafka_records_total{direction=\"produced\"} 6",
        "queen_kafka_records_total{direction=\"fetched\"} 6",
        "queen_kafka_requests_total{api=\"Produce\",result=\"ok\"} 2",
        "queen_kafka_requests_total{api=\"Fetch\",result=\"ok\"} 1",
        "queen_kafka_request_duration_seconds_count{api=\"Produce\"} 2",
        "queen_kafka_connections 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} in /metrics/prometheus:\n{}",
            text.lines()
                .filter(|l| l.contains("kafka"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    // The same records over HTTP: the plain JSON value as itself, the others as envelopes.
    let popped = messages(&pop_partition(&app, "orders", "0", "batch=3&wait=false").await);
    assert_eq!(popped[0]["data"], json!({"n": 0}));
    assert_eq!(
        popped[1]["data"],
        json!({"kafka": {"timestamp": 1_700_000_000_001i64, "key": "k1", "value": "plain text",
                         "headers": [["h", "v1"]]}})
    );
    assert_eq!(popped[2]["data"]["kafka"]["json"], json!({"n": 2}));

    // ListOffsets: earliest, latest, by time.
    let mut p = ListOffsetsPartition::default();
    p.partition_index = 0;
    p.current_leader_epoch = -1;
    let mut t = ListOffsetsTopic::default();
    t.name = TopicName(StrBytes::from_static_str("orders"));
    let mut request = ListOffsetsRequest::default();
    request.replica_id = BrokerId(-1);
    for (ts, want) in [(-2, 0), (-1, 6), (4_000_000_000_000, -1), (0, 0)] {
        p.timestamp = ts;
        t.partitions = vec![p.clone()];
        request.topics = vec![t.clone()];
        let answer: ListOffsetsResponse = conn.call(ApiKey::ListOffsets, 5, &request).await;
        let r = &answer.topics[0].partitions[0];
        assert_eq!((r.error_code, r.offset), (0, want), "timestamp {ts}");
    }

    // A partition past the topic's count, and an offset past the end.
    let answer: FetchResponse = conn
        .call(ApiKey::Fetch, 12, &fetch_request("orders", 5, 0, 0))
        .await;
    assert_eq!(answer.responses[0].partitions[0].error_code, 3);
    let answer: FetchResponse = conn
        .call(ApiKey::Fetch, 12, &fetch_request("orders", 0, 99, 0))
        .await;
    assert_eq!(answer.responses[0].partitions[0].error_code, 1);
}

/// A producer sends many requests ahead of its answers over one connection (librdkafka does):
/// they commit side by side, yet are stored and answered in request order, and a request of
/// another API after them sees everything they produced.
#[actix_web::test]
async fn pipelined_produces_are_stored_and_answered_in_request_order() {
    let db = fresh_db().await;
    let (app, port) = kafka_app(&db, &[]).await;
    let mut conn = Conn::open(port).await;
    create_topic(&mut conn, "piped", 2).await;
    const REQUESTS: usize = 40;
    const PER_REQUEST: usize = 5;
    // Commits wait behind this lock until the produces are all read, so their answers are
    // owed side by side (a commit gives up, and spools, only after 10 s).
    let mut blocker = db.conn().await;
    sqlx::query("BEGIN")
        .execute(&mut blocker)
        .await
        .expect("begin");
    sqlx::query("LOCK TABLE queen.segments IN SHARE MODE")
        .execute(&mut blocker)
        .await
        .expect("lock");
    let mut produces = Vec::new();
    for r in 0..REQUESTS {
        let records: Vec<Record> = (0..PER_REQUEST)
            .map(|i| {
                let mut record = record(i as i64, None, b"{}", None);
                record.value = Some(Bytes::from(format!(r#"{{"n":{}}}"#, r * PER_REQUEST + i)));
                record
            })
            .collect();
        // Every request writes partition 0; every other one partition 1 as well.
        let mut request = produce_request("piped", 0, batch(&records, Compression::None), -1);
        if r % 2 == 0 {
            let mut also = request.topic_data[0].partition_data[0].clone();
            also.index = 1;
            request.topic_data[0].partition_data.push(also);
        }
        produces.push(conn.send(ApiKey::Produce, 9, &request).await);
    }
    let mut p = ListOffsetsPartition::default();
    p.partition_index = 0;
    p.current_leader_epoch = -1;
    p.timestamp = -1;
    let mut t = ListOffsetsTopic::default();
    t.name = TopicName(StrBytes::from_static_str("piped"));
    t.partitions = vec![p];
    let mut latest = ListOffsetsRequest::default();
    latest.replica_id = BrokerId(-1);
    latest.topics = vec![t];
    let listed = conn.send(ApiKey::ListOffsets, 5, &latest).await;
    // Read one request at a time, at most one produce's items would be admitted at once.
    let many = 10 * PER_REQUEST * ITEM_MEMORY_BYTES;
    eventually(
        Duration::from_secs(5),
        "many produces in flight",
        || async { (inflight_bytes(&app.broker.state) >= many).then_some(()) },
    )
    .await;
    sqlx::query("COMMIT")
        .execute(&mut blocker)
        .await
        .expect("commit");

    let mut bases = Vec::new();
    for correlation in produces {
        let answer: ProduceResponse = conn.receive(ApiKey::Produce, 9, correlation).await;
        for p in &answer.responses[0].partition_responses {
            assert_eq!(
                p.error_code, 0,
                "request {correlation} partition {}",
                p.index
            );
        }
        bases.push(answer.responses[0].partition_responses[0].base_offset);
    }
    let want: Vec<i64> = (0..REQUESTS).map(|r| (r * PER_REQUEST) as i64).collect();
    assert_eq!(
        bases, want,
        "partition 0's base offsets follow the request order"
    );
    let answer: ListOffsetsResponse = conn.receive(ApiKey::ListOffsets, 5, listed).await;
    assert_eq!(
        answer.topics[0].partitions[0].offset,
        (REQUESTS * PER_REQUEST) as i64,
        "a ListOffsets sent after the produces sees all of them"
    );

    let payload_order = |stored: Vec<crate::support::Stored>| -> Vec<i64> {
        stored
            .iter()
            .map(|m| {
                let value: serde_json::Value =
                    serde_json::from_str(&m.payload).expect("a JSON payload");
                value["n"].as_i64().expect("n")
            })
            .collect()
    };
    let all: Vec<i64> = (0..(REQUESTS * PER_REQUEST) as i64).collect();
    assert_eq!(payload_order(db.stored("piped", "0").await), all);
    let even: Vec<i64> = (0..REQUESTS)
        .filter(|r| r % 2 == 0)
        .flat_map(|r| (r * PER_REQUEST..(r + 1) * PER_REQUEST).map(|n| n as i64))
        .collect();
    assert_eq!(payload_order(db.stored("piped", "1").await), even);
}

#[actix_web::test]
async fn an_idempotent_producer_retrying_a_batch_is_stored_once_and_answered_as_the_original() {
    let db = fresh_db().await;
    let (_app, port) = kafka_app(&db, &[]).await;
    let mut conn = Conn::open(port).await;
    let init: InitProducerIdResponse = conn
        .call(ApiKey::InitProducerId, 4, &{
            let mut r = InitProducerIdRequest::default();
            r.transactional_id = None;
            r.producer_id = ProducerId(-1);
            r.producer_epoch = -1;
            r.transaction_timeout_ms = 60_000;
            r
        })
        .await;
    assert_eq!(init.error_code, 0);
    assert!(init.producer_id.0 >= 1);

    let mut records = vec![
        record(0, None, br#"{"a":1}"#, None),
        record(1, None, br#"{"a":2}"#, None),
    ];
    for (i, r) in records.iter_mut().enumerate() {
        r.producer_id = init.producer_id.0;
        r.producer_epoch = init.producer_epoch;
        r.sequence = i as i32;
    }
    let other = record(0, None, br#"{"other":true}"#, None);
    let bytes = batch(&records, Compression::Lz4);
    let first: ProduceResponse = conn
        .call(
            ApiKey::Produce,
            8,
            &produce_request("idem", 0, bytes.clone(), -1),
        )
        .await;
    // Something else lands in between, so the retry's answer is not just "the end".
    let _: ProduceResponse = conn
        .call(
            ApiKey::Produce,
            8,
            &produce_request("idem", 0, batch(&[other], Compression::None), 1),
        )
        .await;
    let retry: ProduceResponse = conn
        .call(ApiKey::Produce, 8, &produce_request("idem", 0, bytes, -1))
        .await;
    let (a, b) = (
        &first.responses[0].partition_responses[0],
        &retry.responses[0].partition_responses[0],
    );
    assert_eq!((a.error_code, a.base_offset), (0, 0));
    assert_eq!(
        (b.error_code, b.base_offset),
        (0, 0),
        "the retry is answered as the original"
    );
    let stored = db.stored("idem", "0").await;
    assert_eq!(stored.len(), 3, "the retried batch is stored once");
    assert_eq!(
        stored
            .iter()
            .map(|s| s.transaction_id.starts_with("kafka:"))
            .collect::<Vec<_>>(),
        vec![true, true, false]
    );
}

#[actix_web::test]
async fn a_waiting_fetch_is_woken_by_an_http_push() {
    let db = fresh_db().await;
    let (app, port) = kafka_app(&db, &[]).await;
    let mut conn = Conn::open(port).await;
    // Creates the topic (one partition) so the fetch below names a known partition.
    let mut request = MetadataRequest::default();
    let mut topic = kafka_protocol::messages::metadata_request::MetadataRequestTopic::default();
    topic.name = Some(TopicName(StrBytes::from_static_str("wake")));
    request.topics = Some(vec![topic]);
    request.allow_auto_topic_creation = true;
    let md: MetadataResponse = conn.call(ApiKey::Metadata, 9, &request).await;
    assert_eq!(md.topics[0].error_code, 0);

    // Nothing there: an empty answer after max_wait_ms.
    let started = Instant::now();
    let empty: FetchResponse = conn
        .call(ApiKey::Fetch, 12, &fetch_request("wake", 0, 0, 300))
        .await;
    assert!(fetched(&empty).is_empty());
    assert!(started.elapsed() >= Duration::from_millis(290));

    let pusher = {
        let base = app.base.clone();
        actix_web::rt::spawn(async move {
            actix_web::rt::time::sleep(Duration::from_millis(300)).await;
            awc::Client::default()
                .post(format!("{base}/api/v1/push"))
                .send_json(&json!({"items": [{"queue": "wake", "partition": "0", "payload": {"hello": "kafka"}}]}))
                .await
                .expect("push sent")
                .status()
        })
    };
    let started = Instant::now();
    let woken: FetchResponse = conn
        .call(ApiKey::Fetch, 12, &fetch_request("wake", 0, 0, 20_000))
        .await;
    let waited = started.elapsed();
    assert_eq!(pusher.await.expect("pusher").as_u16(), 201);
    let got = fetched(&woken);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].value.as_deref(), Some(&br#"{"hello":"kafka"}"#[..]));
    assert!(
        waited < Duration::from_secs(10),
        "woken by the push, not by max_wait_ms ({waited:?})"
    );
}

#[actix_web::test]
async fn a_produce_in_maintenance_mode_is_spooled_acknowledged_and_stored_once_it_ends() {
    let db = fresh_db().await;
    let (app, port) = kafka_app(&db, &[]).await;
    let mut conn = Conn::open(port).await;
    let on = app
        .post("/api/v1/system/maintenance", &json!({ "enabled": true }))
        .await;
    assert_eq!(on.status, 200);

    let records = vec![
        record(0, Some(b"a"), br#"{"n":1}"#, None),
        record(1, None, br#"{"n":2}"#, None),
    ];
    let answer: ProduceResponse = conn
        .call(
            ApiKey::Produce,
            9,
            &produce_request("spooled", 0, batch(&records, Compression::Snappy), -1),
        )
        .await;
    let p = &answer.responses[0].partition_responses[0];
    // Accepted (on disk, as HTTP's `buffered`), its offset not known yet.
    assert_eq!((p.error_code, p.base_offset), (0, -1));
    assert!(
        db.stored("spooled", "0").await.is_empty(),
        "nothing stored in maintenance"
    );

    let off = app
        .post("/api/v1/system/maintenance", &json!({ "enabled": false }))
        .await;
    assert_eq!(off.status, 200);
    app.drained().await;
    let stored = crate::support::eventually(Duration::from_secs(20), "the spool replayed", || {
        let db = &db;
        async move {
            let stored = db.stored("spooled", "0").await;
            (stored.len() == 2).then_some(stored)
        }
    })
    .await;
    assert_eq!(stored[1].payload, r#"{"n":2}"#);
    let answer: FetchResponse = conn
        .call(ApiKey::Fetch, 12, &fetch_request("spooled", 0, 0, 0))
        .await;
    let got = fetched(&answer);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].key.as_deref(), Some(&b"a"[..]));
}

/// CRC-32C (Castagnoli), as record batches carry it.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Produces a hand-altered batch to partition 0 of `bombs`, its checksum made right (so only
/// what was altered is wrong); the partition's error code.
async fn produce_forged(conn: &mut Conn, mut forged: BytesMut) -> i16 {
    let crc = crc32c(&forged[21..]);
    forged[17..21].copy_from_slice(&crc.to_be_bytes());
    let answer: ProduceResponse = conn
        .call(
            ApiKey::Produce,
            9,
            &produce_request("bombs", 0, forged.freeze(), -1),
        )
        .await;
    answer.responses[0].partition_responses[0].error_code
}

#[actix_web::test]
async fn declared_record_counts_and_compression_bombs_are_refused_without_the_memory() {
    let db = fresh_db().await;
    let (app, port) = kafka_app(&db, &[("QUEEN_MAX_BODY_BYTES", "1048576")]).await;
    let mut conn = Conn::open(port).await;

    // A batch that declares two billion records (its checksum recomputed, so only the count
    // is wrong): refused before the decoder reserves room for them.
    let mut forged = BytesMut::from(&batch(&[record(0, None, b"{}", None)], Compression::None)[..]);
    forged[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    assert_eq!(
        produce_forged(&mut conn, forged).await,
        10,
        "MESSAGE_TOO_LARGE"
    );

    // 64 MiB of one repeated record value, gzip'd to a few hundred KiB: past the 1 MiB budget.
    let big: &'static [u8] = Box::leak(vec![b'7'; 64 << 20].into_boxed_slice());
    let bomb = batch(&[record(0, None, big, None)], Compression::Gzip);
    assert!(
        bomb.len() < 1 << 20,
        "the bomb is small ({} bytes)",
        bomb.len()
    );
    let answer: ProduceResponse = conn
        .call(ApiKey::Produce, 9, &produce_request("bombs", 0, bomb, -1))
        .await;
    assert_eq!(
        answer.responses[0].partition_responses[0].error_code, 10,
        "MESSAGE_TOO_LARGE"
    );

    // A record that declares 2^31 - 1 headers (the batch's lengths and checksum made right,
    // so only the count is wrong): the codec (vendor/kafka-protocol) reserves no more room
    // than the bytes left could hold, the batch is refused, and the broker goes on. Request
    // arrays with such counts are in the hostile-frames test above.
    let plain = batch(&[record(0, None, b"{}", None)], Compression::None);
    assert_eq!(
        (plain[61], plain[plain.len() - 1]),
        (0x10, 0),
        "one 8-byte record whose last byte is its header count"
    );
    let mut forged = BytesMut::from(&plain[..plain.len() - 1]);
    forged.extend_from_slice(&[0xfe, 0xff, 0xff, 0xff, 0x0f]);
    forged[61] = 0x18;
    let length = i32::from_be_bytes(forged[8..12].try_into().expect("4 bytes")) + 4;
    forged[8..12].copy_from_slice(&length.to_be_bytes());
    assert_ne!(
        produce_forged(&mut conn, forged).await,
        0,
        "a record with a forged header count is refused"
    );

    // Still serving, and nothing was stored.
    let v: ApiVersionsResponse = conn
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(v.error_code, 0);
    assert!(db.stored("bombs", "0").await.is_empty());
    assert_eq!(app.get("/health").await.status, 200);
}

// SASL: the same tokens and roles as HTTP (docs/kafka.md, "Authentication").

async fn auth_kafka_app(db: &TestDb) -> (TestApp, u16) {
    kafka_app(
        db,
        &[
            ("JWT_ENABLED", "true"),
            ("JWT_SECRET", auth::SECRET),
            ("JWT_ISSUER", auth::ISSUER),
            ("JWT_AUDIENCE", auth::AUDIENCE),
        ],
    )
    .await
}

fn plain(token: &str) -> Bytes {
    Bytes::from(format!("\0kafka-user\0{token}"))
}

fn oauth_bearer(token: &str) -> Bytes {
    Bytes::from(format!("n,,\x01auth=Bearer {token}\x01\x01"))
}

impl Conn {
    /// SaslHandshake v1 with `mechanism`, then SaslAuthenticate v2 with `message`.
    async fn authenticate(
        &mut self,
        mechanism: &'static str,
        message: Bytes,
    ) -> SaslAuthenticateResponse {
        let mut handshake = SaslHandshakeRequest::default();
        handshake.mechanism = StrBytes::from_static_str(mechanism);
        let answer: SaslHandshakeResponse = self.call(ApiKey::SaslHandshake, 1, &handshake).await;
        assert_eq!(answer.error_code, 0, "{mechanism} is served");
        let mechanisms: Vec<&str> = answer.mechanisms.iter().map(|m| m.as_str()).collect();
        assert_eq!(mechanisms, ["PLAIN", "OAUTHBEARER"]);
        let mut request = SaslAuthenticateRequest::default();
        request.auth_bytes = message;
        self.call(ApiKey::SaslAuthenticate, 2, &request).await
    }

    /// A connection authenticated with `mechanism` and a token of `role`.
    async fn signed_in(port: u16, mechanism: &'static str, role: &str) -> Conn {
        let token = auth::hs256(&auth::claims("kafka-client", role));
        let message = match mechanism {
            "PLAIN" => plain(&token),
            _ => oauth_bearer(&token),
        };
        let mut conn = Conn::open(port).await;
        let answer = conn.authenticate(mechanism, message).await;
        assert_eq!(answer.error_code, 0, "{:?}", answer.error_message);
        conn
    }
}

fn metadata_of(topic: &'static str) -> MetadataRequest {
    let mut t = MetadataRequestTopic::default();
    t.name = Some(TopicName(StrBytes::from_static_str(topic)));
    let mut request = MetadataRequest::default();
    request.topics = Some(vec![t]);
    request.allow_auto_topic_creation = true;
    request
}

#[actix_web::test]
async fn with_auth_on_nothing_but_api_versions_and_sasl_is_served_before_authentication() {
    let db = fresh_db().await;
    let (_app, port) = auth_kafka_app(&db).await;

    let mut conn = Conn::open(port).await;
    let versions: ApiVersionsResponse = conn
        .call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())
        .await;
    assert_eq!(versions_of(&versions, ApiKey::SaslHandshake), Some((0, 1)));
    assert_eq!(
        versions_of(&versions, ApiKey::SaslAuthenticate),
        Some((0, 2))
    );
    conn.send_frame(&raw_request(ApiKey::Metadata, 9, &metadata_of("t")))
        .await;
    assert!(conn.closed().await, "Metadata before authentication closes");

    // A SaslAuthenticate without a handshake: ILLEGAL_SASL_STATE (34), then closed.
    let mut conn = Conn::open(port).await;
    let mut request = SaslAuthenticateRequest::default();
    request.auth_bytes = plain("x");
    let answer: SaslAuthenticateResponse = conn.call(ApiKey::SaslAuthenticate, 1, &request).await;
    assert_eq!(answer.error_code, 34);
    assert!(conn.closed().await);

    // A mechanism not served: UNSUPPORTED_SASL_MECHANISM (33) with the list, then closed.
    let mut conn = Conn::open(port).await;
    let mut handshake = SaslHandshakeRequest::default();
    handshake.mechanism = StrBytes::from_static_str("SCRAM-SHA-256");
    let answer: SaslHandshakeResponse = conn.call(ApiKey::SaslHandshake, 1, &handshake).await;
    assert_eq!(answer.error_code, 33);
    assert_eq!(answer.mechanisms.len(), 2);
    assert!(conn.closed().await);
}

#[actix_web::test]
async fn sasl_plain_and_oauthbearer_take_the_http_tokens_and_refuse_bad_ones() {
    let db = fresh_db().await;
    let (_app, port) = auth_kafka_app(&db).await;

    for mechanism in ["PLAIN", "OAUTHBEARER"] {
        let mut conn = Conn::open(port).await;
        let token = auth::hs256(&auth::claims("kafka-client", "read-write"));
        let message = if mechanism == "PLAIN" {
            plain(&token)
        } else {
            oauth_bearer(&token)
        };
        let answer = conn.authenticate(mechanism, message).await;
        assert_eq!(
            answer.error_code, 0,
            "{mechanism}: {:?}",
            answer.error_message
        );
        // KIP-368: the token's remaining lifetime (claims() expire in 60 s).
        assert!(
            (1..=60_000).contains(&answer.session_lifetime_ms),
            "{mechanism}: {}",
            answer.session_lifetime_ms
        );
        let produced: ProduceResponse = conn
            .call(
                ApiKey::Produce,
                9,
                &produce_request(
                    "sasl-rw",
                    0,
                    batch(&[record(0, None, br#"{"n":1}"#, None)], Compression::None),
                    -1,
                ),
            )
            .await;
        assert_eq!(
            produced.responses[0].partition_responses[0].error_code, 0,
            "{mechanism}"
        );
        let fetched_back: FetchResponse = conn
            .call(ApiKey::Fetch, 12, &fetch_request("sasl-rw", 0, 0, 0))
            .await;
        assert_eq!(
            fetched_back.responses[0].partitions[0].error_code, 0,
            "{mechanism}"
        );
        assert!(!fetched(&fetched_back).is_empty(), "{mechanism}");
    }

    let wrong_signature = auth::sign(
        jsonwebtoken::Algorithm::HS256,
        None,
        &auth::claims("kafka-client", "admin"),
        &jsonwebtoken::EncodingKey::from_secret(b"another-secret-of-at-least-32-bytes")
            .expect("an HMAC key"),
    );
    let mut expired = auth::claims("kafka-client", "admin");
    expired["exp"] = json!(auth::now() - 3600);
    expired["iat"] = json!(auth::now() - 7200);
    let expired = auth::hs256(&expired);
    let mut other_issuer = auth::claims("kafka-client", "admin");
    other_issuer["iss"] = json!("https://evil.test");
    let other_issuer = auth::hs256(&other_issuer);
    let good = auth::hs256(&auth::claims("kafka-client", "admin"));
    for (what, mechanism, message, text) in [
        (
            "wrong signature",
            "PLAIN",
            plain(&wrong_signature),
            "Invalid token signature",
        ),
        (
            "wrong signature",
            "OAUTHBEARER",
            oauth_bearer(&wrong_signature),
            "Invalid token signature",
        ),
        ("expired", "PLAIN", plain(&expired), "Token has expired"),
        (
            "expired",
            "OAUTHBEARER",
            oauth_bearer(&expired),
            "Token has expired",
        ),
        (
            "other issuer",
            "PLAIN",
            plain(&other_issuer),
            "Invalid token issuer",
        ),
        (
            "not a token",
            "PLAIN",
            plain("secret"),
            "Token decode error",
        ),
        (
            "authzid of another sub",
            "PLAIN",
            Bytes::from(format!("mallory\0u\0{good}")),
            "not the token's sub",
        ),
        (
            "malformed",
            "OAUTHBEARER",
            Bytes::from(format!("n,,auth=Bearer {good}")),
            "OAUTHBEARER",
        ),
    ] {
        let mut conn = Conn::open(port).await;
        let answer = conn.authenticate(mechanism, message).await;
        assert_eq!(
            answer.error_code, 58,
            "{what} ({mechanism}): SASL_AUTHENTICATION_FAILED"
        );
        let message = answer
            .error_message
            .map(|m| m.to_string())
            .unwrap_or_default();
        assert!(message.contains(text), "{what} ({mechanism}): {message}");
        assert!(
            conn.closed().await,
            "{what} ({mechanism}) closes the connection"
        );
    }
}

#[actix_web::test]
async fn the_v0_handshake_takes_the_token_as_a_raw_frame() {
    let db = fresh_db().await;
    let (_app, port) = auth_kafka_app(&db).await;
    let token = auth::hs256(&auth::claims("kafka-client", "read-write"));
    for (mechanism, message) in [
        ("PLAIN", plain(&token)),
        ("OAUTHBEARER", oauth_bearer(&token)),
    ] {
        let mut conn = Conn::open(port).await;
        let mut handshake = SaslHandshakeRequest::default();
        handshake.mechanism = StrBytes::from_static_str(mechanism);
        let answer: SaslHandshakeResponse = conn.call(ApiKey::SaslHandshake, 0, &handshake).await;
        assert_eq!(answer.error_code, 0);
        conn.send_frame(&message).await;
        let reply = conn.read_frame().await.expect("an answer to the raw token");
        assert!(
            reply.is_empty(),
            "{mechanism}: the server's last message is empty"
        );
        let metadata: MetadataResponse = conn.call(ApiKey::Metadata, 9, &metadata_of("raw")).await;
        assert_eq!(metadata.topics[0].error_code, 0, "{mechanism}");
    }
    // A bad raw token: no answer, the connection closes.
    let mut conn = Conn::open(port).await;
    let mut handshake = SaslHandshakeRequest::default();
    handshake.mechanism = StrBytes::from_static_str("PLAIN");
    let _: SaslHandshakeResponse = conn.call(ApiKey::SaslHandshake, 0, &handshake).await;
    conn.send_frame(&plain("not-a-token")).await;
    assert!(conn.closed().await);
}

#[actix_web::test]
async fn roles_decide_each_api_as_they_decide_the_http_routes() {
    let db = fresh_db().await;
    let (_app, port) = auth_kafka_app(&db).await;
    let one = || batch(&[record(0, None, br#"{"n":1}"#, None)], Compression::None);

    // write-only (may push): produce and an idempotent producer id; no fetch, no groups, no
    // topic administration.
    let mut writer = Conn::signed_in(port, "OAUTHBEARER", "write-only").await;
    let metadata: MetadataResponse = writer
        .call(ApiKey::Metadata, 9, &metadata_of("roles"))
        .await;
    assert_eq!(
        metadata.topics[0].error_code, 0,
        "a producer's Metadata creates the topic"
    );
    let produced: ProduceResponse = writer
        .call(ApiKey::Produce, 9, &produce_request("roles", 0, one(), -1))
        .await;
    assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);
    let id: InitProducerIdResponse = writer
        .call(ApiKey::InitProducerId, 4, &InitProducerIdRequest::default())
        .await;
    assert_eq!(id.error_code, 0);
    let fetch: FetchResponse = writer
        .call(ApiKey::Fetch, 12, &fetch_request("roles", 0, 0, 0))
        .await;
    assert_eq!(
        fetch.responses[0].partitions[0].error_code, 29,
        "TOPIC_AUTHORIZATION_FAILED"
    );
    let mut offsets = ListOffsetsRequest::default();
    let mut t = ListOffsetsTopic::default();
    t.name = TopicName(StrBytes::from_static_str("roles"));
    let mut p = ListOffsetsPartition::default();
    p.timestamp = -2;
    t.partitions = vec![p];
    offsets.topics = vec![t];
    let listed: ListOffsetsResponse = writer.call(ApiKey::ListOffsets, 7, &offsets).await;
    assert_eq!(listed.topics[0].partitions[0].error_code, 29);
    let mut join = JoinGroupRequest::default();
    join.group_id = GroupId(StrBytes::from_static_str("g"));
    join.session_timeout_ms = 10_000;
    join.rebalance_timeout_ms = 10_000;
    join.protocol_type = StrBytes::from_static_str("consumer");
    let joined: JoinGroupResponse = writer.call(ApiKey::JoinGroup, 7, &join).await;
    assert_eq!(joined.error_code, 30, "GROUP_AUTHORIZATION_FAILED");
    let mut create = CreateTopicsRequest::default();
    let mut topic = CreatableTopic::default();
    topic.name = TopicName(StrBytes::from_static_str("made-by-writer"));
    topic.num_partitions = 1;
    topic.replication_factor = 1;
    create.topics = vec![topic];
    create.timeout_ms = 5000;
    let created: CreateTopicsResponse = writer.call(ApiKey::CreateTopics, 7, &create).await;
    assert_eq!(created.topics[0].error_code, 29);

    // read-only: Metadata (without creating), the group views; no produce, no fetch.
    let mut reader = Conn::signed_in(port, "PLAIN", "read-only").await;
    let metadata: MetadataResponse = reader
        .call(ApiKey::Metadata, 9, &metadata_of("never-made"))
        .await;
    assert_eq!(
        metadata.topics[0].error_code, 3,
        "a reader's Metadata creates nothing"
    );
    let produced: ProduceResponse = reader
        .call(ApiKey::Produce, 9, &produce_request("roles", 0, one(), -1))
        .await;
    assert_eq!(produced.responses[0].partition_responses[0].error_code, 29);
    let id: InitProducerIdResponse = reader
        .call(ApiKey::InitProducerId, 4, &InitProducerIdRequest::default())
        .await;
    assert_eq!(id.error_code, 31, "CLUSTER_AUTHORIZATION_FAILED");
    let groups: ListGroupsResponse = reader
        .call(ApiKey::ListGroups, 4, &ListGroupsRequest::default())
        .await;
    assert_eq!(groups.error_code, 0);

    // read-write: consumes and creates topics, but deleting a queue is an operator's (admin).
    let mut rw = Conn::signed_in(port, "PLAIN", "read-write").await;
    let fetch: FetchResponse = rw
        .call(ApiKey::Fetch, 12, &fetch_request("roles", 0, 0, 0))
        .await;
    assert_eq!(fetch.responses[0].partitions[0].error_code, 0);
    assert_eq!(fetched(&fetch).len(), 1);
    let created: CreateTopicsResponse = rw.call(ApiKey::CreateTopics, 7, &create).await;
    assert_eq!(created.topics[0].error_code, 0);
    let mut delete = DeleteTopicsRequest::default();
    delete.topic_names = vec![TopicName(StrBytes::from_static_str("made-by-writer"))];
    delete.timeout_ms = 5000;
    let deleted: DeleteTopicsResponse = rw.call(ApiKey::DeleteTopics, 5, &delete).await;
    assert_eq!(deleted.responses[0].error_code, 29);
    let mut admin = Conn::signed_in(port, "OAUTHBEARER", "admin").await;
    let deleted: DeleteTopicsResponse = admin.call(ApiKey::DeleteTopics, 5, &delete).await;
    assert_eq!(deleted.responses[0].error_code, 0);
}

#[actix_web::test]
async fn a_session_ends_at_the_token_expiry_unless_the_client_re_authenticates() {
    let db = fresh_db().await;
    let (_app, port) = auth_kafka_app(&db).await;
    let short = |secs: i64| {
        let mut claims = auth::claims("kafka-client", "read-write");
        claims["exp"] = json!(auth::now() + secs);
        auth::hs256(&claims)
    };

    // Not re-authenticated: the first request after the expiry closes the connection (KIP-368:
    // an idle expired session is left open; it can do nothing but re-authenticate).
    let mut conn = Conn::open(port).await;
    let answer = conn
        .authenticate("OAUTHBEARER", oauth_bearer(&short(2)))
        .await;
    assert!(
        (1..=2_000).contains(&answer.session_lifetime_ms),
        "{}",
        answer.session_lifetime_ms
    );
    let _: MetadataResponse = conn
        .call(ApiKey::Metadata, 9, &metadata_of("expiring"))
        .await;
    tokio::time::sleep(Duration::from_millis(
        answer.session_lifetime_ms as u64 + 200,
    ))
    .await;
    conn.send_frame(&raw_request(ApiKey::Metadata, 9, &metadata_of("expiring")))
        .await;
    assert!(conn.closed().await, "a request after the expiry closes it");

    // Re-authenticated (KIP-368: a new handshake and token on the same connection): served
    // past the first token's expiry.
    let mut conn = Conn::open(port).await;
    let first = conn.authenticate("PLAIN", plain(&short(2))).await;
    assert_eq!(first.error_code, 0);
    let again = conn.authenticate("PLAIN", plain(&short(60))).await;
    assert_eq!(again.error_code, 0);
    assert!(
        again.session_lifetime_ms > 50_000,
        "{}",
        again.session_lifetime_ms
    );
    let mut byte = [0u8; 1];
    let quiet = tokio::time::timeout(Duration::from_secs(4), conn.stream.read(&mut byte)).await;
    assert!(quiet.is_err(), "still open after the first token's expiry");
    let metadata: MetadataResponse = conn.call(ApiKey::Metadata, 9, &metadata_of("reauth")).await;
    assert_eq!(metadata.topics[0].error_code, 0);

    // Re-authentication as someone else is refused.
    let other = auth::hs256(&auth::claims("someone-else", "read-write"));
    let refused = conn.authenticate("PLAIN", plain(&other)).await;
    assert_eq!(refused.error_code, 58);
    assert!(conn.closed().await);
}

#[actix_web::test]
async fn with_auth_off_a_sasl_client_connects_and_nothing_is_verified() {
    let db = fresh_db().await;
    let (_app, port) = kafka_app(&db, &[]).await;
    let mut conn = Conn::open(port).await;
    let answer = conn.authenticate("PLAIN", plain("anything")).await;
    assert_eq!((answer.error_code, answer.session_lifetime_ms), (0, 0));
    let metadata: MetadataResponse = conn.call(ApiKey::Metadata, 9, &metadata_of("open")).await;
    assert_eq!(metadata.topics[0].error_code, 0);
    // The message's form is still checked.
    let mut conn = Conn::open(port).await;
    let answer = conn
        .authenticate("OAUTHBEARER", Bytes::from_static(b"not rfc 7628"))
        .await;
    assert_eq!(answer.error_code, 58);
}

#[test]
fn each_kafka_api_requires_what_the_http_route_doing_the_same_requires() {
    let routes = queen_broker::http::routes();
    for (key, capability, like) in queen_broker::kafka::access::REQUIRED {
        let (method, path) = like.split_once(' ').expect("METHOD /path");
        let route = routes
            .iter()
            .find(|r| r.method.as_str() == method && r.path == path)
            .unwrap_or_else(|| panic!("{key:?}: no HTTP route {like}"));
        assert_eq!(route.capability, *capability, "{key:?} is like {like}");
    }
}

/// The Kafka views (`GET /api/v1/kafka/topics`, `/api/v1/kafka/groups`): a produced-to topic
/// with its offsets, a group's committed offset and lag, a member that joined through this
/// broker, paging and search.
#[actix_web::test]
async fn the_kafka_views_show_topics_offsets_groups_lag_and_members() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        GroupId, JoinGroupRequest, JoinGroupResponse, OffsetCommitRequest, OffsetCommitResponse,
    };

    let db = fresh_db().await;
    let (app, port) = kafka_app(&db, &[]).await;
    let mut conn = Conn::open(port).await;
    let sent: Vec<Record> = (0..5)
        .map(|i| record(i, None, br#"{"n":1}"#, None))
        .collect();
    for topic in ["views-orders", "views-audit"] {
        let answer: ProduceResponse = conn
            .call(
                ApiKey::Produce,
                9,
                &produce_request(topic, 0, batch(&sent, Compression::None), -1),
            )
            .await;
        assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
    }

    let mut commit = OffsetCommitRequest::default();
    commit.group_id = GroupId(StrBytes::from_static_str("billing"));
    commit.generation_id_or_member_epoch = -1;
    let mut topic = OffsetCommitRequestTopic::default();
    topic.name = TopicName(StrBytes::from_static_str("views-orders"));
    let mut partition = OffsetCommitRequestPartition::default();
    partition.partition_index = 0;
    partition.committed_offset = 2;
    topic.partitions = vec![partition];
    commit.topics = vec![topic];
    let answer: OffsetCommitResponse = conn.call(ApiKey::OffsetCommit, 8, &commit).await;
    assert_eq!(answer.topics[0].partitions[0].error_code, 0);

    let mut join = JoinGroupRequest::default();
    join.group_id = GroupId(StrBytes::from_static_str("billing"));
    join.session_timeout_ms = 30_000;
    join.rebalance_timeout_ms = 30_000;
    join.protocol_type = StrBytes::from_static_str("consumer");
    let mut protocol = JoinGroupRequestProtocol::default();
    protocol.name = StrBytes::from_static_str("range");
    join.protocols = vec![protocol];
    let joined: JoinGroupResponse = conn.call(ApiKey::JoinGroup, 4, &join).await;
    assert_eq!(joined.error_code, 0);
    let member = joined.member_id.to_string();

    let topics = app.get("/api/v1/kafka/topics").await;
    assert_eq!(topics.status, 200, "{}", topics.body);
    assert_eq!(topics.body["total"], 2);
    assert_eq!(topics.body["topics"][0]["name"], "views-audit", "by name");
    let orders = &topics.body["topics"][1];
    assert_eq!(orders["name"], "views-orders");
    assert_eq!(
        orders["offsets"][0],
        json!({"partition": 0, "logStartOffset": 0, "endOffset": 5, "records": 5})
    );
    let found = app.get("/api/v1/kafka/topics?search=ORD&limit=1").await;
    assert_eq!(found.body["total"], 1);
    assert_eq!(found.body["topics"].as_array().unwrap().len(), 1);
    let second = app.get("/api/v1/kafka/topics?limit=1&offset=1").await;
    assert_eq!(second.body["topics"][0]["name"], "views-orders");

    let groups = app.get("/api/v1/kafka/groups").await;
    assert_eq!(groups.status, 200, "{}", groups.body);
    assert_eq!(groups.body["membersKnown"], true);
    assert_eq!(groups.body["total"], 1);
    let billing = &groups.body["groups"][0];
    assert_eq!(billing["group"], "billing");
    assert_eq!(billing["lag"], 3);
    assert_eq!(
        billing["offsets"],
        json!([{"topic": "views-orders", "partition": 0, "committedOffset": 2, "endOffset": 5,
                "lag": 3}])
    );
    let members = billing["members"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{billing}");
    assert_eq!(members[0]["memberId"], member.as_str());
    let none = app.get("/api/v1/kafka/groups?search=nobody").await;
    assert_eq!(none.body["total"], 0);
    assert_eq!(none.body["groups"], json!([]));
    assert_eq!(app.get("/api/v1/kafka/groups?limit=x").await.status, 400);
}

// Several brokers on one database (docs/kafka.md, "Several brokers"): one coordinator per group,
// chosen in PostgreSQL, and a failover when it dies.

fn group_id(name: &str) -> GroupId {
    GroupId(StrBytes::from_string(name.to_string()))
}

async fn find_coordinator(conn: &mut Conn, group: &str) -> FindCoordinatorResponse {
    let mut find = FindCoordinatorRequest::default();
    find.key = StrBytes::from_string(group.to_string());
    conn.call(ApiKey::FindCoordinator, 3, &find).await
}

async fn join(conn: &mut Conn, group: &str, member: &str) -> JoinGroupResponse {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    let mut join = JoinGroupRequest::default();
    join.group_id = group_id(group);
    join.member_id = StrBytes::from_string(member.to_string());
    join.session_timeout_ms = 10_000;
    join.rebalance_timeout_ms = 10_000;
    join.protocol_type = StrBytes::from_static_str("consumer");
    let mut protocol = JoinGroupRequestProtocol::default();
    protocol.name = StrBytes::from_static_str("range");
    protocol.metadata = Bytes::from_static(b"subscription");
    join.protocols = vec![protocol];
    conn.call(ApiKey::JoinGroup, 5, &join).await
}

async fn sync(
    conn: &mut Conn,
    group: &str,
    generation: i32,
    member: &str,
    assignments: &[(&str, &'static [u8])],
) -> SyncGroupResponse {
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    let mut sync = SyncGroupRequest::default();
    sync.group_id = group_id(group);
    sync.generation_id = generation;
    sync.member_id = StrBytes::from_string(member.to_string());
    sync.assignments = assignments
        .iter()
        .map(|(id, bytes)| {
            let mut a = SyncGroupRequestAssignment::default();
            a.member_id = StrBytes::from_string(id.to_string());
            a.assignment = Bytes::from_static(bytes);
            a
        })
        .collect();
    conn.call(ApiKey::SyncGroup, 3, &sync).await
}

async fn heartbeat(conn: &mut Conn, group: &str, generation: i32, member: &str) -> i16 {
    let mut beat = HeartbeatRequest::default();
    beat.group_id = group_id(group);
    beat.generation_id = generation;
    beat.member_id = StrBytes::from_string(member.to_string());
    let answer: HeartbeatResponse = conn.call(ApiKey::Heartbeat, 3, &beat).await;
    answer.error_code
}

/// Commits `offset` on partition `partition` of `topic` as `member` of `generation`; answers
/// the partition's error code.
async fn commit(
    conn: &mut Conn,
    group: &str,
    generation: i32,
    member: &str,
    topic: &str,
    partition: i32,
    offset: i64,
) -> i16 {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    let mut commit = OffsetCommitRequest::default();
    commit.group_id = group_id(group);
    commit.generation_id_or_member_epoch = generation;
    commit.member_id = StrBytes::from_string(member.to_string());
    let mut t = OffsetCommitRequestTopic::default();
    t.name = TopicName(StrBytes::from_string(topic.to_string()));
    let mut p = OffsetCommitRequestPartition::default();
    p.partition_index = partition;
    p.committed_offset = offset;
    t.partitions = vec![p];
    commit.topics = vec![t];
    let answer: OffsetCommitResponse = conn.call(ApiKey::OffsetCommit, 8, &commit).await;
    answer.topics[0].partitions[0].error_code
}

async fn committed_offsets(
    conn: &mut Conn,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> Vec<i64> {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    let mut fetch = OffsetFetchRequest::default();
    fetch.group_id = group_id(group);
    let mut t = OffsetFetchRequestTopic::default();
    t.name = TopicName(StrBytes::from_string(topic.to_string()));
    t.partition_indexes = partitions.to_vec();
    fetch.topics = Some(vec![t]);
    let answer: OffsetFetchResponse = conn.call(ApiKey::OffsetFetch, 5, &fetch).await;
    assert_eq!(answer.error_code, 0);
    answer.topics[0]
        .partitions
        .iter()
        .map(|p| p.committed_offset)
        .collect()
}

async fn create_topic(conn: &mut Conn, name: &'static str, partitions: i32) {
    let mut create = CreateTopicsRequest::default();
    let mut topic = CreatableTopic::default();
    topic.name = TopicName(StrBytes::from_static_str(name));
    topic.num_partitions = partitions;
    topic.replication_factor = 1;
    create.topics = vec![topic];
    create.timeout_ms = 5000;
    let created: CreateTopicsResponse = conn.call(ApiKey::CreateTopics, 7, &create).await;
    assert_eq!(created.topics[0].error_code, 0);
}

/// The coordinator `app`'s Kafka group view names for `group`: (node id, port).
async fn coordinator_seen_from(app: &TestApp, group: &str) -> (Option<i64>, Option<i64>) {
    let r = app
        .get(&format!("/api/v1/kafka/groups?search={group}"))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let g = &r.body["groups"][0];
    assert_eq!(g["group"], group, "{}", r.body);
    (
        g["coordinator"]["nodeId"].as_i64(),
        g["coordinator"]["port"].as_i64(),
    )
}

#[actix_web::test]
async fn two_brokers_share_one_coordinator_per_group_and_hand_it_over_when_it_dies() {
    const LEASE_MS: u64 = 2000;
    let db = fresh_db().await;
    let lease = [("QUEEN_KAFKA_COORDINATOR_LEASE_MS", "2000")];
    let (a, a_port) = kafka_app(&db, &lease).await;
    let (b, b_port) = kafka_app(&db, &lease).await;
    let a_node = a.broker.kafka_node_id().expect("A registered at start");
    let b_node = b.broker.kafka_node_id().expect("B registered at start");
    assert_ne!(a_node, b_node, "each broker has a node id of its own");
    let mut on_a = Conn::open(a_port).await;
    let mut on_b = Conn::open(b_port).await;
    create_topic(&mut on_a, "shared-orders", 2).await;
    let waited = Instant::now();

    // Metadata on either broker lists both (once B renewed its list), and B names itself the
    // leader of what it answers about.
    let mut request = MetadataRequest::default();
    let mut t = MetadataRequestTopic::default();
    t.name = Some(TopicName(StrBytes::from_static_str("shared-orders")));
    request.topics = Some(vec![t]);
    let listed = loop {
        let answer: MetadataResponse = on_b.call(ApiKey::Metadata, 12, &request).await;
        if answer.brokers.len() == 2 {
            break answer;
        }
        assert!(
            Instant::now() < waited + Duration::from_secs(5),
            "B does not list A"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let brokers: Vec<(i32, i32)> = listed
        .brokers
        .iter()
        .map(|b| (b.node_id.0, b.port))
        .collect();
    assert!(
        brokers.contains(&(a_node, i32::from(a_port))),
        "{brokers:?}"
    );
    assert!(
        brokers.contains(&(b_node, i32::from(b_port))),
        "{brokers:?}"
    );
    assert_eq!(listed.controller_id, BrokerId(b_node));
    assert_eq!(listed.topics[0].partitions.len(), 2);
    assert_eq!(listed.topics[0].partitions[1].leader_id, BrokerId(b_node));

    // The first FindCoordinator claims the group for the broker asked; the other answers it.
    let found = find_coordinator(&mut on_a, "shared").await;
    assert_eq!((found.error_code, found.node_id), (0, BrokerId(a_node)));
    assert_eq!(found.port, i32::from(a_port));
    let found = find_coordinator(&mut on_b, "shared").await;
    assert_eq!((found.error_code, found.node_id), (0, BrokerId(a_node)));
    assert_eq!(
        (found.host.as_str(), found.port),
        ("127.0.0.1", i32::from(a_port))
    );
    let mut batched = FindCoordinatorRequest::default();
    batched.coordinator_keys = vec![
        StrBytes::from_static_str("shared"),
        StrBytes::from_static_str("b-only"),
    ];
    let answer: FindCoordinatorResponse = on_b.call(ApiKey::FindCoordinator, 4, &batched).await;
    let nodes: Vec<(i16, i32)> = answer
        .coordinators
        .iter()
        .map(|c| (c.error_code, c.node_id.0))
        .collect();
    assert_eq!(nodes, vec![(0, a_node), (0, b_node)]);

    // Group requests on the other broker are refused, so the client finds the coordinator.
    let refused = join(&mut on_b, "shared", "").await;
    assert_eq!(refused.error_code, 16, "NOT_COORDINATOR");
    assert_eq!(
        commit(&mut on_b, "shared", 1, "m", "shared-orders", 0, 1).await,
        16
    );
    assert_eq!(heartbeat(&mut on_b, "shared", 1, "m").await, 16);

    // Two members, one bootstrapped on each broker, both at the coordinator A.
    let mut m1 = Conn::open(a_port).await;
    let found = find_coordinator(&mut on_b, "shared").await;
    let mut m2 = Conn::open(u16::try_from(found.port).expect("a port")).await;
    let first = join(&mut m1, "shared", "").await;
    assert_eq!(first.error_code, 0);
    let m1_id = first.member_id.to_string();
    assert_eq!(first.leader.as_str(), m1_id);
    let synced = sync(
        &mut m1,
        "shared",
        first.generation_id,
        &m1_id,
        &[(&m1_id, b"p0 p1")],
    )
    .await;
    assert_eq!(
        (synced.error_code, synced.assignment.as_ref()),
        (0, &b"p0 p1"[..])
    );
    let (second, rejoined) = tokio::join!(join(&mut m2, "shared", ""), async {
        // m1 hears of the rebalance in its heartbeat and joins again.
        let mut beats = 0;
        while heartbeat(&mut m1, "shared", first.generation_id, &m1_id).await != 27 {
            beats += 1;
            assert!(beats < 100, "no rebalance within 5 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        join(&mut m1, "shared", &m1_id).await
    });
    assert_eq!((second.error_code, rejoined.error_code), (0, 0));
    assert_eq!(second.generation_id, rejoined.generation_id);
    assert_eq!(rejoined.generation_id, first.generation_id + 1);
    assert_eq!(rejoined.leader.as_str(), m1_id, "m1 leads");
    assert_eq!(rejoined.members.len(), 2);
    let generation = rejoined.generation_id;
    let m2_id = second.member_id.to_string();
    let assignments = [(m1_id.as_str(), &b"p0"[..]), (m2_id.as_str(), &b"p1"[..])];
    let (s1, s2) = tokio::join!(
        sync(&mut m1, "shared", generation, &m1_id, &assignments),
        sync(&mut m2, "shared", generation, &m2_id, &[])
    );
    assert_eq!((s1.error_code, s1.assignment.as_ref()), (0, &b"p0"[..]));
    assert_eq!((s2.error_code, s2.assignment.as_ref()), (0, &b"p1"[..]));
    assert_eq!(
        commit(&mut m1, "shared", generation, &m1_id, "shared-orders", 0, 3).await,
        0
    );
    assert_eq!(
        commit(&mut m2, "shared", generation, &m2_id, "shared-orders", 1, 4).await,
        0
    );
    assert_eq!(
        commit(
            &mut m2,
            "shared",
            generation - 1,
            &m2_id,
            "shared-orders",
            1,
            9
        )
        .await,
        22,
        "ILLEGAL_GENERATION"
    );

    // B's view names A as the coordinator of the group whose members live there.
    assert_eq!(
        coordinator_seen_from(&b, "shared").await,
        (Some(i64::from(a_node)), Some(i64::from(a_port)))
    );

    // A dies (no clean stop): B keeps naming it until its lease runs out, then takes over.
    a.broker.handle.stop(false).await;
    a.broker.shutdown();
    let died = Instant::now();
    let found = find_coordinator(&mut on_b, "shared").await;
    assert_eq!(found.node_id, BrokerId(a_node), "A's lease still runs");
    let took_over = loop {
        let found = find_coordinator(&mut on_b, "shared").await;
        if found.node_id == BrokerId(b_node) {
            assert_eq!(found.port, i32::from(b_port));
            break died.elapsed();
        }
        assert!(
            died.elapsed() < Duration::from_secs(10),
            "B did not take the group"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "coordinator failover: B took the group {took_over:?} after A died (lease {LEASE_MS} ms)"
    );
    assert!(
        took_over <= Duration::from_millis(LEASE_MS + 1000),
        "{took_over:?}"
    );

    // m2 rejoins at B: its old membership is unknown there, so it joins afresh and leads.
    // B's view now names B.
    assert_eq!(
        coordinator_seen_from(&b, "shared").await,
        (Some(i64::from(b_node)), Some(i64::from(b_port)))
    );
    let mut m2 = Conn::open(b_port).await;
    assert_eq!(
        heartbeat(&mut m2, "shared", generation, &m2_id).await,
        25,
        "UNKNOWN_MEMBER_ID"
    );
    assert_eq!(join(&mut m2, "shared", &m2_id).await.error_code, 25);
    let again = join(&mut m2, "shared", "").await;
    assert_eq!(again.error_code, 0);
    let m2_new = again.member_id.to_string();
    assert_eq!(again.leader.as_str(), m2_new);
    let synced = sync(
        &mut m2,
        "shared",
        again.generation_id,
        &m2_new,
        &[(&m2_new, b"p0 p1")],
    )
    .await;
    assert_eq!(
        (synced.error_code, synced.assignment.as_ref()),
        (0, &b"p0 p1"[..])
    );
    // The offsets committed at A are where the group resumes.
    assert_eq!(
        committed_offsets(&mut m2, "shared", "shared-orders", &[0, 1]).await,
        vec![3, 4]
    );
    assert_eq!(
        commit(
            &mut m2,
            "shared",
            again.generation_id,
            &m2_new,
            "shared-orders",
            0,
            5
        )
        .await,
        0
    );
    assert_eq!(
        committed_offsets(&mut m2, "shared", "shared-orders", &[0, 1]).await,
        vec![5, 4]
    );
    drop(b);
}

#[actix_web::test]
async fn a_cleanly_stopped_broker_hands_its_groups_over_at_once() {
    let db = fresh_db().await;
    let (a, a_port) = kafka_app(&db, &[]).await;
    let (b, b_port) = kafka_app(&db, &[]).await;
    let b_node = b.broker.kafka_node_id().expect("B registered at start");
    let mut on_a = Conn::open(a_port).await;
    let mut on_b = Conn::open(b_port).await;
    let joined = join(&mut on_a, "handed", "").await;
    assert_eq!(joined.error_code, 0);
    assert_eq!(join(&mut on_b, "handed", "").await.error_code, 16);

    // The default lease is 10 s; a clean stop does not make the others wait for it.
    let stopped = Instant::now();
    a.broker.release_kafka().await;
    let found = find_coordinator(&mut on_b, "handed").await;
    assert_eq!((found.error_code, found.node_id), (0, BrokerId(b_node)));
    assert!(
        stopped.elapsed() < Duration::from_secs(2),
        "{:?}",
        stopped.elapsed()
    );
    // The member still connected to A hears that A no longer coordinates.
    assert_eq!(
        heartbeat(
            &mut on_a,
            "handed",
            joined.generation_id,
            joined.member_id.as_str()
        )
        .await,
        15
    );
    assert_eq!(join(&mut on_b, "handed", "").await.error_code, 0);
}

//! The Kafka listener at the wire (docs/kafka.md), with requests encoded by the
//! `kafka-protocol` crate against a real broker and PostgreSQL: ApiVersions in both request
//! styles, an API not served answered with its error, hostile frames closing only their own
//! connection, produce → fetch → HTTP pop with keys and headers, idempotent retries stored
//! once, and a fetch long poll woken by an HTTP push. Real clients (librdkafka, kafka-python,
//! kcat) run in tests/compat/kafka.sh.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, EndTxnRequest, EndTxnResponse,
    FetchRequest, FetchResponse, InitProducerIdRequest, InitProducerIdResponse, ListGroupsRequest,
    ListGroupsResponse, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    ProduceRequest, ProduceResponse, ProducerId, RequestHeader, ResponseHeader,
    SaslHandshakeRequest, SaslHandshakeResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::consuming::{messages, pop_partition};
use crate::support::{fresh_db, spawn_app_with, test_settings, TestApp, TestDb};

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
        let mut answer = self.read_frame().await.expect("an answer");
        let header = ResponseHeader::decode(&mut answer, key.response_header_version(version))
            .expect("response header");
        assert_eq!(header.correlation_id, self.correlation);
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

    let mut sasl = SaslHandshakeRequest::default();
    sasl.mechanism = StrBytes::from_static_str("PLAIN");
    let answer: SaslHandshakeResponse = conn.call(ApiKey::SaslHandshake, 1, &sasl).await;
    assert_eq!(answer.error_code, 33, "UNSUPPORTED_SASL_MECHANISM");

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

#[actix_web::test]
async fn declared_record_counts_and_compression_bombs_are_refused_without_the_memory() {
    let db = fresh_db().await;
    let (app, port) = kafka_app(&db, &[("QUEEN_MAX_BODY_BYTES", "1048576")]).await;
    let mut conn = Conn::open(port).await;

    // A batch that declares two billion records (its checksum recomputed, so only the count
    // is wrong): refused before the decoder reserves room for them.
    let mut forged = BytesMut::from(&batch(&[record(0, None, b"{}", None)], Compression::None)[..]);
    forged[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    let crc = crc32c(&forged[21..]);
    forged[17..21].copy_from_slice(&crc.to_be_bytes());
    let answer: ProduceResponse = conn
        .call(
            ApiKey::Produce,
            9,
            &produce_request("bombs", 0, forged.freeze(), -1),
        )
        .await;
    assert_eq!(
        answer.responses[0].partition_responses[0].error_code, 10,
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

    // (Request arrays that declare billions of elements are sent by tests/compat/kafka.sh to
    // the release binary: the codec reserves room for the declared count, which this test
    // binary's allocator cannot reserve; docs/kafka.md, "Hostile input".)

    // Still serving, and nothing was stored.
    let v: ApiVersionsResponse = conn
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(v.error_code, 0);
    assert!(db.stored("bombs", "0").await.is_empty());
    assert_eq!(app.get("/health").await.status, 200);
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

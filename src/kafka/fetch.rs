//! Fetch and ListOffsets: reads by offset over the partitions' segments (`storage::queues::reads`,
//! the same reads as `POST /api/v1/fetch`), without leases or cursors.
//!
//! A fetch that finds nothing waits up to its `max_wait_ms`, woken by the commits that write
//! its partitions (the same wake-ups as long-poll pops: in-process and, across brokers, through
//! LISTEN/NOTIFY). It answers as soon as anything is there (`min_bytes` counts as 1). It
//! honours `max_bytes` and each partition's `partition_max_bytes`, except that the first
//! record of the first partition with data is always sent, as Kafka does, so a record larger
//! than the limit cannot stall a consumer.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chrono::DateTime;
use futures_util::future::select_all;
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{
    FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use sqlx::PgConnection;

use crate::kafka::metadata::{storage_code, topic_counts};
use crate::kafka::record::from_payload;
use crate::kafka::{code, Kafka};
use crate::storage::queues::reads::{self, Head, Want};
use crate::storage::{segments::crypto, segments::frames, StorageError};
use crate::wake::WakeKey;

/// Largest answer a fetch builds, whatever it asks for.
const MAX_FETCH_BYTES: i64 = 64 * 1024 * 1024;
/// Per-record overhead counted against the byte limits (offsets, lengths, attributes).
const RECORD_OVERHEAD: i64 = 24;

/// One partition asked for.
struct Wanted {
    topic: usize,
    queue: String,
    index: i32,
    offset: i64,
    max_bytes: i64,
}

/// What one partition answers.
#[derive(Default)]
struct Answer {
    error: i16,
    high_watermark: i64,
    log_start: i64,
    records: Vec<Record>,
}

/// Reads what `wanted` asks for within `call_budget` bytes.
async fn read_once(
    kafka: &Kafka,
    conn: &mut PgConnection,
    wanted: &[Wanted],
    counts: &HashMap<String, i32>,
    call_budget: i64,
) -> Result<Vec<Answer>, StorageError> {
    let mut answers: Vec<Answer> = wanted.iter().map(|_| Answer::default()).collect();
    let queues: Vec<&str> = wanted.iter().map(|w| w.queue.as_str()).collect();
    let names: Vec<String> = wanted.iter().map(|w| w.index.to_string()).collect();
    let partitions: Vec<&str> = names.iter().map(String::as_str).collect();
    let heads = reads::heads(conn, &queues, &partitions).await?;
    let by_ord: HashMap<i64, &Head> = heads.iter().map(|h| (h.ord, h)).collect();
    let mut wants = Vec::new();
    for (ord, w) in wanted.iter().enumerate() {
        let answer = &mut answers[ord];
        if !counts
            .get(&w.queue)
            .is_some_and(|n| (0..*n).contains(&w.index))
        {
            answer.error = code::UNKNOWN_TOPIC_OR_PARTITION;
            answer.high_watermark = -1;
            answer.log_start = -1;
            continue;
        }
        // A numbered partition never written has no row yet: empty, offsets 0.
        let Some(head) = by_ord.get(&(ord as i64)) else {
            if w.offset != 0 {
                answer.error = code::OFFSET_OUT_OF_RANGE;
            }
            continue;
        };
        answer.high_watermark = head.next_offset;
        answer.log_start = head.log_start;
        if w.offset < head.log_start || w.offset > head.next_offset {
            answer.error = code::OFFSET_OUT_OF_RANGE;
        } else if w.offset < head.next_offset {
            wants.push(Want {
                ord: ord as i64,
                partition_id: head.partition_id,
                from: w.offset,
                budget: w.max_bytes,
            });
        }
    }
    if wants.is_empty() {
        return Ok(answers);
    }
    let mut gone: HashMap<i64, Vec<i64>> = HashMap::new();
    for (ord, offset) in reads::deleted(conn, &wants).await? {
        gone.entry(ord).or_default().push(offset);
    }
    let mut segments: HashMap<i64, Vec<reads::ReadSegment>> = HashMap::new();
    for seg in reads::segments(conn, &wants, call_budget).await? {
        segments.entry(seg.ord).or_default().push(seg);
    }
    let key = kafka.state.payload_key.as_ref();
    let mut call_used: i64 = 0;
    for want in &wants {
        let ord = want.ord as usize;
        let head = by_ord[&want.ord];
        let w = &wanted[ord];
        let gone = gone.get(&want.ord).map_or(&[][..], Vec::as_slice);
        let mut entry_used: i64 = 0;
        let mut next = w.offset;
        'segments: for seg in segments.get(&want.ord).into_iter().flatten() {
            let corrupt = |source| StorageError::CorruptSegment {
                partition: head.partition_id,
                source,
            };
            let skip = (next - seg.base_offset).max(0) as usize;
            let decoded = frames::decode_from(&seg.frames, skip).map_err(corrupt)?;
            for (offset, frame) in (seg.base_offset + skip as i64..).zip(decoded) {
                if offset >= head.next_offset {
                    break 'segments;
                }
                let frame = frame.map_err(corrupt)?;
                next = offset + 1;
                if gone.binary_search(&offset).is_ok() {
                    continue;
                }
                let payload = if frame.encrypted {
                    match crypto::open_with(key, frame.payload) {
                        Ok(text) => text,
                        Err(e) => {
                            tracing::error!(message_id = %frame.id, queue = %w.queue,
                                partition = w.index, error = %e,
                                "a stored payload cannot be decrypted; record left out of the Kafka fetch");
                            continue;
                        }
                    }
                } else {
                    frame.payload.to_string()
                };
                let parts = from_payload(&payload, frame.created_at_micros.div_euclid(1000));
                let size = RECORD_OVERHEAD
                    + parts.key.as_ref().map_or(0, |k| k.len() as i64)
                    + parts.value.as_ref().map_or(0, |v| v.len() as i64)
                    + parts
                        .headers
                        .iter()
                        .map(|(k, v)| (k.len() + v.as_ref().map_or(0, Bytes::len)) as i64 + 8)
                        .sum::<i64>();
                let first = call_used == 0;
                let fits = entry_used + size <= w.max_bytes && call_used + size <= call_budget;
                if !(first || fits) {
                    break 'segments;
                }
                entry_used += size;
                call_used += size;
                let mut headers = IndexMap::new();
                for (k, v) in parts.headers {
                    headers.insert(StrBytes::from_string(k), v);
                }
                answers[ord].records.push(Record {
                    transactional: false,
                    control: false,
                    delete_horizon: false,
                    partition_leader_epoch: -1,
                    producer_id: -1,
                    producer_epoch: -1,
                    timestamp_type: TimestampType::Creation,
                    offset,
                    // Constant offset − sequence keeps the records in one batch.
                    sequence: offset as i32,
                    timestamp: parts.timestamp,
                    key: parts.key,
                    value: parts.value,
                    headers,
                });
            }
        }
        if call_used >= call_budget {
            break;
        }
    }
    Ok(answers)
}

/// Fetch.
pub async fn fetch(kafka: &Kafka, request: FetchRequest, _version: i16) -> FetchResponse {
    let mut response = FetchResponse::default();
    let names: Vec<String> = request
        .topics
        .iter()
        .map(|t| t.topic.0.to_string())
        .collect();
    let mut wanted = Vec::new();
    for (t, topic) in request.topics.iter().enumerate() {
        let mut entry = FetchableTopicResponse::default();
        entry.topic = topic.topic.clone();
        entry.topic_id = topic.topic_id;
        response.responses.push(entry);
        for p in &topic.partitions {
            wanted.push(Wanted {
                topic: t,
                queue: names[t].clone(),
                index: p.partition,
                offset: p.fetch_offset,
                max_bytes: i64::from(p.partition_max_bytes).clamp(1, MAX_FETCH_BYTES),
            });
        }
    }
    let call_budget = i64::from(request.max_bytes).clamp(1, MAX_FETCH_BYTES);
    let max_wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
    let deadline = tokio::time::Instant::now() + max_wait;
    let answers = async {
        let counts = topic_counts(kafka, &names, false).await?;
        loop {
            // Subscribed before the read, so a commit between the read and the wait wakes it.
            let waiters: Vec<_> = wanted
                .iter()
                .map(|w| {
                    kafka
                        .state
                        .wake
                        .subscribe(WakeKey::Partition(w.queue.clone(), w.index.to_string()))
                })
                .collect();
            let mut notified: Vec<_> = waiters
                .iter()
                .map(|w| Box::pin(w.notify().notified()))
                .collect();
            for n in &mut notified {
                n.as_mut().enable();
            }
            let answers = {
                let mut conn = kafka.state.pool.acquire().await?;
                read_once(kafka, &mut conn, &wanted, &counts, call_budget).await?
            };
            let any = answers
                .iter()
                .any(|a| !a.records.is_empty() || a.error != 0);
            let now = tokio::time::Instant::now();
            if any || now >= deadline || notified.is_empty() {
                return Ok::<_, StorageError>(answers);
            }
            // Re-read at least this often (a wake-up is a hint and can be lost).
            let until = deadline.min(now + kafka.state.settings.pop_recheck);
            let _ = tokio::time::timeout_at(until, select_all(notified)).await;
        }
    }
    .await;
    match answers {
        Ok(answers) => {
            for (w, a) in wanted.iter().zip(answers) {
                let mut p = PartitionData::default();
                p.partition_index = w.index;
                p.error_code = a.error;
                p.high_watermark = a.high_watermark;
                p.last_stable_offset = a.high_watermark;
                p.log_start_offset = a.log_start;
                p.preferred_read_replica = kafka_protocol::messages::BrokerId(-1);
                if !a.records.is_empty() {
                    kafka.metrics.fetched(a.records.len() as u64);
                    let mut buf = BytesMut::new();
                    let options = RecordEncodeOptions {
                        version: 2,
                        compression: Compression::None,
                    };
                    match RecordBatchEncoder::encode(&mut buf, a.records.iter(), &options) {
                        Ok(()) => p.records = Some(buf.freeze()),
                        Err(e) => {
                            tracing::error!(topic = %w.queue, partition = w.index, error = %e,
                                "Kafka fetch: records do not encode");
                            p.error_code = code::UNKNOWN_SERVER_ERROR;
                        }
                    }
                } else {
                    p.records = Some(Bytes::new());
                }
                response.responses[w.topic].partitions.push(p);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "Kafka fetch failed");
            let code = storage_code(&e);
            for w in &wanted {
                let mut p = PartitionData::default();
                p.partition_index = w.index;
                p.error_code = code;
                p.high_watermark = -1;
                p.last_stable_offset = -1;
                p.log_start_offset = -1;
                p.records = Some(Bytes::new());
                response.responses[w.topic].partitions.push(p);
            }
        }
    }
    response
}

/// ListOffsets: -2 is the earliest offset kept, -1 (and -3, the largest timestamp) the next
/// offset to be written, a time the first offset committed at or after it (by the time its
/// segment was committed; -1 when none is that recent).
pub async fn list_offsets(
    kafka: &Kafka,
    request: ListOffsetsRequest,
    _version: i16,
) -> ListOffsetsResponse {
    let mut response = ListOffsetsResponse::default();
    let names: Vec<String> = request
        .topics
        .iter()
        .map(|t| t.name.0.to_string())
        .collect();
    let result = async {
        let counts = topic_counts(kafka, &names, false).await?;
        let mut conn = kafka.state.pool.acquire().await?;
        let mut queues = Vec::new();
        let mut partitions = Vec::new();
        for (t, topic) in request.topics.iter().enumerate() {
            for p in &topic.partitions {
                queues.push(names[t].clone());
                partitions.push(p.partition_index.to_string());
            }
        }
        let q: Vec<&str> = queues.iter().map(String::as_str).collect();
        let p: Vec<&str> = partitions.iter().map(String::as_str).collect();
        let heads = reads::heads(&mut conn, &q, &p).await?;
        let by_ord: HashMap<i64, Head> = heads.into_iter().map(|h| (h.ord, h)).collect();
        let mut ord = 0i64;
        let mut out = Vec::new();
        for (t, topic) in request.topics.iter().enumerate() {
            let mut entry = ListOffsetsTopicResponse::default();
            entry.name = topic.name.clone();
            for p in &topic.partitions {
                let mut r = ListOffsetsPartitionResponse::default();
                r.partition_index = p.partition_index;
                r.timestamp = -1;
                r.leader_epoch = -1;
                let known = counts
                    .get(&names[t])
                    .is_some_and(|n| (0..*n).contains(&p.partition_index));
                if !known {
                    r.error_code = code::UNKNOWN_TOPIC_OR_PARTITION;
                    r.offset = -1;
                } else {
                    let (start, end, id) = by_ord.get(&ord).map_or((0, 0, None), |h| {
                        (h.log_start, h.next_offset, Some(h.partition_id))
                    });
                    r.offset = match p.timestamp {
                        -2 => start,
                        -1 | -3 => end,
                        ts if ts >= 0 => match (id, DateTime::from_timestamp_millis(ts)) {
                            (Some(id), Some(at)) => {
                                match crate::storage::kafka::offset_at(&mut conn, id, at).await? {
                                    Some(offset) => {
                                        r.timestamp = ts;
                                        offset
                                    }
                                    None => -1,
                                }
                            }
                            _ => -1,
                        },
                        _ => {
                            r.error_code = code::INVALID_REQUEST;
                            -1
                        }
                    };
                }
                ord += 1;
                entry.partitions.push(r);
            }
            out.push(entry);
        }
        Ok::<_, StorageError>(out)
    }
    .await;
    match result {
        Ok(topics) => response.topics = topics,
        Err(e) => {
            tracing::warn!(error = %e, "Kafka ListOffsets failed");
            let code = storage_code(&e);
            response.topics = request
                .topics
                .iter()
                .map(|t| {
                    let mut entry = ListOffsetsTopicResponse::default();
                    entry.name = t.name.clone();
                    entry.partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            let mut r = ListOffsetsPartitionResponse::default();
                            r.partition_index = p.partition_index;
                            r.error_code = code;
                            r.offset = -1;
                            r.timestamp = -1;
                            r
                        })
                        .collect();
                    entry
                })
                .collect();
        }
    }
    response
}

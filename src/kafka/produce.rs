//! Produce and InitProducerId.
//!
//! A produce decodes each partition's record batches (v2; gzip, snappy, lz4, zstd), turns every
//! record into a write-path item ([`record::to_payload`]) and hands each partition's items to
//! its partition actor, exactly as `POST /api/v1/push` does: the same committers, the same
//! spool when PostgreSQL is away, the same maintenance mode, the same admission limit.
//!
//! Idempotent producers: a record of producer `p`, epoch `e`, sequence `s` gets the
//! transactionId `kafka:p:e:s`, so the partition's exact dedup stores a retried batch once and
//! answers it as the original (its offset is found through the dedup sidecar).
//!
//! The answer, per partition: `NONE` with the base offset when every record is stored or a
//! duplicate; `NONE` with base offset -1 when they were spooled (`buffered` on HTTP: on disk,
//! committed once PostgreSQL answers); `KAFKA_STORAGE_ERROR` (retriable) when any record was
//! neither stored nor spooled; `REQUEST_TIMED_OUT` (retriable) when the write path is full;
//! `POLICY_VIOLATION` when the queue refused them (`maxSize`, encryption without a key).

use broker_actors::registry::Handed;
use broker_actors::{Item, PartitionKey, PushError, Verdict};
use futures_util::future::join_all;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use uuid::Uuid;

use crate::kafka::compression::{self, Budget};
use crate::kafka::metadata::{storage_code, topic_counts};
use crate::kafka::record::{self, Parts};
use crate::kafka::{code, Kafka};
use crate::protocol::time::now_micros;
use crate::state::{admit, push_cost, Admission, ITEM_MEMORY_BYTES};
use crate::storage::push::dedup::key_hash;

/// One partition of a produce on its way through.
struct Slot {
    topic: usize,
    index: i32,
    error: i16,
    message: Option<String>,
    base_offset: i64,
    /// The first record's transactionId, to find its offset once stored.
    first_key: Option<String>,
}

/// What one produce request may hold: decompressed record bytes, and records (each costs what
/// an HTTP push item costs, `state::ITEM_MEMORY_BYTES`, against `QUEEN_MAX_INFLIGHT_BYTES`).
pub struct Limits {
    /// Decompressed bytes left (`compression::Budget`).
    pub inflated: Budget,
    /// Records left.
    pub records: std::cell::Cell<usize>,
}

/// Decodes one partition's batches into items stamped with the producer's `sub` (the SASL
/// token's, as an HTTP push stamps its caller's); `Err` is the partition's error code. Public
/// for the `kafka_request` fuzz target (fuzz/checks.rs).
pub fn items_of(
    records: Option<bytes::Bytes>,
    limits: &Limits,
    producer_sub: Option<&str>,
) -> Result<Vec<Item>, (i16, String)> {
    let Some(mut bytes) = records else {
        return Ok(Vec::new());
    };
    // The batch headers first (no decompression): the record counts they declare are what
    // the decoder reserves room for, so they are bounded before it runs.
    let infos = RecordBatchDecoder::decode_batch_info(&mut bytes.clone())
        .map_err(|e| (code::CORRUPT_MESSAGE, format!("record batch: {e:#}")))?;
    let declared: usize = infos
        .iter()
        .map(|i| usize::try_from(i.record_count).unwrap_or(usize::MAX))
        .fold(0, usize::saturating_add);
    let left = limits.records.get();
    if declared > left {
        return Err((
            code::MESSAGE_TOO_LARGE,
            format!("{declared} records are more than one request may hold ({left} left)"),
        ));
    }
    limits.records.set(left - declared);
    let mut sets = Vec::new();
    while !bytes.is_empty() {
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            RecordBatchDecoder::decode_with_custom_compression(
                &mut bytes,
                Some(|data: &mut bytes::Bytes, c| {
                    compression::decompress(&limits.inflated, data, c)
                }),
            )
        }));
        match decoded {
            Ok(Ok(set)) => sets.push(set),
            Ok(Err(e)) if compression::over_budget(&e) => {
                return Err((code::MESSAGE_TOO_LARGE, format!("record batch: {e:#}")))
            }
            Ok(Err(e)) => return Err((code::CORRUPT_MESSAGE, format!("record batch: {e:#}"))),
            Err(_) => {
                tracing::warn!(
                    "the record batch decoder panicked on a produce; answered CORRUPT_MESSAGE"
                );
                return Err((code::CORRUPT_MESSAGE, "record batch does not decode".into()));
            }
        }
    }
    let arrived_at_micros = now_micros();
    let mut items = Vec::new();
    for set in sets {
        for r in set.records {
            if r.transactional || r.control {
                return Err((
                    code::INVALID_REQUEST,
                    "transactional records are not served".into(),
                ));
            }
            let message_id = Uuid::now_v7();
            let transaction_id = if r.producer_id >= 0 && r.sequence >= 0 {
                format!(
                    "kafka:{}:{}:{}",
                    r.producer_id, r.producer_epoch, r.sequence
                )
            } else {
                message_id.to_string()
            };
            let parts = Parts {
                key: r.key,
                value: r.value,
                headers: r
                    .headers
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
                timestamp: r.timestamp,
            };
            items.push(Item {
                message_id,
                transaction_id,
                payload: record::to_payload(&parts).into_boxed_str(),
                producer_sub: producer_sub.map(str::to_string),
                trace_id: None,
                arrived_at_micros,
            });
        }
    }
    Ok(items)
}

/// A produce whose records the partition actors hold: what is left is to wait for their
/// verdicts and answer ([`Produced::answer`]).
pub struct Produced<'a> {
    kafka: &'a Kafka,
    acks: i16,
    slots: Vec<Slot>,
    response: ProduceResponse,
    handed: Vec<(usize, PartitionKey, Result<Handed, PushError>)>,
    /// The write path's share this produce holds until its verdicts are in.
    admission: Option<Admission>,
}

/// The first half of a produce (the records carry `producer_sub`, the SASL caller's `sub`, as
/// `producerSub`): checks the topics, decodes the records and hands each
/// partition's items to its actor, returning once every actor holds them. A connection
/// awaits this for one request before the next, which keeps the order of its produces per
/// partition while their commits overlap (`kafka::conn`).
pub async fn hand_over<'a>(
    kafka: &'a Kafka,
    request: ProduceRequest,
    producer_sub: Option<&str>,
) -> Produced<'a> {
    let state = &kafka.state;
    let names: Vec<String> = request
        .topic_data
        .iter()
        .map(|t| t.name.0.to_string())
        .collect();
    let counts = match topic_counts(kafka, &names, true).await {
        Ok(c) => Ok(c),
        Err(e) => {
            tracing::warn!(error = %e, "Kafka produce: reading topics failed");
            Err(storage_code(&e))
        }
    };
    let limits = Limits {
        inflated: Budget::new(state.settings.max_body_bytes),
        records: std::cell::Cell::new(state.settings.max_inflight_bytes / ITEM_MEMORY_BYTES),
    };
    let mut slots: Vec<Slot> = Vec::new();
    let mut work: Vec<(usize, PartitionKey, Vec<Item>)> = Vec::new();
    let mut response = ProduceResponse::default();
    for (t, topic) in request.topic_data.into_iter().enumerate() {
        let mut entry = TopicProduceResponse::default();
        entry.name = topic.name;
        response.responses.push(entry);
        for p in topic.partition_data {
            let mut slot = Slot {
                topic: t,
                index: p.index,
                error: code::NONE,
                message: None,
                base_offset: -1,
                first_key: None,
            };
            let count = match &counts {
                Ok(c) => c.get(&names[t]).copied(),
                Err(code) => {
                    slot.error = *code;
                    slots.push(slot);
                    continue;
                }
            };
            if !count.is_some_and(|n| (0..n).contains(&p.index)) {
                slot.error = code::UNKNOWN_TOPIC_OR_PARTITION;
                slots.push(slot);
                continue;
            }
            match items_of(p.records, &limits, producer_sub) {
                Ok(items) if items.is_empty() => {}
                Ok(items) => {
                    slot.first_key = Some(items[0].transaction_id.clone());
                    work.push((
                        slots.len(),
                        PartitionKey::new(&names[t], &p.index.to_string()),
                        items,
                    ));
                }
                Err((code, why)) => {
                    tracing::debug!(topic = %names[t], partition = p.index, reason = %why,
                        "Kafka produce: partition refused");
                    slot.error = code;
                    slot.message = Some(why);
                }
            }
            slots.push(slot);
        }
    }

    // Admission, as for an HTTP push: what the items will cost, against the same limit.
    let bytes: usize = work
        .iter()
        .flat_map(|(_, _, items)| items.iter().map(|i| i.payload.len()))
        .sum();
    let count: usize = work.iter().map(|(_, _, items)| items.len()).sum();
    let limit = state.settings.max_inflight_bytes;
    let admission = admit(&state.inflight, push_cost(bytes, count), limit);
    if admission.is_none() {
        for (slot, _, _) in &work {
            slots[*slot].error = code::REQUEST_TIMED_OUT;
            slots[*slot].message = Some("the write path is full; retry".into());
        }
        work.clear();
    }
    let hand_overs = work.into_iter().map(|(slot, key, items)| {
        let registry = &state.registry;
        async move {
            let handed = registry.hand_over(&key, items).await;
            (slot, key, handed)
        }
    });
    let handed = join_all(hand_overs).await;
    Produced {
        kafka,
        acks: request.acks,
        slots,
        response,
        handed,
        admission,
    }
}

impl Produced<'_> {
    /// The second half of a produce: waits for the verdicts, finds the stored offsets and
    /// makes the answer.
    pub async fn answer(self) -> ProduceResponse {
        let Produced {
            kafka,
            acks,
            mut slots,
            mut response,
            handed,
            admission,
        } = self;
        let state = &kafka.state;
        let waits = handed.into_iter().map(|(slot, key, handed)| async move {
            let verdicts = match handed {
                Ok(handed) => handed.verdicts().await,
                Err(e) => Err(e),
            };
            (slot, key, verdicts)
        });
        let mut lookups: Vec<(usize, String, String, String)> = Vec::new();
        for (slot, key, verdicts) in join_all(waits).await {
            let s = &mut slots[slot];
            match verdicts {
                Err(PushError::Overloaded(_)) => {
                    s.error = code::REQUEST_TIMED_OUT;
                    s.message = Some("the partition is overloaded; retry".into());
                }
                Err(e) => {
                    tracing::warn!(queue = %key.queue, partition = %key.partition, error = %e,
                        "Kafka produce: the write path failed");
                    s.error = code::KAFKA_STORAGE_ERROR;
                    s.message = Some(e.to_string());
                }
                Ok(verdicts) => {
                    state.metrics.pushed(verdicts.iter().map(|v| v.as_str()));
                    kafka.metrics.produced(
                        verdicts
                            .iter()
                            .filter(|v| matches!(v, Verdict::Queued | Verdict::Buffered))
                            .count() as u64,
                    );
                    if verdicts.contains(&Verdict::Queued) && !state.wake.listening() {
                        state.wake.wake(&key.queue, &key.partition);
                    }
                    if let Some(Verdict::Refused(why)) =
                        verdicts.iter().find(|v| matches!(v, Verdict::Refused(_)))
                    {
                        s.error = code::POLICY_VIOLATION;
                        s.message = Some(why.message(&key.queue));
                    } else if verdicts.contains(&Verdict::Failed) {
                        s.error = code::KAFKA_STORAGE_ERROR;
                        s.message = Some("neither stored nor spooled; retry".into());
                    } else if matches!(
                        verdicts.first(),
                        Some(Verdict::Queued | Verdict::Duplicate(_))
                    ) {
                        if let Some(first) = s.first_key.take() {
                            lookups.push((
                                slot,
                                key.queue.to_string(),
                                key.partition.to_string(),
                                first,
                            ));
                        }
                    }
                    // All buffered: accepted, offsets unknown until the spool is replayed.
                }
            }
        }
        drop(admission);

        if acks != 0 && !lookups.is_empty() {
            if let Err(e) = base_offsets(kafka, &mut slots, &lookups).await {
                // Stored all the same: the client gets offset -1 rather than a retry that
                // would store the records twice.
                tracing::warn!(error = %e, "Kafka produce: looking up the stored offsets failed");
            }
        }
        for s in slots {
            let mut p = PartitionProduceResponse::default();
            p.index = s.index;
            p.error_code = s.error;
            p.base_offset = s.base_offset;
            p.log_append_time_ms = -1;
            p.log_start_offset = -1;
            p.error_message = s.message.map(StrBytes::from_string);
            response.responses[s.topic].partition_responses.push(p);
        }
        response
    }
}

/// Fills in the base offsets of stored partitions, found through the dedup sidecar.
async fn base_offsets(
    kafka: &Kafka,
    slots: &mut [Slot],
    lookups: &[(usize, String, String, String)],
) -> Result<(), crate::storage::StorageError> {
    let secret = kafka.secret().await?;
    let queues: Vec<String> = lookups.iter().map(|l| l.1.clone()).collect();
    let partitions: Vec<String> = lookups.iter().map(|l| l.2.clone()).collect();
    let hashes: Vec<i64> = lookups.iter().map(|l| key_hash(&secret, &l.3)).collect();
    let mut conn = kafka.state.pool.acquire().await?;
    let offsets =
        crate::storage::kafka::offsets_of_keys(&mut conn, &queues, &partitions, &hashes).await?;
    for ((slot, ..), offset) in lookups.iter().zip(offsets) {
        slots[*slot].base_offset = offset.unwrap_or(-1);
    }
    Ok(())
}

/// InitProducerId: a producer id unique across brokers (a PostgreSQL sequence), epoch 0; a
/// producer that names its id and epoch gets the next epoch. Transactional ids are not served.
pub async fn init_producer_id(
    kafka: &Kafka,
    request: InitProducerIdRequest,
    _version: i16,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    if request
        .transactional_id
        .as_ref()
        .is_some_and(|t| !t.0.is_empty())
    {
        response.error_code = code::INVALID_REQUEST;
        return response;
    }
    // A known producer bumps its epoch; once epochs are exhausted it gets a fresh id, as
    // Kafka does.
    if request.producer_id.0 >= 0
        && request.producer_epoch >= 0
        && request.producer_epoch < i16::MAX - 1
    {
        response.producer_id = request.producer_id;
        response.producer_epoch = request.producer_epoch + 1;
        return response;
    }
    let id = async {
        let mut conn = kafka.state.pool.acquire().await?;
        crate::storage::kafka::next_producer_id(&mut conn).await
    }
    .await;
    match id {
        Ok(id) => {
            response.producer_id = ProducerId(id);
            response.producer_epoch = 0;
        }
        Err(e) => {
            tracing::warn!(error = %e, "Kafka InitProducerId failed");
            response.error_code = if e.is_unreachable() {
                code::COORDINATOR_NOT_AVAILABLE
            } else {
                code::UNKNOWN_SERVER_ERROR
            };
        }
    }
    response
}

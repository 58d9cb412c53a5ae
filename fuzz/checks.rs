//! The checks of the fuzz targets, one function per target: the cargo-fuzz targets
//! (`fuzz_targets/`, nightly) call them on libFuzzer's inputs, and the stable test
//! `tests/it/fuzz_corpus.rs` runs them on the committed corpus (`corpus/<target>/`), so every
//! input a fuzzing run kept is checked by the default `cargo test` too.

use broker_actors::codec;
use broker_actors::spool::record;
use broker_actors::Item;
use broker_actors::PartitionKey;
use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::Decodable;
use queen_broker::http::transaction::{parse, parse_binary};
use queen_broker::kafka::compression::Budget;
use queen_broker::kafka::produce::{items_of, Limits};
use queen_broker::protocol::ack::{group_of, json_body, parse_ack, WireAck};
use queen_broker::protocol::depth;
use queen_broker::protocol::push::{mint, parse_push_body, push_item_count, ParsedItem};
use queen_broker::protocol::push_binary::{
    declared_inflated_len, decode_push, decode_transaction, encode_push, encode_push_frames, Group,
    FLAG_TXN, FLAG_ZSTD,
};
use queen_broker::storage::consume::acks::Ack;
use queen_broker::storage::segments::frames;
use queen_broker::storage::transaction::Request;
use serde_json::Value;

/// The push body parser (`POST /api/v1/push`): arbitrary bytes never panic; an accepted body's
/// items obey the validation rules, the admission count agrees with the parser, and the minted
/// items survive the spool record and segment frame encodings unchanged.
pub fn push_body(data: &[u8]) {
    let count = push_item_count(data);
    let Ok(mut parsed) = parse_push_body(data) else {
        return;
    };
    assert_eq!(
        count,
        parsed.len(),
        "admission counts what the parser accepts"
    );
    for p in &parsed {
        for name in [&p.queue, &p.partition] {
            assert!(!name.is_empty() && !name.contains('\0'));
            assert!(name.chars().count() <= 255);
        }
        if let Some(t) = &p.transaction_id {
            assert!(!t.is_empty() && !t.contains('\0') && t.chars().count() <= 255);
        }
        serde_json::from_str::<serde::de::IgnoredAny>(&p.payload).expect("payload is JSON");
    }
    let items = mint(&mut parsed, Some("fuzz"));
    let mut spooled = Vec::new();
    for (p, item) in parsed.iter().zip(&items) {
        record::encode(
            &PartitionKey::new(&p.queue, &p.partition),
            item,
            &mut spooled,
        );
    }
    let (records, damage) = record::decode_all(&spooled);
    assert!(damage.is_empty());
    assert_eq!(records.len(), items.len());
    for (r, (p, item)) in records.iter().zip(parsed.iter().zip(&items)) {
        assert_eq!(&r.item, item);
        assert_eq!(
            (&*r.key.queue, &*r.key.partition),
            (p.queue.as_str(), p.partition.as_str())
        );
    }
    let segment = frames::encode(items.iter());
    let decoded = frames::decode(&segment).expect("own segment decodes");
    assert_eq!(decoded.len(), items.len());
    for (f, item) in decoded.iter().zip(&items) {
        assert_eq!(f.id, item.message_id);
        assert_eq!(f.transaction_id, item.transaction_id);
        assert_eq!(f.payload, &*item.payload);
    }
}

fn check_ack(a: &Ack) {
    for text in [
        Some(&a.transaction_id),
        Some(&a.group),
        a.lease_id.as_ref(),
        a.error.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        assert!(
            !text.contains('\0'),
            "accepted ack text holds a NUL: {text:?}"
        );
    }
    assert!(a.group.chars().count() <= 255);
}

/// The ack bodies (`/ack`, `/ack/batch`, parsed as their routes parse them) and the
/// `/transaction` body: arbitrary bytes never panic, and whatever is accepted holds no value
/// PostgreSQL would refuse (a NUL) and no name over 255 characters.
pub fn ack_transaction_body(data: &[u8]) {
    // The `/ack` and `/ack/batch` routes read their body without a JSON tree (`WireAck`): it
    // must accept exactly what the tree accepts and read the same acks from it.
    let tree = json_body(data, false);
    let wire = WireAck::read(data);
    assert_eq!(tree.is_ok(), wire.is_ok(), "tree {tree:?} vs wire {wire:?}");
    if let (Ok(v), Ok(w)) = (&tree, &wire) {
        let one = |r: Result<Ack, _>| format!("{r:?}");
        assert_eq!(
            one(parse_ack(v, 0, group_of(v), "txn", "partition")),
            one(w.to_ack(0, w.group(), "txn", "partition"))
        );
        let items = v.get("acknowledgments").and_then(Value::as_array);
        assert_eq!(items.map(Vec::len), w.items().map(<[_]>::len));
        if let (Some(items), Some(wired)) = (items, w.items()) {
            for (i, (item, wired)) in items.iter().zip(wired).enumerate() {
                assert_eq!(
                    one(parse_ack(item, i, group_of(v), "txn", "partition")),
                    one(wired.to_ack(i, w.group(), "txn", "partition"))
                );
            }
        }
    }
    // `/ack`: one object.
    if let Ok(v) = tree {
        if let Ok(a) = parse_ack(&v, 0, group_of(&v), "txn", "partition") {
            check_ack(&a);
        }
        // `/ack/batch`: the top-level group applies to every item.
        if let Some(items) = v.get("acknowledgments").and_then(Value::as_array) {
            let group = group_of(&v);
            for (i, item) in items.iter().enumerate() {
                if let Ok(a) = parse_ack(item, i, group.clone(), "txn", "partition") {
                    check_ack(&a);
                }
            }
        }
    }
    // `/transaction`.
    if let Ok(plan) = parse(data, Some("fuzz")) {
        check_plan(&plan);
    }
}

/// What every accepted transaction plan holds, JSON or `QTB1`.
fn check_plan(plan: &Request) {
    assert_eq!(plan.results, plan.pushes.len() + plan.acks.len());
    for push in &plan.pushes {
        for name in [&*push.key.queue, &*push.key.partition] {
            assert!(!name.is_empty() && !name.contains('\0') && name.chars().count() <= 255);
        }
        assert!(!push.item.transaction_id.contains('\0'));
        if let Some(t) = &push.item.trace_id {
            assert!(!t.contains('\0') && t.chars().count() <= 255);
        }
        assert!(push.result < plan.results);
    }
    for a in &plan.acks {
        check_ack(a);
        assert!(a.index < plan.results);
    }
}

/// What the fuzz checks let a binary body inflate to (the route uses `QUEEN_MAX_BODY_BYTES`).
const MAX_INFLATED: usize = 1 << 20;

/// An accepted item of any push body keeps the JSON body's rules.
fn check_parsed(p: &ParsedItem) {
    for name in [&p.queue, &p.partition] {
        assert!(!name.is_empty() && !name.contains('\0'));
        assert!(name.chars().count() <= 255);
    }
    if let Some(t) = &p.transaction_id {
        assert!(!t.is_empty() && !t.contains('\0') && t.chars().count() <= 255);
    }
    serde_json::from_str::<serde::de::IgnoredAny>(&p.payload).expect("payload is JSON");
    assert!(depth::depth_up_to(&p.payload, depth::MAX_DEPTH) <= depth::MAX_DEPTH);
    assert_eq!(p.payload.trim(), p.payload, "payload kept trimmed");
}

/// The items as encoder groups: consecutive items of one partition share a group.
fn regroup(items: &[ParsedItem]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for p in items {
        let txn = p.transaction_id.clone().unwrap_or_default();
        match groups.last_mut() {
            Some(g) if g.queue == p.queue && g.partition == p.partition => {
                g.items.push((txn, p.payload.clone()));
            }
            _ => groups.push(Group {
                queue: p.queue.clone(),
                partition: p.partition.clone(),
                items: vec![(txn, p.payload.clone())],
            }),
        }
    }
    groups
}

/// The `QPB1` decoder (`POST /api/v1/push` with `application/x-queen-push`): arbitrary bytes
/// never panic and never inflate past the budget; an accepted body's items keep the JSON
/// body's rules, and encoding them again (each form of the encoder) decodes to the same items.
pub fn push_binary(data: &[u8]) {
    let _ = declared_inflated_len(data);
    let Ok(decoded) = decode_push(data, MAX_INFLATED) else {
        return;
    };
    for p in &decoded.items {
        check_parsed(p);
        if let Some(id) = p.message_id {
            assert_eq!(id.get_version_num(), 7);
        }
    }
    let groups = regroup(&decoded.items);
    let key = |p: &ParsedItem| (p.queue.clone(), p.partition.clone(), p.payload.clone());
    for flags in [0, FLAG_TXN, FLAG_ZSTD | FLAG_TXN] {
        let again = decode_push(&encode_push(&groups, flags), usize::MAX).expect("own encoding");
        assert_eq!(
            again.items.iter().map(key).collect::<Vec<_>>(),
            decoded.items.iter().map(key).collect::<Vec<_>>()
        );
        for (a, b) in again.items.iter().zip(&decoded.items) {
            assert_eq!(a.transaction_id, b.transaction_id);
        }
    }
    let framed = decode_push(&encode_push_frames(&groups, decoded.counts), usize::MAX)
        .expect("own framed encoding");
    assert_eq!(framed.counts, decoded.counts);
    assert_eq!(
        framed.items.iter().map(key).collect::<Vec<_>>(),
        decoded.items.iter().map(key).collect::<Vec<_>>()
    );
}

/// The `QTB1` parser (`POST /api/v1/transaction` with `application/x-queen-push`): arbitrary
/// bytes never panic; an accepted plan holds what a JSON one holds, with the groups' pushes
/// numbered after the head's operations.
pub fn transaction_binary(data: &[u8]) {
    let Ok(decoded) = decode_transaction(data, MAX_INFLATED) else {
        assert!(parse_binary(data, Some("fuzz"), MAX_INFLATED).is_err());
        return;
    };
    let pushed = decoded.items.len();
    if let Ok((plan, counts)) = parse_binary(data, Some("fuzz"), MAX_INFLATED) {
        check_plan(&plan);
        assert_eq!(counts, decoded.counts);
        // The groups' pushes are the last `pushed` results, in wire order.
        let tail = &plan.pushes[plan.pushes.len() - pushed..];
        for (k, (push, item)) in tail.iter().zip(&decoded.items).enumerate() {
            assert_eq!(push.result, plan.results - pushed + k);
            assert_eq!(Some(push.item.message_id), item.message_id);
            assert_eq!(&*push.key.queue, item.queue.as_str());
        }
    }
}

/// The spool record decoder: arbitrary file contents never panic; every damaged stretch is
/// reported and skipped (offsets inside the file, in order, never overlapping a record), and
/// every record it returns encodes back to bytes that decode to the same record.
pub fn spool_record(data: &[u8]) {
    let (records, damage) = record::decode_all(data);
    let mut last_end = 0;
    for d in &damage {
        assert!(d.at >= last_end && d.skipped > 0 && d.at + d.skipped <= data.len());
        last_end = d.at + d.skipped;
    }
    let mut again = Vec::new();
    for r in &records {
        record::encode(&r.key, &r.item, &mut again);
    }
    let (back, no_damage) = record::decode_all(&again);
    assert!(no_damage.is_empty());
    assert_eq!(back, records);
    // Reading in steps (as replay does) finds the same records.
    let (mut stepped, mut at) = (Vec::new(), 0);
    loop {
        let (some, _, next) = record::decode_some(data, at, 3);
        assert!(next >= at && next <= data.len());
        let got = some.len();
        stepped.extend(some);
        if next == data.len() || got == 0 {
            break;
        }
        at = next;
    }
    assert_eq!(stepped, records);
}

/// The segment frame decoder (the `frames` column): arbitrary bytes never panic; a segment of
/// the items layout that decodes is exactly the encoding of what it decoded to (that layout is
/// canonical), one of the framed layout encodes back to the same frames (its runs may be cut
/// differently), and its stored records of a range hold exactly the range's frames.
pub fn segment_frames(data: &[u8]) {
    let Ok(decoded) = frames::decode(data) else {
        return;
    };
    let items: Vec<Item> = decoded
        .iter()
        .map(|f| Item {
            message_id: f.id,
            transaction_id: f.transaction_id.to_string(),
            payload: f.payload.into(),
            producer_sub: f.producer_sub.map(str::to_string),
            trace_id: f.trace_id.map(str::to_string),
            arrived_at_micros: f.created_at_micros,
        })
        .collect();
    if data[0] == 3 {
        // The framed layout: the frames come back the same, and the stored records of any
        // range hold exactly its frames.
        let again = frames::encode(items.iter());
        let redecoded = frames::decode(&again).expect("own segment decodes");
        assert_eq!(
            redecoded, decoded,
            "decode, encode, decode gives the same frames"
        );
        let n = decoded.len() as i64;
        for (from, to) in [(0, n), (1, n), (0, n - 1), (n / 2, n / 2 + 1)] {
            let mut records = Vec::new();
            assert!(
                frames::stored_records(data, 0, from, to, &[1], &mut records)
                    .expect("decoded above")
            );
            let count: i64 = records.iter().map(|r| i64::from(r.count)).sum();
            let want = (from.max(0)..to.min(n)).filter(|o| *o != 1).count() as i64;
            assert_eq!(count, want, "records of {from}..{to}");
        }
        return;
    }
    let mut again = vec![data[0]];
    for item in &items {
        assert_eq!(codec::item_len(item), {
            let mut one = Vec::new();
            codec::put_item(&mut one, item);
            one.len()
        });
        codec::put_item(&mut again, item);
    }
    assert_eq!(again, data, "decode then encode gives the same bytes");
    if data[0] == 1 {
        assert_eq!(frames::encode_items(items.iter()), data);
    }
}

/// A Kafka request frame (what follows the size prefix; src/kafka/conn.rs): arbitrary bytes
/// never panic and never make the decoder reserve room for counts the frame does not hold (the
/// patched kafka-protocol, vendor/README.md; libFuzzer fails an allocation over its 2 GB
/// limit). A Produce's record batches go through the broker's own decoding, which stays
/// within its budgets: records and decompressed bytes.
pub fn kafka_request(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let Ok(key) = ApiKey::try_from(i16::from_be_bytes([data[0], data[1]])) else {
        return;
    };
    let version = i16::from_be_bytes([data[2], data[3]]);
    let range = key.valid_versions();
    if !(range.min..=range.max).contains(&version) {
        return;
    }
    let mut body = Bytes::copy_from_slice(data);
    if RequestHeader::decode(&mut body, key.request_header_version(version)).is_err() {
        return;
    }
    let Ok(request) = RequestKind::decode(key, &mut body, version) else {
        return;
    };
    if let RequestKind::Produce(produce) = request {
        const RECORDS: usize = 1000;
        const INFLATED: usize = 1 << 20;
        for topic in produce.topic_data {
            for partition in topic.partition_data {
                let limits = Limits {
                    inflated: Budget::new(INFLATED),
                    records: std::cell::Cell::new(RECORDS),
                };
                if let Ok(items) = items_of(partition.records, &limits, Some("fuzz")) {
                    assert!(
                        items.len() <= RECORDS,
                        "{} records past the budget",
                        items.len()
                    );
                }
            }
        }
    }
}

//! Property tests of the bytes the broker stores: any item encodes and decodes back to itself
//! (codec and spool record), several records in a file decode in order, and no input, however
//! damaged, makes a decoder panic (it reports damage instead). The stable-toolchain stand-in
//! for fuzzing these decoders (`proptest` generates and shrinks the inputs).

use broker_actors::codec::{self, Reader};
use broker_actors::spool::record::{self, Record};
use broker_actors::{Item, PartitionKey};
use proptest::prelude::*;
use uuid::Uuid;

fn name() -> impl Strategy<Value = String> {
    proptest::collection::vec(any::<char>(), 0..=255).prop_map(|c| c.into_iter().collect())
}

fn item() -> impl Strategy<Value = Item> {
    (
        any::<u128>(),
        any::<i64>(),
        name(),
        proptest::option::of(name()),
        proptest::option::of(name()),
        ".{0,2000}",
    )
        .prop_map(|(id, at, txn, sub, trace, payload)| Item {
            message_id: Uuid::from_u128(id),
            transaction_id: txn,
            payload: payload.into(),
            producer_sub: sub,
            trace_id: trace,
            arrived_at_micros: at,
        })
}

fn record() -> impl Strategy<Value = Record> {
    (
        name().prop_filter("queue", |q| !q.is_empty()),
        name(),
        item(),
    )
        .prop_map(|(q, p, item)| Record {
            key: PartitionKey::new(&q, &p),
            item,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn an_item_round_trips(item in item()) {
        let mut out = Vec::new();
        codec::put_item(&mut out, &item);
        prop_assert_eq!(out.len(), codec::item_len(&item));
        let mut r = Reader::new(&out);
        prop_assert_eq!(r.item().unwrap().to_item(), item);
        prop_assert!(r.is_done());
    }

    #[test]
    fn records_round_trip_in_order(records in proptest::collection::vec(record(), 0..20)) {
        let mut file = Vec::new();
        for r in &records {
            record::encode(&r.key, &r.item, &mut file);
        }
        let (read, damage) = record::decode_all(&file);
        prop_assert!(damage.is_empty());
        prop_assert_eq!(read, records);
    }

    #[test]
    fn damaged_files_are_reported_never_a_panic(
        records in proptest::collection::vec(record(), 1..6),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        cut in any::<usize>(),
    ) {
        let mut file = Vec::new();
        for r in &records {
            record::encode(&r.key, &r.item, &mut file);
        }
        for (at, byte) in flips {
            let i = at % file.len();
            file[i] ^= byte;
        }
        file.truncate(cut % (file.len() + 1));
        let (read, _) = record::decode_all(&file);
        // Whatever survives is one of the records written (the checksum guards the rest).
        for r in read {
            prop_assert!(records.contains(&r));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_a_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = record::decode_all(&bytes);
        let mut r = Reader::new(&bytes);
        while !r.is_done() && r.item().is_ok() {}
    }
}

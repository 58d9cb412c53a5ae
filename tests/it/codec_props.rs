//! Property tests of the segment frames stored in PostgreSQL (`storage::segments::frames`): any list of
//! items encodes and decodes back, and arbitrary or damaged bytes give an error, never a panic.
//! No database is needed; they live here because the frames belong to the broker crate.

use broker_actors::Item;
use proptest::prelude::*;
use queen_broker::storage::segments::frames;
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
        ".{0,1000}",
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn frames_round_trip(items in proptest::collection::vec(item(), 0..30)) {
        let bytes = frames::encode(items.iter());
        let decoded = frames::decode(&bytes).unwrap();
        prop_assert_eq!(decoded.len(), items.len());
        for (frame, item) in decoded.iter().zip(&items) {
            prop_assert_eq!(frame.id, item.message_id);
            prop_assert_eq!(frame.created_at_micros, item.arrived_at_micros);
            prop_assert_eq!(frame.transaction_id, item.transaction_id.as_str());
            prop_assert_eq!(frame.producer_sub, item.producer_sub.as_deref());
            prop_assert_eq!(frame.trace_id, item.trace_id.as_deref());
            prop_assert_eq!(frame.payload, &*item.payload);
        }
    }

    #[test]
    fn damaged_frames_are_an_error_never_a_panic(
        items in proptest::collection::vec(item(), 1..5),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
    ) {
        let mut bytes = frames::encode(items.iter());
        for (at, byte) in flips {
            let i = at % bytes.len();
            bytes[i] ^= byte;
        }
        bytes.truncate(cut % (bytes.len() + 1));
        let _ = frames::decode(&bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_frame_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = frames::decode(&bytes);
    }
}

//! The data every scenario sends: a small PRNG, ~256-byte incompressible payloads, unique
//! transaction ids and partition names. The broker runs and the SQL baselines draw from the same
//! generators, so both store byte-for-byte comparable messages.

use broker_actors::Item;
use uuid::Uuid;

/// Characters of one payload (inside its JSON quotes).
pub const PAYLOAD_CHARS: usize = 256;

/// The queue every scenario writes to.
pub const QUEUE: &str = "bench";

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// splitmix64: fast, good enough for test data, and needs no dependency.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// A seed that differs between runs and measurements.
pub fn fresh_seed() -> u64 {
    let (hi, lo) = Uuid::new_v4().as_u64_pair();
    hi ^ lo
}

/// Appends one payload: a JSON string of [`PAYLOAD_CHARS`] random base64 characters. Every
/// character carries 6 random bits, so neither pglz (TOAST) nor gzip finds anything to shrink
/// beyond the alphabet's 6/8.
pub fn push_payload(out: &mut String, rng: &mut Rng) {
    out.reserve(PAYLOAD_CHARS + 2);
    out.push('"');
    let mut word = 0u64;
    let mut bits = 0;
    for _ in 0..PAYLOAD_CHARS {
        if bits < 6 {
            word = rng.next_u64();
            bits = 64;
        }
        out.push(ALPHABET[(word & 63) as usize] as char);
        word >>= 6;
        bits -= 6;
    }
    out.push('"');
}

/// One payload as an owned string.
pub fn payload(rng: &mut Rng) -> String {
    let mut s = String::with_capacity(PAYLOAD_CHARS + 2);
    push_payload(&mut s, rng);
    s
}

/// A unique transaction id (34 characters): measurement tag, connection, sequence number.
pub fn transaction_id(tag: u64, conn: usize, seq: u64) -> String {
    format!("{:016x}-{:04x}-{:012x}", tag, conn as u16, seq)
}

/// The name of partition `n`.
pub fn partition_name(n: u64) -> String {
    format!("p{n:05}")
}

/// Appends one push item as JSON.
pub fn push_item_json(out: &mut String, partition: &str, txn: &str, rng: &mut Rng) {
    out.push_str("{\"queue\":\"");
    out.push_str(QUEUE);
    out.push_str("\",\"partition\":\"");
    out.push_str(partition);
    out.push_str("\",\"transactionId\":\"");
    out.push_str(txn);
    out.push_str("\",\"payload\":");
    push_payload(out, rng);
    out.push('}');
}

/// Rewrites `body` as one push request of `batch` items to `partition`; transaction ids are
/// `transaction_id(tag, conn, seq)` with `seq` counting on across calls.
pub fn push_body(
    body: &mut String,
    partition: &str,
    batch: usize,
    (tag, conn): (u64, usize),
    seq: &mut u64,
    rng: &mut Rng,
) {
    body.clear();
    body.push_str("{\"items\":[");
    for k in 0..batch {
        if k > 0 {
            body.push(',');
        }
        let txn = transaction_id(tag, conn, *seq);
        *seq += 1;
        push_item_json(body, partition, &txn, rng);
    }
    body.push_str("]}");
}

/// A write-path item as the broker would mint it for a pushed message (for the SQL baseline).
pub fn broker_item(txn: String, rng: &mut Rng) -> Item {
    Item {
        message_id: Uuid::now_v7(),
        transaction_id: txn,
        payload: payload(rng).into_boxed_str(),
        producer_sub: None,
        trace_id: None,
        arrived_at_micros: chrono::Utc::now().timestamp_micros(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_json_strings_of_the_right_size() {
        let mut rng = Rng::new(1);
        let p = payload(&mut rng);
        assert_eq!(p.len(), PAYLOAD_CHARS + 2);
        let v: serde_json::Value = serde_json::from_str(&p).expect("valid JSON");
        assert!(v.is_string());
        assert_ne!(p, payload(&mut rng));
    }

    #[test]
    fn push_items_are_valid_json() {
        let mut rng = Rng::new(2);
        let mut s = String::new();
        push_item_json(
            &mut s,
            &partition_name(7),
            &transaction_id(1, 2, 3),
            &mut rng,
        );
        let v: serde_json::Value = serde_json::from_str(&s).expect("valid JSON");
        assert_eq!(v["partition"], "p00007");
        assert_eq!(v["transactionId"].as_str().map(str::len), Some(34));
    }
}

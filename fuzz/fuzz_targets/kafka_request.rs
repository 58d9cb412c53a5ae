//! A Kafka request frame (src/kafka/conn.rs): arbitrary bytes never panic, never make the
//! decoder reserve room for counts the frame does not hold, and a Produce's record batches stay
//! within the broker's budgets.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::kafka_request(data));

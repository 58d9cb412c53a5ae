//! The ack bodies (`/ack`, `/ack/batch`, parsed as their routes parse them) and the
//! `/transaction` body: arbitrary bytes never panic, and whatever is accepted holds no value
//! PostgreSQL would refuse (a NUL) and no name over 255 characters.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::ack_transaction_body(data));

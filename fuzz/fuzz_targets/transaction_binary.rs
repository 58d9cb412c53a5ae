//! The `QTB1` parser (`POST /api/v1/transaction` with `application/x-queen-push`): arbitrary
//! bytes never panic; an accepted plan holds what a JSON one holds, with the groups' pushes
//! numbered after the head's operations.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::transaction_binary(data));

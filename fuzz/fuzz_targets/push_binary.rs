//! The `QPB1` decoder (`POST /api/v1/push` with `application/x-queen-push`): arbitrary bytes
//! never panic and never inflate past the budget; an accepted body's items keep the JSON
//! body's rules, and encoding them again decodes to the same items.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::push_binary(data));

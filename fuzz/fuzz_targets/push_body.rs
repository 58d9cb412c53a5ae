//! The push body parser (`POST /api/v1/push`): arbitrary bytes never panic; an accepted body's
//! items obey the validation rules, the admission count agrees with the parser, and the minted
//! items survive the spool record and segment frame encodings unchanged.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::push_body(data));

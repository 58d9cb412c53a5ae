//! The spool record decoder: arbitrary file contents never panic; every damaged stretch is
//! reported and skipped (offsets inside the file, in order, never overlapping a record), and
//! every record it returns encodes back to bytes that decode to the same record.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::spool_record(data));

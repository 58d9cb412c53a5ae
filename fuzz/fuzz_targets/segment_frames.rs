//! The segment frame decoder (the `frames` column): arbitrary bytes never panic, and a segment
//! that decodes is exactly the encoding of what it decoded to (the format is canonical).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::segment_frames(data));

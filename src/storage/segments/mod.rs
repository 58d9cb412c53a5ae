//! Segments as stored and read: the frame encoding of a segment's messages, the segment cache pops
//! read through (with the transaction ids of the ranges it leased out), and payload encryption
//! at rest (no SQL in `frames`, `crypto` and `lease_txns`).

pub mod cache;
pub mod crypto;
pub mod frames;
pub mod key_check;
pub mod lease_txns;

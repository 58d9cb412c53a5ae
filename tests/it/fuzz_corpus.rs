//! The fuzz targets' checks (fuzz/checks.rs) on the committed corpus (fuzz/corpus/<target>/):
//! every input a fuzzing run kept, re-checked by the default `cargo test` on stable. Fuzzing
//! itself needs nightly and cargo-fuzz (docs/operations.md, "Fuzzing").

#[path = "../../fuzz/checks.rs"]
mod checks;

use std::path::Path;

fn corpus(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut inputs = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok(),
            "{target}: {} fails its check",
            path.display()
        );
        inputs += 1;
    }
    assert!(inputs > 0, "{target}: the corpus is empty");
}

#[test]
fn push_body_corpus() {
    corpus("push_body", checks::push_body);
}

#[test]
fn ack_transaction_body_corpus() {
    corpus("ack_transaction_body", checks::ack_transaction_body);
}

#[test]
fn spool_record_corpus() {
    corpus("spool_record", checks::spool_record);
}

#[test]
fn segment_frames_corpus() {
    corpus("segment_frames", checks::segment_frames);
}

#[test]
fn push_binary_corpus() {
    corpus("push_binary", checks::push_binary);
}

#[test]
fn transaction_binary_corpus() {
    corpus("transaction_binary", checks::transaction_binary);
}

#[test]
fn kafka_request_corpus() {
    corpus("kafka_request", checks::kafka_request);
}

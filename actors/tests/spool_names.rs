//! Spool files replay in name order, oldest first, and a name carries the wall-clock time the
//! file was made at. A file made after the wall clock stepped back (NTP, an operator; the chaos
//! run's clock fault) must still sort after the files before it, or replay hands a partition's
//! later records to PostgreSQL before its earlier ones (the mixed chaos run's long form found
//! one message out of order that way).

#[allow(dead_code)] // support is shared with write_path, which uses all of it
mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use broker_actors::spool::record::{self, Record};
use broker_actors::spool::{list_files, SpoolActor, SpoolHandle, SpoolState};
use broker_actors::PartitionKey;
use support::item;
use uuid::Uuid;

#[actix::test]
async fn a_spool_file_made_after_the_clock_stepped_back_sorts_after_the_older_ones() {
    let dir = std::env::temp_dir().join(format!("actors-spool-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = PartitionKey::new("q", "p");
    // A file left by a run whose clock was an hour ahead: this machine's clock has since
    // stepped an hour back.
    let ahead = (SystemTime::now() + Duration::from_secs(3600))
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let older = dir.join(format!("spool-{ahead:020}-000001.qspool"));
    let mut bytes = Vec::new();
    record::encode(&key, &item("a"), &mut bytes);
    std::fs::write(&older, &bytes).unwrap();

    let state = Arc::new(SpoolState::default());
    let actor = SpoolActor::open(&dir, state.clone()).unwrap().start();
    let handle = SpoolHandle {
        actor,
        state: state.clone(),
    };
    state.reserve(&key, 1);
    handle
        .append(vec![Record {
            key: key.clone(),
            item: item("b"),
        }])
        .await
        .unwrap();
    let files = list_files(&dir).unwrap();
    assert_eq!(files.len(), 2, "{files:?}");
    assert_eq!(files[0], older, "the older file replays first: {files:?}");
    // And the records come back in acceptance order.
    let replayed: Vec<String> = files
        .iter()
        .flat_map(|f| record::decode_all(&std::fs::read(f).unwrap()).0)
        .map(|r| r.item.transaction_id.to_string())
        .collect();
    assert_eq!(replayed, ["a", "b"]);
    let _ = std::fs::remove_dir_all(&dir);
}

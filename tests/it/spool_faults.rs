//! The spool under faults an operator meets: a record PostgreSQL refuses (here a queue name
//! with a NUL character, as accepted by earlier versions) is quarantined and holds back
//! nothing; a full spool disk does not stop the broker from starting and replaying.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use broker_actors::spool::record;
use broker_actors::{Item, PartitionKey};
use serde_json::Value;
use uuid::Uuid;

use crate::support::{eventually, fresh_db, spawn_app_with, test_settings};

fn item(payload: &str) -> Item {
    Item {
        message_id: Uuid::now_v7(),
        transaction_id: format!("t-{payload}"),
        payload: format!("{{\"v\":\"{payload}\"}}").into(),
        producer_sub: None,
        trace_id: None,
        arrived_at_micros: 1_700_000_000_000_000,
    }
}

/// Writes a spool file as an earlier run would have left it.
fn write_spool(dir: &Path, name: &str, records: &[(PartitionKey, Item)]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut bytes = Vec::new();
    for (key, item) in records {
        record::encode(key, item, &mut bytes);
    }
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn payloads(stored: &[crate::support::Stored]) -> Vec<String> {
    stored
        .iter()
        .map(|s| {
            let v: Value = serde_json::from_str(&s.payload).unwrap();
            v["v"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

#[actix_web::test]
async fn a_record_postgresql_refuses_is_quarantined_and_the_others_are_replayed() {
    let db = fresh_db().await;
    let settings = test_settings(&db, &[]);
    let dir = settings.file_buffer_dir.clone();
    let (q, bad, q2) = (
        PartitionKey::new("q", "p"),
        PartitionKey::new("bad\0queue", "p"),
        PartitionKey::new("q2", "Default"),
    );
    let poisoned = item("poison");
    write_spool(
        &dir,
        "spool-00000000000000000001-000001.qspool",
        &[
            (q.clone(), item("a")),
            (bad.clone(), poisoned.clone()),
            (q.clone(), item("b")),
            (q2.clone(), item("c")),
        ],
    );
    let app = spawn_app_with(settings).await;
    eventually(
        Duration::from_secs(30),
        "the spool drains past the refused record",
        || async { (app.broker.state.spool.state.records() == 0).then_some(()) },
    )
    .await;
    assert_eq!(
        payloads(&db.stored("q", "p").await),
        ["a", "b"],
        "order kept, nothing lost"
    );
    assert_eq!(payloads(&db.stored("q2", "Default").await), ["c"]);
    assert!(app.spool_files().is_empty());

    let listed = app.get("/api/v1/system/quarantine").await;
    assert_eq!(listed.status, 200, "{:?}", listed.body);
    assert_eq!(listed.body["count"], 1);
    let entry = &listed.body["records"][0];
    assert_eq!(entry["messageId"], poisoned.message_id.to_string());
    assert_eq!(entry["queue"], "bad\u{0}queue");
    assert_eq!(entry["transactionId"], "t-poison");
    assert!(entry["error"].as_str().unwrap().contains("0x00"), "{entry}");
    let (_, metrics) = app.get_text("/metrics/prometheus").await;
    assert!(
        metrics.contains("queen_spool_quarantined_records 1"),
        "{metrics}"
    );

    // New pushes to the partitions flow live again.
    let reply = app
        .push(serde_json::json!([{"queue": "q", "partition": "p", "payload": {"v": "d"}}]))
        .await;
    assert_eq!(reply.body[0]["status"], "queued", "{:?}", reply.body);
    assert_eq!(payloads(&db.stored("q", "p").await), ["a", "b", "d"]);
}

/// A small tmpfs, unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(kib: usize) -> Option<Self> {
        let dir = std::env::temp_dir().join(format!("queen-full-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(Self(dir))
    }

    /// Writes a file until the disk refuses more.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).and_then(|()| f.sync_data()).is_ok() {}
        // A last byte-sized write may still fit; make sure nothing does.
        while f.write_all(&[0]).and_then(|()| f.sync_data()).is_ok() {}
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[actix_web::test]
async fn a_full_spool_disk_does_not_stop_the_start_and_replay_frees_it() {
    let Some(disk) = SmallDisk::mount(256) else {
        eprintln!("SKIPPED: mounting a tmpfs needs root (CI runs as root)");
        return;
    };
    let db = fresh_db().await;
    let mut settings = test_settings(&db, &[]);
    let dir = disk.0.join("spool");
    settings.file_buffer_dir = dir.clone();
    let key = PartitionKey::new("full", "p");
    let records: Vec<(PartitionKey, Item)> = (0..200)
        .map(|i| (key.clone(), item(&format!("m{i}"))))
        .collect();
    write_spool(&dir, "spool-00000000000000000002-000001.qspool", &records);
    // An empty file, as a failed append on a fresh file leaves.
    std::fs::write(dir.join("spool-00000000000000000001-000001.qspool"), b"").unwrap();
    disk.fill();
    assert!(
        std::fs::write(dir.join("probe"), b"x").is_err(),
        "the disk is full"
    );

    let app = spawn_app_with(settings).await; // refused to start before: "No space left on device"
    eventually(Duration::from_secs(30), "the spool drains", || async {
        (app.broker.state.spool.state.records() == 0).then_some(())
    })
    .await;
    let stored = payloads(&db.stored("full", "p").await);
    assert_eq!(stored.len(), 200);
    assert_eq!(stored[0], "m0");
    assert_eq!(stored[199], "m199");
    eventually(
        Duration::from_secs(10),
        "replayed and empty files are removed",
        || async { app.spool_files().is_empty().then_some(()) },
    )
    .await;
    let health: Value = app.get("/health").await.body;
    assert_eq!(health["status"], "healthy", "{health}");
    drop(app);
}

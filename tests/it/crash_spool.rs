//! Crashes: a broker killed with SIGKILL while items sit in its spool delivers every item it
//! answered `buffered` exactly once and in order after a restart; a spool file with a torn or
//! corrupt record still replays its good records.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::{eventually, fresh_db, spawn_app_with, test_settings};
use broker_actors::spool::record;
use broker_actors::{Item, PartitionKey};
use serde_json::json;
use uuid::Uuid;

const BROKER: &str = env!("CARGO_BIN_EXE_queen-broker");

fn start_broker(db_url: &str, port: u16, spool: &std::path::Path) -> Child {
    Command::new(BROKER)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("QUEEN_CONFIG", "")
        .env("DATABASE_URL", db_url)
        .env("PORT", port.to_string())
        .env("HOST", "127.0.0.1")
        .env("FILE_BUFFER_DIR", spool)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("broker starts")
}

async fn wait_healthy(client: &awc::Client, base: &str) {
    let url = format!("{base}/health");
    eventually(Duration::from_secs(30), "the broker is healthy", || {
        let request = client.get(&url).send();
        async move {
            request
                .await
                .is_ok_and(|r| r.status().as_u16() == 200)
                .then_some(())
        }
    })
    .await;
}

async fn post(
    client: &awc::Client,
    url: String,
    body: serde_json::Value,
) -> Option<(u16, serde_json::Value)> {
    let mut res = client.post(url).send_json(&body).await.ok()?;
    let body = res.json::<serde_json::Value>().await.ok()?;
    Some((res.status().as_u16(), body))
}

#[actix_web::test]
async fn sigkill_mid_load_loses_nothing_that_was_answered_buffered() {
    let db = fresh_db().await;
    let spool = std::env::temp_dir().join(format!("queen-crash-{}", Uuid::new_v4().simple()));
    let port = queen_broker::pg::free_port().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(10))
        .finish();
    let mut broker = start_broker(&db.url, port, &spool);
    wait_healthy(&client, &base).await;
    let (status, _) = post(
        &client,
        format!("{base}/api/v1/system/maintenance"),
        json!({ "enabled": true }),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);

    // Two producers push one item per request, in sequence; the broker dies mid-load.
    let answers: [AtomicUsize; 2] = Default::default();
    let producer = |p: usize| {
        let (client, url) = (client.clone(), format!("{base}/api/v1/push"));
        let answers = &answers[p];
        async move {
            let mut answered = Vec::new();
            for n in 0..400 {
                let item = json!({ "queue": "crash", "partition": format!("p{p}"), "payload": n, "transactionId": format!("p{p}-{n}") });
                match post(&client, url.clone(), json!({ "items": [item] })).await {
                    Some((201, body)) => {
                        assert_eq!(body[0]["status"], "buffered");
                        answered.push(n);
                        answers.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => break, // the broker is gone
                }
            }
            answered
        }
    };
    let killer = async {
        // Mid-load: both producers have had answers, and keep pushing.
        let answers = &answers;
        eventually(
            Duration::from_secs(30),
            "both producers have answers",
            move || async move {
                answers
                    .iter()
                    .all(|a| a.load(Ordering::SeqCst) >= 25)
                    .then_some(())
            },
        )
        .await;
        broker.kill().unwrap(); // SIGKILL
        broker.wait().unwrap();
    };
    let (a, b, ()) = futures_util::join!(producer(0), producer(1), killer);
    assert!(
        !a.is_empty() && !b.is_empty(),
        "both producers got answers before the kill"
    );
    assert!(
        !broker_actors::spool::list_files(&spool).unwrap().is_empty(),
        "the spool holds the items"
    );

    let mut broker = start_broker(&db.url, port, &spool);
    wait_healthy(&client, &base).await;
    let (status, _) = post(
        &client,
        format!("{base}/api/v1/system/maintenance"),
        json!({ "enabled": false }),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    let url = format!("{base}/api/v1/system/maintenance");
    eventually(Duration::from_secs(60), "the spool drains", || {
        let request = client.get(&url).send();
        async move {
            let body: serde_json::Value = request.await.unwrap().json().await.unwrap();
            (body["bufferedMessages"] == 0).then_some(())
        }
    })
    .await;
    broker.kill().unwrap();
    broker.wait().unwrap();

    for (p, answered) in [a, b].iter().enumerate() {
        let stored: Vec<i64> = db
            .stored("crash", &format!("p{p}"))
            .await
            .iter()
            .map(|s| s.payload.parse().unwrap())
            .collect();
        // Everything answered is there once and in order; an item in flight at the kill may be
        // there too (it was durable, its answer was lost), but nothing twice.
        assert!(
            stored.len() >= answered.len(),
            "p{p}: {} stored < {} answered",
            stored.len(),
            answered.len()
        );
        assert!(stored.len() <= answered.len() + 1);
        assert_eq!(
            stored,
            (0..stored.len() as i64).collect::<Vec<_>>(),
            "p{p} in order, once each"
        );
    }
    let _ = std::fs::remove_dir_all(spool);
}

fn spooled(n: usize) -> (PartitionKey, Item) {
    let item = Item {
        message_id: Uuid::now_v7(),
        transaction_id: format!("good-{n}"),
        payload: format!(r#"{{"n":{n}}}"#).into(),
        producer_sub: Some("svc-writer".into()),
        trace_id: None,
        arrived_at_micros: 1_700_000_000_000_000,
    };
    (PartitionKey::new("torn", "Default"), item)
}

#[actix_web::test]
async fn a_torn_tail_and_a_corrupt_record_are_skipped_and_the_good_records_replay() {
    let db = fresh_db().await;
    let settings = test_settings(&db, &[]);
    let dir = settings.file_buffer_dir.clone();
    std::fs::create_dir_all(&dir).unwrap();

    // File 1: four good records, the third damaged in place.
    let mut bytes = Vec::new();
    let mut third_at = 0;
    for n in 0..4 {
        if n == 2 {
            third_at = bytes.len();
        }
        let (key, item) = spooled(n);
        record::encode(&key, &item, &mut bytes);
    }
    bytes[third_at + 30] ^= 0x55;
    std::fs::write(dir.join("spool-00000000000000000001-000001.qspool"), &bytes).unwrap();
    // File 2: two good records and a torn tail (half of a third).
    let mut bytes = Vec::new();
    for n in 4..7 {
        let (key, item) = spooled(n);
        record::encode(&key, &item, &mut bytes);
    }
    bytes.truncate(bytes.len() - 10);
    std::fs::write(dir.join("spool-00000000000000000002-000001.qspool"), &bytes).unwrap();

    let app = spawn_app_with(settings).await;
    app.drained().await;
    let stored = db.stored("torn", "Default").await;
    let keys: Vec<&str> = stored.iter().map(|s| s.transaction_id.as_str()).collect();
    assert_eq!(keys, ["good-0", "good-1", "good-3", "good-4", "good-5"]);
    assert!(
        stored
            .iter()
            .all(|s| s.producer_sub.as_deref() == Some("svc-writer")),
        "producerSub survives the spool"
    );
    assert!(app.spool_files().is_empty());
}

#[actix_web::test]
async fn replay_resumes_after_the_watermark_of_an_earlier_run() {
    let db = fresh_db().await;
    let settings = test_settings(&db, &[]);
    let dir = settings.file_buffer_dir.clone();
    std::fs::create_dir_all(&dir).unwrap();
    let mut bytes = Vec::new();
    for n in 0..5 {
        let (key, item) = spooled(n);
        record::encode(&key, &item, &mut bytes);
    }
    let file = dir.join("spool-00000000000000000001-000001.qspool");
    std::fs::write(&file, &bytes).unwrap();
    // An earlier run committed the first two records and recorded that, then died.
    std::fs::write(broker_actors::spool::done_path(&file), 2u64.to_le_bytes()).unwrap();

    let app = spawn_app_with(settings).await;
    app.drained().await;
    let keys: Vec<String> = db
        .stored("torn", "Default")
        .await
        .into_iter()
        .map(|s| s.transaction_id)
        .collect();
    assert_eq!(keys, ["good-2", "good-3", "good-4"]);
    assert!(app.spool_files().is_empty());
}

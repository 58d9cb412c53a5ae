//! Deduplication rules (producing.md "transactionId and deduplication").

use crate::support::{fresh_db, spawn_app};
use serde_json::json;

#[actix_web::test]
async fn first_wins_inside_one_body_and_both_name_the_first_id() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app
        .push(json!([
            { "queue": "d", "payload": "first", "transactionId": "k" },
            { "queue": "d", "payload": "second", "transactionId": "k" },
        ]))
        .await;
    let r = reply.body.as_array().unwrap();
    assert_eq!(r[0]["status"], "queued");
    assert_eq!(r[1]["status"], "duplicate");
    assert_eq!(r[0]["message_id"], r[1]["message_id"]);
    let stored = db.stored("d", "Default").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].payload, r#""first""#);
}

#[actix_web::test]
async fn a_later_duplicate_writes_nothing_and_names_the_original() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let first = app
        .push(json!([{ "queue": "d", "payload": 1, "transactionId": "order-1" }]))
        .await;
    let again = app
        .push(json!([
            { "queue": "d", "payload": 2, "transactionId": "order-2" },
            { "queue": "d", "payload": 1, "transactionId": "order-1" },
        ]))
        .await;
    assert_eq!(again.body[0]["status"], "queued");
    assert_eq!(again.body[1]["status"], "duplicate");
    assert_eq!(again.body[1]["message_id"], first.body[0]["message_id"]);
    let stored = db.stored("d", "Default").await;
    assert_eq!(
        stored.iter().map(|s| s.offset).collect::<Vec<_>>(),
        vec![0, 1],
        "no gap for the duplicate"
    );
}

#[actix_web::test]
async fn the_scope_is_one_partition() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app
        .push(json!([
            { "queue": "d", "partition": "a", "payload": 1, "transactionId": "k" },
            { "queue": "d", "partition": "b", "payload": 1, "transactionId": "k" },
        ]))
        .await;
    assert_eq!(reply.body[0]["status"], "queued");
    assert_eq!(reply.body[1]["status"], "queued");
}

#[actix_web::test]
async fn window_zero_turns_dedup_off_and_writes_no_sidecar_rows() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    app.push(json!([{ "queue": "off", "payload": 0 }])).await;
    db.exec("UPDATE queen.queues SET dedup_window_seconds = 0 WHERE name = 'off'")
        .await;
    db.exec("DELETE FROM queen.dedup_keys").await;
    let reply = app
        .push(json!([
            { "queue": "off", "payload": 1, "transactionId": "k" },
            { "queue": "off", "payload": 2, "transactionId": "k" },
        ]))
        .await;
    assert_eq!(reply.body[0]["status"], "queued");
    assert_eq!(reply.body[1]["status"], "queued");
    let mut conn = db.conn().await;
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM queen.dedup_keys")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys, 0);
}

#[actix_web::test]
async fn a_key_reused_after_the_window_is_a_new_message() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    app.push(json!([{ "queue": "w", "payload": 1, "transactionId": "k" }]))
        .await;
    db.exec("UPDATE queen.queues SET dedup_window_seconds = 60 WHERE name = 'w'")
        .await;
    let inside = app
        .push(json!([{ "queue": "w", "payload": 2, "transactionId": "k" }]))
        .await;
    assert_eq!(inside.body[0]["status"], "duplicate");
    // Age the original's sidecar row past the window.
    db.exec("UPDATE queen.dedup_keys SET created_at = created_at - interval '61 seconds'")
        .await;
    let after = app
        .push(json!([{ "queue": "w", "payload": 3, "transactionId": "k" }]))
        .await;
    assert_eq!(after.body[0]["status"], "queued");
    assert_eq!(db.stored("w", "Default").await.len(), 2);
}

#[actix_web::test]
async fn the_sweep_removes_only_expired_sidecar_rows() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    app.push(json!([{ "queue": "s", "payload": 1, "transactionId": "old" }, { "queue": "s", "payload": 2, "transactionId": "new" }])).await;
    db.exec("UPDATE queen.dedup_keys SET created_at = created_at - interval '2 hours' WHERE msg_offset = 0").await;
    let mut conn = db.conn().await;
    let swept = queen_broker::storage::push::dedup::sweep_expired(&mut conn, 100)
        .await
        .unwrap();
    assert_eq!(swept, 1);
    let left: Vec<i64> = sqlx::query_scalar("SELECT msg_offset FROM queen.dedup_keys")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, vec![1]);
}

#[actix_web::test]
async fn a_duplicate_of_a_removed_segment_names_the_zero_uuid() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    app.push(json!([{ "queue": "r", "payload": 1, "transactionId": "gone" }]))
        .await;
    db.exec("DELETE FROM queen.segments").await;
    let reply = app
        .push(json!([{ "queue": "r", "payload": 1, "transactionId": "gone" }]))
        .await;
    assert_eq!(reply.body[0]["status"], "duplicate");
    assert_eq!(
        reply.body[0]["message_id"],
        "00000000-0000-0000-0000-000000000000"
    );
}

/// The sidecar hash of `key` as it was before migration 0007: unkeyed XXH3-64, which anyone
/// can compute (and craft collisions for).
fn unkeyed(key: &str) -> i64 {
    xxhash_rust::xxh3::xxh3_64(key.as_bytes()) as i64
}

#[actix_web::test]
async fn a_crafted_hash_collision_cannot_suppress_a_new_key_after_retention() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let first = app
        .push(json!([{ "queue": "c", "payload": 1, "transactionId": "key-A" }]))
        .await;
    assert_eq!(first.body[0]["status"], "queued");
    // The sidecar row of key-A carries the hash an attacker chose key-B to collide with under
    // the unkeyed hash; retention then removes key-A's segment inside the window.
    let mut conn = db.conn().await;
    sqlx::query("UPDATE queen.dedup_keys SET key_hash = $1")
        .bind(unkeyed("key-B"))
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("DELETE FROM queen.segments")
        .execute(&mut conn)
        .await
        .unwrap();
    let second = app
        .push(json!([{ "queue": "c", "payload": 2, "transactionId": "key-B" }]))
        .await;
    assert_eq!(
        second.body[0]["status"], "queued",
        "a different key is stored, not answered duplicate: {:?}",
        second.body
    );
    let stored = db.stored("c", "Default").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].transaction_id, "key-B");
    // What the sidecar holds for key-B is not what anyone can compute without the secret.
    let hash: i64 =
        sqlx::query_scalar("SELECT key_hash FROM queen.dedup_keys WHERE msg_offset = 1")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_ne!(hash, unkeyed("key-B"));
}

async fn secret(c: &mut sqlx::PgConnection) -> Vec<u8> {
    sqlx::query_scalar("SELECT secret FROM queen.dedup_secret")
        .fetch_one(c)
        .await
        .unwrap()
}

#[actix_web::test]
async fn every_database_gets_its_own_dedup_secret() {
    use sqlx::Connection;
    let db = fresh_db().await;
    let mut conn = db.conn().await;
    let ours = secret(&mut conn).await;
    assert_eq!(ours.len(), 32);
    assert_ne!(ours, vec![0u8; 32]);
    let name = format!("queen_secret_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE {name} TEMPLATE template0"))
        .execute(&mut conn)
        .await
        .unwrap();
    let url = format!("{}/{name}", db.url.rsplit_once('/').unwrap().0);
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    queen_broker::storage::MIGRATOR
        .run(&mut other)
        .await
        .unwrap();
    let theirs = secret(&mut other).await;
    other.close().await.unwrap();
    sqlx::query(&format!("DROP DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
    assert_ne!(ours, theirs, "two databases never share a secret");
}

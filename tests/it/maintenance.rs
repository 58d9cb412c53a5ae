//! Maintenance mode: every push spooled and answered `buffered`, replay paused, the state shared
//! through PostgreSQL; turning it off drains the spool.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::{eventually, fresh_db, spawn_app, test_settings};
use serde_json::json;

#[actix_web::test]
async fn maintenance_routes_have_the_protocol_shapes() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let reply = app.get("/api/v1/system/maintenance").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["maintenanceMode"], false);
    assert_eq!(reply.body["popMaintenanceMode"], false);
    assert_eq!(reply.body["bufferedMessages"], 0);
    assert_eq!(reply.body["bufferStats"]["dbHealthy"], true);

    let bad = app
        .post("/api/v1/system/maintenance", &json!({ "enabled": "yes" }))
        .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.body["error"], "enabled (boolean) is required");

    let on = app
        .post("/api/v1/system/maintenance", &json!({ "enabled": true }))
        .await;
    assert_eq!(on.status, 200);
    assert_eq!(on.body["maintenanceMode"], true);
    assert!(on.body["message"].is_string());
    let pop = app
        .post(
            "/api/v1/system/maintenance/pop",
            &json!({ "enabled": true }),
        )
        .await;
    assert_eq!(pop.body["popMaintenanceMode"], true);
    assert_eq!(
        app.get("/api/v1/system/maintenance/pop").await.body["popMaintenanceMode"],
        true
    );
    assert_eq!(
        app.get("/api/v1/system/shared-state").await.body["enabled"],
        false
    );

    let mut conn = db.conn().await;
    let stored: serde_json::Value =
        sqlx::query_scalar("SELECT value FROM queen.system_state WHERE key = 'maintenance_mode'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(stored, json!({ "enabled": true }));
}

#[actix_web::test]
async fn every_broker_on_the_database_follows_the_flag() {
    let db = fresh_db().await;
    let first = spawn_app(&db).await;
    let second = spawn_app(&db).await;
    first
        .post("/api/v1/system/maintenance", &json!({ "enabled": true }))
        .await;
    // The flag is polled from PostgreSQL every second: wait for the second broker to see it.
    let flags = &second.broker.state.spool.state;
    eventually(
        Duration::from_secs(5),
        "the second broker picks up maintenance mode",
        move || async move { flags.maintenance().then_some(()) },
    )
    .await;
    let reply = second.push(json!([{ "queue": "m", "payload": 1 }])).await;
    assert_eq!(reply.body[0]["status"], "buffered");
}

#[actix_web::test]
async fn maintenance_under_load_hides_everything_until_it_is_turned_off() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    let on = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    // Per producer: pushes answered, and pushes answered that were sent after the switch.
    let answered_total: [AtomicUsize; 3] = Default::default();
    let answered_on: [AtomicUsize; 3] = Default::default();
    let producer = |p: usize| {
        let (app, on, stop) = (&app, &on, &stop);
        let (answered_total, answered_on) = (&answered_total[p], &answered_on[p]);
        async move {
            let mut answered = 0usize;
            while !stop.load(Ordering::SeqCst) && answered < 2_000 {
                let was_on = on.load(Ordering::SeqCst);
                let item = json!({ "queue": "load", "partition": format!("p{p}"), "payload": answered, "transactionId": format!("{p}-{answered}") });
                let reply = app.push(json!([item])).await;
                assert_eq!(reply.status, 201);
                let status = reply.body[0]["status"].as_str().unwrap().to_string();
                if was_on {
                    assert_eq!(status, "buffered", "a push after maintenance was on");
                }
                assert!(status == "queued" || status == "buffered", "{status}");
                answered += 1;
                answered_total.fetch_add(1, Ordering::SeqCst);
                if was_on {
                    answered_on.fetch_add(1, Ordering::SeqCst);
                }
            }
            answered
        }
    };
    let operator = async {
        // The load is running: every producer has had pushes answered.
        each_reaches(&answered_total, 20, "pushes answered before the switch").await;
        assert_eq!(
            app.post("/api/v1/system/maintenance", &json!({ "enabled": true }))
                .await
                .status,
            200
        );
        on.store(true, Ordering::SeqCst);
        // A producer sends one push at a time: once a push sent after the switch is answered,
        // every write it started before the switch is settled. Then count what is visible.
        each_reaches(&answered_on, 1, "a push sent after the switch answered").await;
        let visible = total(&db).await;
        // While maintenance is on, each producer has 20 more pushes answered (buffered).
        each_reaches(&answered_on, 21, "pushes answered in maintenance").await;
        assert_eq!(
            total(&db).await,
            visible,
            "nothing becomes visible while maintenance is on"
        );
        assert!(app.broker.state.spool.state.records() > 0);
        stop.store(true, Ordering::SeqCst);
    };
    let (a, b, c, ()) = futures_util::join!(producer(0), producer(1), producer(2), operator);
    assert_eq!(
        app.post("/api/v1/system/maintenance", &json!({ "enabled": false }))
            .await
            .status,
        200
    );
    app.drained().await;
    for (p, answered) in [a, b, c].into_iter().enumerate() {
        let stored: Vec<usize> = db
            .stored("load", &format!("p{p}"))
            .await
            .iter()
            .map(|s| s.payload.parse().unwrap())
            .collect();
        assert_eq!(
            stored,
            (0..answered).collect::<Vec<_>>(),
            "p{p}: every item once, in order"
        );
    }
}

/// Resolves once every producer's counter has reached `n`.
async fn each_reaches(counters: &[AtomicUsize], n: usize, what: &str) {
    eventually(Duration::from_secs(30), what, move || async move {
        counters
            .iter()
            .all(|c| c.load(Ordering::SeqCst) >= n)
            .then_some(())
    })
    .await;
}

async fn total(db: &crate::support::TestDb) -> i64 {
    let mut conn = db.conn().await;
    sqlx::query_scalar("SELECT COALESCE(sum(msg_count), 0)::int8 FROM queen.segments")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

#[actix_web::test]
async fn a_failed_spool_write_in_maintenance_mode_is_a_500_with_the_verdicts() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    app.post("/api/v1/system/maintenance", &json!({ "enabled": true }))
        .await;
    std::fs::remove_dir_all(&app.spool_dir).unwrap(); // the spool can no longer open a file
    let reply = app
        .push(json!([{ "queue": "f", "payload": 1 }, { "queue": "f", "payload": 2 }]))
        .await;
    assert_eq!(reply.status, 500);
    let results = reply.body.as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|r| r["status"] == "failed"));
    assert_eq!(
        app.broker.state.spool.state.records(),
        0,
        "nothing is counted as spooled"
    );
}

#[actix_web::test]
async fn an_unusable_spool_directory_stops_the_start_naming_the_setting() {
    let db = fresh_db().await;
    let file =
        std::env::temp_dir().join(format!("queen-not-a-dir-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&file, b"x").unwrap();
    let settings = test_settings(
        &db,
        &[("FILE_BUFFER_DIR", &file.join("spool").display().to_string())],
    );
    let err = match queen_broker::app::start(settings).await {
        Ok(_) => panic!("the broker must not start without a usable spool"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("FILE_BUFFER_DIR"), "{err}");
    let _ = std::fs::remove_file(file);
}

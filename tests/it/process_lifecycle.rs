//! The broker as a real process: bad settings stop the start, SIGTERM lets in-flight commits
//! finish, and with nothing configured a private PostgreSQL is started and stopped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{eventually, fresh_db};
use serde_json::json;
use sqlx::Connection;

const BROKER: &str = env!("CARGO_BIN_EXE_queen-broker");

fn broker(env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(BROKER);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("QUEEN_CONFIG", "")
        .env("LOG_LEVEL", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("broker process starts")
}

async fn wait_ready(
    client: &awc::Client,
    base: &str,
    child: &mut Child,
    path: &str,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(res) = client.get(format!("{base}{path}")).send().await {
            if res.status().as_u16() == 200 {
                return;
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("broker exited early with {status}");
        }
        assert!(
            Instant::now() < deadline,
            "broker not ready at {base}{path}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "broker did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_port_that_is_not_a_number_stops_the_start_naming_the_variable() {
    let out = Command::new(BROKER)
        .env("PORT", "sixty")
        .env("QUEEN_CONFIG", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("PORT") && stderr.contains("sixty"),
        "{stderr}"
    );
}

#[actix_web::test]
async fn sigterm_finishes_in_flight_commits_before_exiting() {
    let db = fresh_db().await;
    let port = queen_broker::pg::free_port().unwrap();
    let spool = std::env::temp_dir().join(format!("queen-test-spool-{port}"));
    let mut child = broker(&[
        ("DATABASE_URL", db.url.clone()),
        ("PORT", port.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("FILE_BUFFER_DIR", spool.display().to_string()),
    ]);
    let base = format!("http://127.0.0.1:{port}");
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    wait_ready(
        &client,
        &base,
        &mut child,
        "/health",
        Duration::from_secs(30),
    )
    .await;
    let push = |n: i32| {
        let client = client.clone();
        let url = format!("{base}/api/v1/push");
        async move {
            let mut res = client
                .post(url)
                .send_json(&json!({ "items": [{ "queue": "g", "payload": n }] }))
                .await?;
            let body: serde_json::Value = res
                .json()
                .await
                .map_err(|e| awc::error::SendRequestError::Custom(Box::new(e), Box::new("")))?;
            Ok::<_, awc::error::SendRequestError>((res.status().as_u16(), body))
        }
    };
    assert_eq!(push(0).await.unwrap().0, 201);

    let mut locker = db.conn().await;
    let mut tx = locker.begin().await.unwrap();
    sqlx::query("SELECT id FROM queen.partitions FOR UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let in_flight = push(1);
    let stop = async {
        // The event: the broker's commit is waiting for our lock.
        let mut watcher = db.conn().await;
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = 'queen-broker' AND datname = current_database()",
            )
            .fetch_one(&mut watcher)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        sigterm(&child);
        // The event: the broker has begun its graceful stop (it no longer accepts connections).
        let addr = format!("127.0.0.1:{port}");
        eventually(
            Duration::from_secs(10),
            "the broker stops accepting",
            || {
                let connect = tokio::net::TcpStream::connect(addr.clone());
                async move { connect.await.is_err().then_some(()) }
            },
        )
        .await;
        assert!(
            child.try_wait().unwrap().is_none(),
            "the broker waits for its in-flight commit"
        );
        tx.commit().await.unwrap();
    };
    let (answered, ()) = futures_util::join!(in_flight, stop);
    let (status, body) = answered.expect("the in-flight push is answered");
    assert_eq!(status, 201);
    assert_eq!(body[0]["status"], "queued");
    let status = wait_exit(&mut child, Duration::from_secs(30));
    assert!(status.success(), "clean exit, got {status}");
    assert_eq!(db.stored("g", "Default").await.len(), 2);
    let _ = std::fs::remove_dir_all(spool);
}

#[actix_web::test]
async fn with_nothing_configured_a_private_postgresql_is_started_and_stopped() {
    let port = queen_broker::pg::free_port().unwrap();
    let nobody = queen_broker::pg::free_port().unwrap(); // nothing listens there
    let root = std::env::temp_dir().join(format!("queen-private-{port}"));
    let data = root.join("pg");
    let mut child = broker(&[
        ("PORT", port.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("QUEEN_PRIVATE_PG_DIR", data.display().to_string()),
        ("QUEEN_PRIVATE_PG_PROBE", format!("127.0.0.1:{nobody}")),
        ("FILE_BUFFER_DIR", root.join("spool").display().to_string()),
    ]);
    let base = format!("http://127.0.0.1:{port}");
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    wait_ready(
        &client,
        &base,
        &mut child,
        "/health",
        Duration::from_secs(90),
    )
    .await;
    let mut res = client
        .post(format!("{base}/api/v1/push"))
        .send_json(&json!({ "items": [{ "queue": "private", "payload": 1 }] }))
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body[0]["status"], "queued");
    assert!(
        data.join("postmaster.pid").exists(),
        "the private cluster runs in its own folder"
    );
    sigterm(&child);
    let status = wait_exit(&mut child, Duration::from_secs(60));
    assert!(status.success(), "clean exit, got {status}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("private PostgreSQL"),
        "the log says so: {stderr}"
    );
    assert!(
        !data.join("postmaster.pid").exists(),
        "the private cluster was stopped"
    );
    let _ = std::fs::remove_dir_all(root);
}

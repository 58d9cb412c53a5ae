//! TLS: HTTPS on the listener (`QUEEN_TLS_CERT_FILE`, `QUEEN_TLS_KEY_FILE`) and TLS to
//! PostgreSQL (`sslmode=verify-full` in the URL), with throwaway CAs made at test time.
//!
//! Push, pop and ack over HTTPS trusting the test CA; a plain-text request gets no HTTP answer
//! and a client that does not trust the CA no connection; a reload serves the new certificate
//! to new connections while an open one goes on, a failed reload keeps the old one, and a real
//! SIGHUP does the same to a broker process; an unusable file stops the start with a message
//! naming it; a long poll whose TLS client hung up takes no message; the broker on a
//! PostgreSQL that serves TLS, and what `verify-full` refuses there.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use queen_broker::pg::{free_port, PrivateCluster};
use queen_broker::settings::Settings;
use queen_broker::tls::CertStore;
use serde_json::json;
use sqlx::{Connection, PgConnection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use crate::support::consuming::{ack_all, all_succeeded, messages, pop};
use crate::support::tls::{Https, ServerCert, TestCa};
use crate::support::{eventually, fresh_db, spawn_app_with, test_settings, TestApp, TestDb};

const BROKER: &str = env!("CARGO_BIN_EXE_queen-broker");

/// The names the test servers' certificates are made for.
const LOCAL: &[&str] = &["127.0.0.1", "localhost"];

/// Test settings on `db` with the listener serving `cert`.
fn tls_settings(db: &TestDb, cert: &ServerCert) -> Settings {
    test_settings(
        db,
        &[
            ("QUEEN_TLS_CERT_FILE", &cert.cert_file.display().to_string()),
            ("QUEEN_TLS_KEY_FILE", &cert.key_file.display().to_string()),
        ],
    )
}

/// A broker on a fresh database serving `cert`, talked to over HTTPS trusting `ca`.
async fn https_app(ca: &TestCa, cert: &ServerCert) -> TestApp {
    let db = fresh_db().await;
    spawn_app_with(tls_settings(&db, cert))
        .await
        .over_tls(ca.client_config())
}

/// Runs blocking client code off the test's runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("blocking step finished")
}

#[actix_web::test]
async fn pushes_pops_and_acks_over_https_trusting_the_test_ca() {
    let ca = TestCa::new("queen test CA");
    let cert = ca.issue("server", LOCAL);
    let app = https_app(&ca, &cert).await;
    assert!(app.base.starts_with("https://127.0.0.1:"), "{}", app.base);

    let r = app
        .push(json!([{ "queue": "tls", "payload": { "n": 1 } }]))
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    let popped = pop(&app, "tls", "wait=false").await;
    let got = messages(&popped);
    assert_eq!(got.len(), 1, "{:?}", popped.body);
    assert_eq!(got[0]["data"]["n"], 1);
    let acked = ack_all(&app, &popped, "completed", None).await;
    assert!(all_succeeded(&acked), "{acked}");
    let again = pop(&app, "tls", "wait=false").await;
    assert!(messages(&again).is_empty(), "{:?}", again.body);
}

#[actix_web::test]
async fn a_plain_http_request_to_the_tls_listener_gets_no_http_answer() {
    let ca = TestCa::new("queen test CA");
    let cert = ca.issue("server", LOCAL);
    let app = https_app(&ca, &cert).await;
    let port = app.broker.port;

    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the port accepts TCP");
    stream
        .write_all(format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the broker closes the connection");
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plain HTTP got an HTTP answer: {:?}",
        String::from_utf8_lossy(&answer)
    );
    let plain = awc::Client::default()
        .get(format!("http://127.0.0.1:{port}/health"))
        .send()
        .await;
    assert!(
        plain.is_err(),
        "a plain HTTP client got {:?}",
        plain.map(|r| r.status())
    );
}

#[actix_web::test]
async fn a_client_that_does_not_trust_the_ca_is_refused() {
    let ca = TestCa::new("queen test CA");
    let cert = ca.issue("server", LOCAL);
    let app = https_app(&ca, &cert).await;
    let port = app.broker.port;
    let stranger = TestCa::new("another CA");
    let config = stranger.client_config();
    let refused = blocking(move || Https::connect(config, port).map(|_| ())).await;
    let err = refused.expect_err("the handshake fails");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    // And the broker still serves those that trust it.
    assert_eq!(app.get("/health").await.status, 200);
}

#[actix_web::test]
async fn a_reload_serves_the_new_certificate_to_new_connections_while_open_ones_go_on() {
    let ca = TestCa::new("queen test CA");
    let first = ca.issue("server", LOCAL);
    let app = https_app(&ca, &first).await;
    let store = app.broker.tls.clone().expect("the broker serves TLS");
    let port = app.broker.port;

    // A connection opened before the reload, kept alive across it. (Each connection has a
    // client configuration of its own: one that resumed an earlier TLS session would be shown
    // that session's certificate, not the one the server serves now.)
    let c = ca.client_config();
    let (mut open, status) = blocking(move || {
        let mut open = Https::connect(c, port).expect("handshake");
        let (status, _) = open.get("/health").expect("answer");
        (open, status)
    })
    .await;
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(open.server_cert(), first.der);

    // A new certificate and key written over the same files (as a renewal does), then reloaded.
    let second = ca.issue("server", LOCAL);
    assert_ne!(second.der, first.der);
    store.reload().expect("the new files load");

    let c = ca.client_config();
    let fresh = blocking(move || Https::connect(c, port).expect("handshake")).await;
    assert_eq!(
        fresh.server_cert(),
        second.der,
        "a new connection gets the new one"
    );
    let (open, status) = blocking(move || {
        let (status, _) = open
            .get("/health")
            .expect("the open connection still answers");
        (open, status)
    })
    .await;
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(
        open.server_cert(),
        first.der,
        "on the certificate it began with"
    );

    // A reload that fails changes nothing.
    std::fs::write(&second.key_file, "not a key").unwrap();
    let err = store.reload().expect_err("an unusable key is refused");
    assert!(
        err.to_string()
            .contains(&second.key_file.display().to_string()),
        "{err}"
    );
    let c = ca.client_config();
    let after = blocking(move || Https::connect(c, port).expect("handshake")).await;
    assert_eq!(
        after.server_cert(),
        second.der,
        "the last good certificate stays"
    );
}

/// Each unusable pair and what the error must name.
fn unusable_pairs(ca: &TestCa) -> Vec<(PathBuf, PathBuf, Vec<String>)> {
    let a = ca.issue("a", LOCAL);
    let b = ca.issue("b", LOCAL);
    let dir = &ca.dir;
    let missing = dir.join("missing.crt");
    let empty = dir.join("empty.crt");
    std::fs::write(&empty, "").unwrap();
    let garbled = dir.join("garbled.crt");
    std::fs::write(
        &garbled,
        "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let show = |p: &Path| p.display().to_string();
    vec![
        (
            missing.clone(),
            a.key_file.clone(),
            vec![show(&missing), "cannot read".into()],
        ),
        (
            empty.clone(),
            a.key_file.clone(),
            vec![show(&empty), "no certificate".into()],
        ),
        (
            garbled.clone(),
            a.key_file.clone(),
            vec![show(&garbled), "not valid PEM".into()],
        ),
        // A certificate where the key should be.
        (
            a.cert_file.clone(),
            b.cert_file.clone(),
            vec![show(&b.cert_file), "no private key".into()],
        ),
        (
            a.cert_file.clone(),
            b.key_file.clone(),
            vec![
                show(&a.cert_file),
                show(&b.key_file),
                "does not belong".into(),
            ],
        ),
    ]
}

#[test]
fn an_unusable_certificate_or_key_is_refused_naming_the_file() {
    let ca = TestCa::new("queen test CA");
    for (cert, key, named) in unusable_pairs(&ca) {
        let err = CertStore::open(&cert, &key)
            .expect_err("an unusable pair is refused")
            .to_string();
        for text in &named {
            assert!(err.contains(text.as_str()), "{text:?} not in {err:?}");
        }
    }
    let good = ca.issue("good", LOCAL);
    CertStore::open(&good.cert_file, &good.key_file).expect("a good pair loads");
}

#[test]
fn a_broker_with_an_unusable_certificate_does_not_start_and_says_which_file() {
    let ca = TestCa::new("queen test CA");
    for (cert, key, named) in unusable_pairs(&ca) {
        let out = Command::new(BROKER)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("QUEEN_CONFIG", "")
            .env("QUEEN_TLS_CERT_FILE", &cert)
            .env("QUEEN_TLS_KEY_FILE", &key)
            // Never reached: the certificate is checked before the spool and the database.
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
            .env("FILE_BUFFER_DIR", ca.dir.join("spool"))
            .stdin(Stdio::null())
            .output()
            .expect("the broker runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.contains("cannot serve HTTPS"), "{stderr}");
        for text in &named {
            assert!(stderr.contains(text.as_str()), "{text:?} not in {stderr}");
        }
    }
}

/// A broker process, killed if the test ends early.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(child: &Child, name: &str) {
    let ok = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(ok.success(), "kill -{name}");
}

/// The certificate a new connection to `port` gets (a full handshake: a client configuration
/// of its own, no session to resume), once the broker answers `/health` on it.
async fn presented(ca: &TestCa, port: u16) -> Option<Vec<u8>> {
    let config = ca.client_config();
    blocking(move || {
        let mut https = Https::connect(config, port).ok()?;
        let (status, _) = https.get("/health").ok()?;
        status
            .contains(" 200 ")
            .then(|| https.server_cert().to_vec())
    })
    .await
}

#[actix_web::test]
async fn sighup_reloads_the_certificate_of_a_broker_process_and_a_bad_file_keeps_the_old_one() {
    let db = fresh_db().await;
    let ca = TestCa::new("queen test CA");
    let first = ca.issue("server", LOCAL);
    let port = free_port().unwrap();
    let log = ca.dir.join("broker.log");
    let child = Command::new(BROKER)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("QUEEN_CONFIG", "")
        .env("LOG_LEVEL", "info")
        .env("DATABASE_URL", &db.url)
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("FILE_BUFFER_DIR", ca.dir.join("spool"))
        .env("QUEEN_TLS_CERT_FILE", &first.cert_file)
        .env("QUEEN_TLS_KEY_FILE", &first.key_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("the broker starts");
    let mut broker = Process(child);
    let got = eventually(
        Duration::from_secs(30),
        "the broker answers over HTTPS",
        || presented(&ca, port),
    )
    .await;
    assert_eq!(got, first.der.to_vec());

    let second = ca.issue("server", LOCAL);
    signal(&broker.0, "HUP");
    eventually(
        Duration::from_secs(10),
        "new connections get the new certificate",
        || async { (presented(&ca, port).await? == second.der.to_vec()).then_some(()) },
    )
    .await;
    let reloaded = std::fs::read_to_string(&log).unwrap();
    assert!(reloaded.contains("TLS certificate reloaded"), "{reloaded}");

    // A certificate file broken by hand, then SIGHUP: logged, and the broker goes on with the
    // certificate it has.
    std::fs::write(&second.cert_file, "-----BEGIN CERTIFICATE-----\n").unwrap();
    signal(&broker.0, "HUP");
    let cert_path = second.cert_file.display().to_string();
    eventually(
        Duration::from_secs(10),
        "the failed reload is logged",
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let logged = text.contains("TLS certificate not reloaded") && text.contains(&cert_path);
            async move { logged.then_some(()) }
        },
    )
    .await;
    assert!(broker.0.try_wait().unwrap().is_none(), "the broker runs on");
    assert_eq!(
        presented(&ca, port).await,
        Some(second.der.to_vec()),
        "the last good certificate stays"
    );

    signal(&broker.0, "TERM");
    let status = blocking(move || {
        let mut broker = broker;
        broker.0.wait()
    })
    .await
    .unwrap();
    assert!(status.success(), "clean exit, got {status}");
}

#[actix_web::test]
async fn a_long_poll_whose_tls_client_hung_up_takes_no_message() {
    let ca = TestCa::new("queen test CA");
    let cert = ca.issue("server", LOCAL);
    let app = https_app(&ca, &cert).await;
    let r = app
        .post(
            "/api/v1/configure",
            &json!({ "queue": "gone", "options": { "leaseTime": 300 } }),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    // A consumer long-polls, then hangs up as TLS clients do: close_notify, then the end of
    // the stream.
    let (config, port) = (ca.client_config(), app.broker.port);
    blocking(move || {
        let request = format!(
            "GET /api/v1/pop/queue/gone?wait=true&timeout=20000 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
        );
        let https = Https::connect(config, port).expect("handshake");
        std::thread::sleep(Duration::from_millis(300));
        https.send_and_close(&request).expect("sent");
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = app
        .push(json!([{ "queue": "gone", "payload": { "n": 1 } }]))
        .await;
    assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The next consumer gets it, not after the gone one's lease (300 s).
    let got = pop(&app, "gone", "wait=false").await;
    assert_eq!(messages(&got).len(), 1, "{:?}", got.body);
}

/// A PostgreSQL cluster of one test serving TLS with a certificate of `ca` for `names`;
/// stopped and removed on drop.
struct TlsCluster {
    cluster: PrivateCluster,
    dir: PathBuf,
}

impl TlsCluster {
    fn start(ca: &TestCa, names: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("queen-tls-pg-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = ca.issue_into(&dir, "pg", names);
        let cluster = PrivateCluster::new(&dir.join("pg"), free_port().unwrap())
            .expect("server binaries")
            .with_tls(&cert.cert_file, &cert.key_file);
        cluster
            .start(false)
            .expect("the cluster starts with ssl=on");
        Self { cluster, dir }
    }

    /// The URL of database `postgres` on `host` with these parameters.
    fn url(&self, host: &str, params: &str) -> String {
        format!(
            "postgres://postgres@{host}:{}/postgres?{params}",
            self.cluster.port
        )
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        let _ = self.cluster.stop(true);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[actix_web::test]
async fn the_broker_reaches_postgresql_over_tls_with_verify_full() {
    let ca = TestCa::new("queen test PostgreSQL CA");
    let pg = TlsCluster::start(&ca, &["localhost"]);
    let url = pg.url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", ca.ca_file.display()),
    );
    let db = TestDb { url: url.clone() };
    let app = spawn_app_with(test_settings(&db, &[])).await;
    let r = app
        .push(json!([{ "queue": "over-tls", "payload": { "n": 7 } }]))
        .await;
    assert_eq!(r.body[0]["status"], "queued", "{:?}", r.body);
    let got = messages(&pop(&app, "over-tls", "wait=false").await);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["data"]["n"], 7);

    // Every connection of the broker is encrypted.
    let mut conn = PgConnection::connect(&url)
        .await
        .expect("verify-full connects");
    let (encrypted, plain): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
           FROM pg_stat_activity a
           JOIN pg_stat_ssl s ON s.pid = a.pid
          WHERE a.application_name = 'queen-broker'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(encrypted > 0, "the broker has connections");
    assert_eq!(plain, 0, "none of them in plain text");
}

/// The first status of `/health` on a broker process at `port` that `wanted` accepts.
async fn health_of(port: u16, wanted: impl Fn(u16) -> bool) -> u16 {
    let health = format!("http://127.0.0.1:{port}/health");
    eventually(Duration::from_secs(30), "the broker answers", || {
        let request = awc::Client::default().get(health.clone()).send();
        let wanted = &wanted;
        async move {
            let status = request.await.ok()?.status().as_u16();
            wanted(status).then_some(status)
        }
    })
    .await
}

#[actix_web::test]
async fn with_the_pg_variables_libpqs_pgsslmode_and_pgsslrootcert_ask_for_verify_full() {
    let ca = TestCa::new("queen test PostgreSQL CA");
    let pg = TlsCluster::start(&ca, &["localhost"]);
    // sqlx reads them from the process environment, so: broker processes. The certificate
    // names localhost only, so at 127.0.0.1 verify-full refuses it (where the default
    // sslmode, prefer, would connect) and at localhost it is accepted (which it would not be
    // without the CA of PGSSLROOTCERT).
    for (host, ready) in [("127.0.0.1", false), ("localhost", true)] {
        let port = free_port().unwrap();
        let child = Command::new(BROKER)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("QUEEN_CONFIG", "")
            .env("PG_HOST", host)
            .env("PG_PORT", pg.cluster.port.to_string())
            .env("PGSSLMODE", "verify-full")
            .env("PGSSLROOTCERT", &ca.ca_file)
            .env("HOST", "127.0.0.1")
            .env("PORT", port.to_string())
            .env("FILE_BUFFER_DIR", ca.dir.join(format!("spool-{port}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the broker starts");
        let _broker = Process(child);
        if ready {
            health_of(port, |status| status == 200).await;
        } else {
            // It answers (the listener opens whatever the database does), but is not ready.
            let status = health_of(port, |_| true).await;
            assert_eq!(status, 503, "PG_HOST={host}");
        }
    }
}

#[actix_web::test]
async fn verify_full_refuses_another_host_name_and_another_ca() {
    let ca = TestCa::new("queen test PostgreSQL CA");
    let pg = TlsCluster::start(&ca, &["localhost"]);
    let root = format!("sslrootcert={}", ca.ca_file.display());
    let connects = |url: String| async move {
        PgConnection::connect(&url)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let ssl_in_use = |url: String| async move {
        let mut conn = PgConnection::connect(&url).await.expect("connects");
        sqlx::query_scalar::<_, bool>("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    // The certificate names localhost: verify-full accepts it there…
    assert!(ssl_in_use(pg.url("localhost", &format!("sslmode=verify-full&{root}"))).await);
    // …refuses it at 127.0.0.1, which it does not name…
    let err = connects(pg.url("127.0.0.1", &format!("sslmode=verify-full&{root}")))
        .await
        .expect_err("the host name is checked");
    assert!(err.contains("not valid for name \"127.0.0.1\""), "{err}");
    // …where require (encrypted, nothing checked) still connects. verify-ca should too (it checks
    // the CA only), but sqlx 0.8.6 with rustls ≥ 0.23.24 checks the host name there as well
    // (launchbadge/sqlx#3793, fixed upstream after 0.8.6): when this starts connecting, say so in
    // docs/operations.md ("TLS") and make it an assertion that it connects.
    assert!(ssl_in_use(pg.url("127.0.0.1", "sslmode=require")).await);
    let err = connects(pg.url("127.0.0.1", &format!("sslmode=verify-ca&{root}")))
        .await
        .expect_err("verify-ca checks the host name too, with sqlx 0.8.6");
    assert!(err.contains("not valid for name"), "{err}");
    assert!(ssl_in_use(pg.url("localhost", &format!("sslmode=verify-ca&{root}"))).await);
    // A server certificate from a CA the URL does not name is refused.
    let stranger = TestCa::new("another CA");
    let err = connects(pg.url(
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            stranger.ca_file.display()
        ),
    ))
    .await
    .expect_err("another CA is not trusted");
    assert!(err.contains("UnknownIssuer"), "{err}");

    // A broker whose database does not verify counts it as unreachable: it starts, says why,
    // and is not ready (pushes would be spooled).
    let stranger_url = pg.url(
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            stranger.ca_file.display()
        ),
    );
    let app = spawn_app_with(test_settings(&TestDb { url: stranger_url }, &[])).await;
    assert_eq!(app.get("/health").await.status, 503);
}

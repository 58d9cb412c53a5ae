//! `queenctl` against a real broker: each command's output and exit code, `tail` receiving a
//! message pushed after it started, usage errors (exit 2), an unreachable broker (exit 1), and
//! `QUEEN_TOKEN` with auth on.
//!
//! One throwaway PostgreSQL cluster and two brokers on it (auth off, auth on) serve every test
//! of this binary; each test uses queues of its own, so the tests run in parallel.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::sync::{OnceLock, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use queen_broker::app;
use queen_broker::pg::{free_port, PrivateCluster};
use queen_broker::settings::Settings;
use serde_json::{json, Value};

const SECRET: &str = "queenctl-test-secret-of-32-bytes!!";

struct Brokers {
    open: String,
    guarded: String,
}

/// The cluster (stopped by a watchdog when this process exits) and both brokers, started once.
fn brokers() -> &'static Brokers {
    static BROKERS: OnceLock<Brokers> = OnceLock::new();
    BROKERS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("queenctl-test-pg-{}", uuid::Uuid::new_v4()));
        let cluster = PrivateCluster::new(&dir, free_port().expect("a free port"))
            .expect("PostgreSQL server binaries");
        cluster.start(false).expect("test cluster starts");
        let watchdog = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {stop} >/dev/null 2>&1; rm -rf {dir}",
            pid = std::process::id(),
            stop = cluster.stop_command_line(),
            dir = dir.display()
        );
        #[expect(
            clippy::zombie_processes,
            reason = "the watchdog outlives this process on purpose; init reaps it"
        )]
        let _watchdog = Command::new("sh")
            .arg("-c")
            .arg(watchdog)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("watchdog starts");
        let url = cluster.url("postgres");
        let open = start_broker(&url, &[]);
        let guarded = start_broker(&url, &[("JWT_ENABLED", "true"), ("JWT_SECRET", SECRET)]);
        Brokers { open, guarded }
    })
}

/// A broker on its own thread and actix system; returns its base URL.
fn start_broker(database_url: &str, extra: &[(&str, &str)]) -> String {
    let spool = std::env::temp_dir().join(format!("queenctl-test-spool-{}", uuid::Uuid::new_v4()));
    let mut env: std::collections::HashMap<String, String> = [
        ("DATABASE_URL", database_url),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("NUM_WORKERS", "2"),
        ("DB_POOL_SIZE", "4"),
        ("QUEEN_CONFIG", ""),
        ("LOG_LEVEL", "warn"),
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.insert("FILE_BUFFER_DIR".into(), spool.display().to_string());
    let settings = Settings::from_map(env).expect("valid settings");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let mut broker = app::start(settings).await.expect("broker starts");
            tx.send(format!("http://127.0.0.1:{}", broker.port))
                .expect("test waits");
            let _ = broker.server.take().expect("a fresh broker").await;
        });
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("broker started")
}

/// Maintenance modes are broker-wide (and shared through the database): the test that turns
/// them on holds this for writing, every test that pushes or pops holds it for reading.
static FLAGS: RwLock<()> = RwLock::new(());

fn normal_mode() -> RwLockReadGuard<'static, ()> {
    FLAGS.read().unwrap_or_else(|e| e.into_inner())
}

fn open() -> &'static str {
    &brokers().open
}

fn queenctl(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_queenctl"));
    c.args(args)
        .env("QUEEN_URL", url)
        .env_remove("QUEEN_TOKEN")
        .stdin(Stdio::null());
    c
}

/// Runs queenctl against the open broker.
fn run(args: &[&str]) -> Output {
    queenctl(open(), args).output().expect("queenctl runs")
}

fn run_with_stdin(args: &[&str], input: &str) -> Output {
    let mut child = queenctl(open(), args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("queenctl starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().expect("queenctl ends")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts the exit code and returns stdout.
fn expect(o: Output, code: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(code),
        "exit code; stdout:\n{}\nstderr:\n{}",
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

#[test]
fn every_command_has_help_and_exits_0() {
    let top = expect(run(&["--help"]), 0);
    for cmd in [
        "push",
        "pop",
        "tail",
        "queues",
        "groups",
        "dlq",
        "maintenance",
        "health",
        "metrics",
        "kv",
        "locks",
        "timers",
        "streams",
        "kafka",
    ] {
        assert!(top.contains(cmd), "{cmd} listed in:\n{top}");
        let help = expect(run(&[cmd, "--help"]), 0);
        assert!(help.contains("Usage: queenctl"), "{cmd}: {help}");
    }
    for sub in [
        &["queues", "list"][..],
        &["queues", "configure"],
        &["groups", "seek"],
        &["groups", "delete"],
        &["dlq", "list"],
        &["maintenance", "on"],
        &["kv", "get"],
        &["kv", "put"],
        &["kv", "list"],
        &["kafka", "topics"],
        &["kafka", "groups"],
    ] {
        let mut args = sub.to_vec();
        args.push("--help");
        expect(run(&args), 0);
    }
    assert!(top.contains("QUEEN_URL") && top.contains("QUEEN_TOKEN"));
}

#[test]
fn bad_arguments_exit_2_with_a_clear_message() {
    let cases: [(&[&str], &str); 6] = [
        (&["frobnicate"], "unrecognized subcommand"),
        (&["push", "q", "{not json"], "the payload is not JSON"),
        (&["queues", "delete", "q"], "add --yes to confirm"),
        (&["groups", "seek", "g", "q"], "--to-end"),
        (&["pop", "q", "--batch", "many"], "invalid value 'many'"),
        (
            &["--url", "localhost:6632", "health"],
            "must start with http://",
        ),
    ];
    for (args, text) in cases {
        let o = run(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(text), "{args:?}: expected {text:?} in {err}");
    }
}

#[test]
fn an_unreachable_broker_exits_1_naming_the_url() {
    let url = format!("http://127.0.0.1:{}", free_port().unwrap());
    for args in [&["health"][..], &["queues", "list"], &["push", "q", "1"]] {
        let o = queenctl(&url, args).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(&format!("cannot reach the broker at {url}")),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn push_queues_pop_and_lag_show_what_the_broker_holds() {
    let _normal = normal_mode();
    let q = "cli-orders";
    let out = expect(
        run_with_stdin(
            &["push", q, "--partition", "eu"],
            "{\"n\":1}\n\n{\"n\":2}\n\"three\"\n",
        ),
        0,
    );
    assert_eq!(out.matches("queued").count(), 3, "{out}");
    assert!(out.starts_with("#  STATUS"), "{out}");

    let out = expect(run(&["push", q, "[4]", "--transaction-id", "tx-4"]), 0);
    assert!(out.contains("queued") && out.contains("tx-4"), "{out}");
    let out = expect(
        run(&["--json", "push", q, "[4]", "--transaction-id", "tx-4"]),
        0,
    );
    assert_eq!(json_of(&out)[0]["status"], "duplicate", "{out}");

    let list = expect(run(&["queues", "list"]), 0);
    let line = list
        .lines()
        .find(|l| l.starts_with(q))
        .unwrap_or_else(|| panic!("{q} in:\n{list}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cols,
        [q, "2", "4", "4", "0"],
        "partitions, total, pending, processing"
    );

    let show = json_of(&expect(run(&["--json", "queues", "show", q]), 0));
    assert_eq!(show["totals"]["total"], 4);
    assert_eq!(show["partitions"].as_array().unwrap().len(), 2);

    let popped = json_of(&expect(
        run(&[
            "--json",
            "pop",
            q,
            "--partition",
            "eu",
            "--group",
            "g",
            "--batch",
            "2",
            "--ack",
        ]),
        0,
    ));
    let payloads: Vec<&Value> = popped
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["data"])
        .collect();
    assert_eq!(payloads, [&json!({"n": 1}), &json!({"n": 2})]);

    // Group g consumed two of the three messages of partition eu (and none of Default).
    let lag = json_of(&expect(run(&["--json", "groups", "lag", "g"]), 0));
    let parts = lag[q]["partitions"].as_array().unwrap();
    let eu = parts.iter().find(|p| p["partition"] == "eu").unwrap();
    assert_eq!(eu["offsetLag"], 1, "{lag}");
    assert_eq!(eu["totalConsumed"], 2, "{lag}");
    let table = expect(run(&["groups", "lag", "g"]), 0);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()[..3] == [q, "eu", "1"]),
        "{table}"
    );
    let groups = expect(run(&["groups", "list"]), 0);
    assert!(
        groups.lines().any(|l| l.starts_with("g ") && l.contains(q)),
        "{groups}"
    );

    let human = expect(run(&["pop", q, "--partition", "eu", "--group", "g"]), 0);
    assert!(human.contains("\"three\""), "{human}");
    let empty = expect(
        run(&["pop", q, "--partition", "nowhere", "--group", "g"]),
        0,
    );
    assert_eq!(empty.trim(), "no messages");
}

#[test]
fn tail_prints_a_message_pushed_after_it_started() {
    let _normal = normal_mode();
    let q = "cli-tail";
    let mut child = queenctl(
        open(),
        &[
            "--json",
            "tail",
            q,
            "--group",
            "t",
            "--ack",
            "--count",
            "1",
            "--poll-ms",
            "2000",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("tail starts");
    // The tail is polling (its first long-polls find nothing) before the push.
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "tail keeps waiting");
    expect(run(&["push", q, r#"{"hello":"tail"}"#]), 0);
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let m = json_of(&line);
    assert_eq!(m["data"], json!({"hello": "tail"}));
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "tail --count 1 ends");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    // Acked as it went: nothing left for group t.
    let lag = json_of(&expect(run(&["--json", "groups", "lag", "t"]), 0));
    assert_eq!(lag[q]["partitions"][0]["offsetLag"], 0, "{lag}");
}

#[test]
fn configure_seek_delete_and_dead_letters() {
    let _normal = normal_mode();
    let q = "cli-admin";
    let out = expect(
        run(&[
            "queues",
            "configure",
            q,
            "--lease-time",
            "120",
            "--options",
            r#"{"retryLimit": 5}"#,
        ]),
        0,
    );
    assert!(out.contains("configured queue cli-admin"), "{out}");
    // A second configure keeps what the first set.
    expect(run(&["queues", "configure", q, "--priority", "7"]), 0);
    let options = &json_of(&expect(run(&["--json", "queues", "show", q]), 0))["options"];
    assert_eq!(
        (
            &options["leaseTime"],
            &options["retryLimit"],
            &options["priority"]
        ),
        (&json!(120), &json!(5), &json!(7))
    );
    let err = stderr(&run(&["queues", "configure", q, "--options", "[1]"]));
    assert!(err.contains("--options must be a JSON object"), "{err}");

    expect(run(&["push", q, r#"{"bad":true}"#]), 0);
    expect(
        run(&[
            "pop",
            q,
            "--group",
            "d",
            "--ack-status",
            "dlq",
            "--error",
            "cannot parse order",
        ]),
        0,
    );
    let dlq = expect(run(&["dlq", "list", "--queue", q]), 0);
    assert!(
        dlq.contains("cannot parse order") && dlq.contains("1 dead letter(s) in all"),
        "{dlq}"
    );
    let dlq = json_of(&expect(run(&["--json", "dlq", "list", "--queue", q]), 0));
    assert_eq!(dlq["messages"][0]["data"], json!({"bad": true}));

    // A group that skips to the end has nothing left to read; one that seeks back reads again.
    expect(run(&["pop", q, "--group", "s", "--ack"]), 0);
    expect(run(&["push", q, "1"]), 0);
    let out = expect(run(&["groups", "seek", "s", q, "--to-end"]), 0);
    assert!(out.starts_with("moved group s on queue cli-admin"), "{out}");
    let empty = expect(run(&["pop", q, "--group", "s"]), 0);
    assert_eq!(empty.trim(), "no messages");
    let out = expect(
        run(&[
            "groups",
            "seek",
            "s",
            q,
            "--timestamp",
            "2000-01-01T00:00:00Z",
        ]),
        0,
    );
    assert!(out.contains("moved group s"), "{out}");
    let again = expect(run(&["pop", q, "--group", "s", "--batch", "5"]), 0);
    assert_eq!(
        again.lines().count(),
        3,
        "header and both messages:\n{again}"
    );

    let out = expect(run(&["groups", "delete", "s", "--queue", q, "--yes"]), 0);
    assert!(
        out.starts_with("deleted group s on queue cli-admin"),
        "{out}"
    );
    let groups = expect(run(&["groups", "list"]), 0);
    assert!(!groups.lines().any(|l| l.starts_with("s ")), "{groups}");

    let out = expect(run(&["queues", "delete", q, "--yes"]), 0);
    assert_eq!(out.trim(), "deleted queue cli-admin");
    let o = run(&["queues", "show", q]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("GET /api/v1/resources/queues/cli-admin: 404 Queue not found"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn maintenance_health_and_metrics() {
    // The only test that changes the broker-wide flags; it turns them back off.
    let _alone = FLAGS.write().unwrap_or_else(|e| e.into_inner());
    let out = expect(run(&["maintenance", "on"]), 0);
    assert!(out.starts_with("maintenance on"), "{out}");
    let pushed = json_of(&expect(run(&["--json", "push", "cli-maint", "1"]), 0));
    assert_eq!(pushed[0]["status"], "buffered", "{pushed}");
    let status = expect(run(&["maintenance", "status"]), 0);
    assert!(
        status.contains("maintenance      on") && status.contains("spooled items    1"),
        "{status}"
    );
    expect(run(&["maintenance", "off"]), 0);
    let out = expect(run(&["maintenance", "on", "--pop"]), 0);
    assert!(out.starts_with("pop maintenance on"), "{out}");
    let status = expect(run(&["maintenance", "status"]), 0);
    assert!(status.contains("pop maintenance  on"), "{status}");
    expect(run(&["maintenance", "off", "--pop"]), 0);
    let status = json_of(&expect(run(&["--json", "maintenance", "status"]), 0));
    assert_eq!(status["popMaintenanceMode"], false);
    assert_eq!(status["maintenanceMode"], false);

    let health = expect(run(&["health"]), 0);
    assert!(
        health.contains("status    healthy") && health.contains("database  connected"),
        "{health}"
    );
    let metrics = expect(run(&["metrics"]), 0);
    assert!(
        metrics.starts_with("METRIC") && metrics.contains("spooled items"),
        "{metrics}"
    );
    let metrics = json_of(&expect(run(&["--json", "metrics"]), 0));
    assert!(metrics["uptime"].is_u64() && metrics["spool"]["records"].is_u64());
}

#[test]
fn the_token_comes_from_queen_token_and_roles_are_enforced() {
    let _normal = normal_mode();
    let url = &brokers().guarded;
    let token = |role: &str| {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &json!({"sub": "cli", "role": role, "exp": jsonwebtoken::get_current_timestamp() + 600}),
            &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let o = queenctl(url, &["queues", "list"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("401") && stderr(&o).contains("set --token or QUEEN_TOKEN"),
        "{}",
        stderr(&o)
    );
    let reader = token("read-only");
    let o = queenctl(url, &["queues", "list"])
        .env("QUEEN_TOKEN", &reader)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = queenctl(url, &["maintenance", "on"])
        .env("QUEEN_TOKEN", &reader)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("403"), "{}", stderr(&o));
    let o = queenctl(url, &["--token", &token("admin"), "maintenance", "status"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A server on 127.0.0.1 that answers every request with `status`, `content_type` and `body`
/// (a proxy's page, a broker answering with control characters). Returns its URL.
fn fake_server(status: &'static str, content_type: &'static str, body: &'static str) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut stream, &mut buf);
            let answer = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    url
}

#[test]
fn health_fails_on_an_answer_that_is_not_the_brokers_json() {
    let url = fake_server("200 OK", "text/html", "<html><body>It works</body></html>");
    let o = queenctl(&url, &["health"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("not the broker's JSON"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn terminal_escapes_from_the_broker_are_printed_escaped() {
    let url = fake_server(
        "400 Bad Request",
        "application/json",
        r#"{"error":"bad \u001b]0;pwned\u0007 \u001b[2J name\nforged"}"#,
    );
    let o = queenctl(&url, &["queues", "list"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(!err.contains('\u{1b}') && !err.contains('\u{7}'), "{err:?}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
}

#[test]
fn a_password_in_the_url_is_not_printed() {
    let url = format!("http://admin:hunter2@127.0.0.1:{}", free_port().unwrap());
    let o = queenctl(&url, &["health"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(!err.contains("hunter2"), "{err}");
    assert!(err.contains("admin:***@"), "{err}");
}

/// POSTs JSON to the open broker with a bare HTTP/1.1 request; asserts a 200.
fn post_json(path: &str, body: &Value) {
    use std::io::Read;
    let addr = open().trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr).expect("broker reachable");
    let body = body.to_string();
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
}

#[test]
fn kv_put_get_and_list_keys_and_namespaces() {
    let ns = "ctl-kv";
    let out = expect(
        run(&["kv", "put", ns, "greeting", r#"{"hello":"world"}"#]),
        0,
    );
    assert!(out.starts_with("ctl-kv/greeting: version "), "{out}");
    assert!(out.contains("expires never"), "{out}");
    let out = expect(run(&["kv", "put", ns, "temp", "1", "--ttl", "600"]), 0);
    assert!(!out.contains("never"), "an expiry time: {out}");
    let out = expect(run(&["kv", "get", ns, "greeting"]), 0);
    assert!(out.starts_with("{\"hello\":\"world\"}\nversion "), "{out}");
    let json = json_of(&expect(run(&["--json", "kv", "get", ns, "temp"]), 0));
    assert_eq!(
        (json["found"].clone(), json["value"].clone()),
        (json!(true), json!(1))
    );

    let o = run(&["kv", "get", ns, "absent"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(r#"no key "absent" in namespace "ctl-kv""#),
        "{}",
        stderr(&o)
    );
    let o = run(&["kv", "put", ns, "k", "{not json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("the value is not JSON"),
        "{}",
        stderr(&o)
    );
    let o = run(&["kv", "put", "NOT A NAMESPACE", "k", "1"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the broker refuses: {}",
        stderr(&o)
    );

    // Keys share a prefix to be listed together.
    expect(run(&["kv", "put", ns, "gr-2", "2"]), 0);
    let o = run(&["kv", "list", ns]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("needs --prefix"), "{}", stderr(&o));
    let o = run(&["kv", "list", ns, "--prefix", ""]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("kv_bad_request: operation 0: prefix must be"),
        "{}",
        stderr(&o)
    );
    let out = expect(run(&["kv", "list", ns, "--prefix", "gr"]), 0);
    assert!(
        out.contains("greeting") && out.contains("gr-2") && !out.contains("temp"),
        "{out}"
    );
    let out = expect(run(&["kv", "list"]), 0);
    let line = out
        .lines()
        .find(|l| l.starts_with("ctl-kv "))
        .unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        (cells[1], cells[3]),
        ("3", "1"),
        "3 keys, 1 with an expiry: {line}"
    );
    let json = json_of(&expect(run(&["--json", "kv", "list"]), 0));
    assert!(json["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["namespace"] == ns));
}

#[test]
fn locks_timers_and_streams_show_what_the_api_created() {
    let _normal = normal_mode();
    post_json(
        "/api/v1/locks",
        &json!({ "operations": [{ "op": "acquire", "name": "ctl-nightly", "ttlSeconds": 600, "owner": "ctl-worker" }] }),
    );
    let out = expect(run(&["locks"]), 0);
    let line = out
        .lines()
        .find(|l| l.starts_with("ctl-nightly "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains(" 0 ") && line.contains("ctl-worker"),
        "{line}"
    );
    let json = json_of(&expect(run(&["--json", "locks"]), 0));
    let held = json["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "ctl-nightly")
        .cloned()
        .unwrap();
    assert!(held["token"].as_i64().is_some_and(|t| t > 0), "{held}");

    // An hour away: it stays pending for the test.
    post_json(
        "/api/v1/timers",
        &json!({ "operations": [{ "op": "schedule", "queue": "ctl-reminders", "timerKey": "t1",
                                  "payload": "eyJuIjoxfQ==", "delayMs": 3_600_000 }] }),
    );
    let out = expect(run(&["timers"]), 0);
    let line = out
        .lines()
        .find(|l| l.starts_with("ctl-reminders "))
        .unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        (cells[1], cells[3]),
        ("1", "0.0"),
        "one pending, not late: {line}"
    );

    post_json(
        "/streams/v1/queries",
        &json!({ "name": "ctl-totals", "source_queue": "ctl-src", "config_hash": "h" }),
    );
    let out = expect(run(&["streams"]), 0);
    let line = out
        .lines()
        .find(|l| l.starts_with("ctl-totals "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("ctl-src"), "{line}");
    let json = json_of(&expect(run(&["--json", "streams"]), 0));
    assert!(json["queries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|q| q["name"] == "ctl-totals" && q["cycles"] == 0));
}

#[test]
fn queues_list_pages_and_searches() {
    let _normal = normal_mode();
    for i in 0..3 {
        expect(run(&["push", &format!("cli-paged-{i}"), "1"]), 0);
    }
    let out = expect(
        run(&["queues", "list", "--search", "CLI-PAGED", "--limit", "2"]),
        0,
    );
    assert!(
        out.contains("cli-paged-0") && out.contains("cli-paged-1"),
        "{out}"
    );
    assert!(!out.contains("cli-paged-2"), "{out}");
    assert!(out.contains("(1-2 of 3 shown"), "{out}");
    let out = expect(
        run(&["queues", "list", "--search", "cli-paged", "--offset", "2"]),
        0,
    );
    assert!(
        out.contains("cli-paged-2") && !out.contains("cli-paged-0"),
        "{out}"
    );
    let json = json_of(&expect(
        run(&["--json", "queues", "list", "--search", "cli-paged-1"]),
        0,
    ));
    assert_eq!(json["total"], 1, "{json}");
}

#[test]
fn kafka_topics_and_groups_from_a_broker_without_the_listener_and_from_a_fake_one() {
    let out = expect(run(&["kafka", "groups"]), 0);
    assert!(out.starts_with("GROUP"), "{out}");
    assert!(out.contains("members unknown"), "{out}");
    let json = json_of(&expect(run(&["--json", "kafka", "topics"]), 0));
    assert_eq!(json["topics"], json!([]), "{json}");

    let url = fake_server(
        "200 OK",
        "application/json",
        r#"{"groups":[{"group":"billing","state":"Stable","members":[{"memberId":"m-1","instanceId":null,"assigned":[["orders",[0,1]]]}],"lag":7,"offsets":[{"topic":"orders","partition":0,"committedOffset":3,"endOffset":10,"lag":7}],"coordinator":{"nodeId":2,"host":"10.0.0.7","port":9092,"leaseUntil":"2026-12-06T04:00:00.000Z"}}],"total":3,"limit":1,"offset":0,"membersKnown":true}"#,
    );
    let o = queenctl(&url, &["kafka", "groups", "--limit", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let row = out.lines().nth(1).unwrap_or_default();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "billing",
            "Stable",
            "2",
            "(10.0.0.7:9092)",
            "m-1",
            "orders",
            "0",
            "3",
            "10",
            "7"
        ],
        "{out}"
    );
    assert!(out.contains("(1-1 of 3 shown"), "{out}");
}

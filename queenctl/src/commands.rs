//! One function per command: the API calls it makes and what it prints.

use std::io::{BufRead, Write};
use std::time::Duration;

use awc::http::Method;
use serde_json::{json, Map, Value};

use crate::client::{check, query, seg, Client, Failure};
use crate::table::{self, short, text};
use crate::{
    Cli, Command, ConfigureArgs, DlqCommand, GroupsCommand, KafkaCommand, KvCommand, ListArgs,
    MaintenanceAction, PopArgs, PushArgs, QueuesCommand, Source, TailArgs,
};

/// Items per push request when reading standard input.
const PUSH_CHUNK: usize = 500;
/// Payload characters shown in a table cell.
const PAYLOAD_CELL: usize = 80;

/// Runs the command of `cli`.
pub async fn run(cli: Cli) -> Result<(), Failure> {
    let client = Client::new(
        &cli.url,
        cli.token.clone(),
        Duration::from_secs(cli.request_timeout),
    )?;
    let json = cli.json;
    match cli.command {
        Command::Push(args) => push(&client, args, json).await,
        Command::Pop(args) => pop(&client, args, json).await,
        Command::Tail(args) => tail(&client, args, json).await,
        Command::Queues(cmd) => queues(&client, cmd, json).await,
        Command::Groups(cmd) => groups(&client, cmd, json).await,
        Command::Dlq(cmd) => dlq(&client, cmd, json).await,
        Command::Maintenance(args) => maintenance(&client, args.action, json).await,
        Command::Health => health(&client, json).await,
        Command::Metrics => metrics(&client, json).await,
        Command::Kv(cmd) => kv(&client, cmd, json).await,
        Command::Locks => locks(&client, json).await,
        Command::Timers => timers(&client, json).await,
        Command::Streams => streams(&client, json).await,
        Command::Kafka(cmd) => kafka(&client, cmd, json).await,
    }
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("a Value serialises")
    );
}

fn rows_of(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

// ------------------------------------------------------------------------------------- push

fn parse_payload(text: &str, where_: &str) -> Result<Value, Failure> {
    serde_json::from_str(text).map_err(|e| {
        Failure::Usage(format!(
            "{where_} is not JSON ({e}); quote a text payload: '\"hello\"'"
        ))
    })
}

async fn push(client: &Client, args: PushArgs, json: bool) -> Result<(), Failure> {
    let payloads: Vec<Value> = match &args.payload {
        Some(p) => vec![parse_payload(p, "the payload")?],
        None => {
            if args.transaction_id.is_some() {
                return Err(Failure::Usage(
                    "--transaction-id needs a single payload argument (not standard input)".into(),
                ));
            }
            let mut out = Vec::new();
            for (n, line) in std::io::stdin().lock().lines().enumerate() {
                let line =
                    line.map_err(|e| Failure::Error(format!("cannot read standard input: {e}")))?;
                if line.trim().is_empty() {
                    continue;
                }
                out.push(parse_payload(&line, &format!("line {}", n + 1))?);
            }
            if out.is_empty() {
                return Err(Failure::Usage(
                    "nothing to push: give a payload argument or JSON lines on standard input"
                        .into(),
                ));
            }
            out
        }
    };
    let mut results = Vec::new();
    for chunk in payloads.chunks(PUSH_CHUNK) {
        let items: Vec<Value> = chunk
            .iter()
            .map(|payload| {
                let mut item = Map::new();
                item.insert("queue".into(), json!(args.queue));
                item.insert("payload".into(), payload.clone());
                if let Some(p) = &args.partition {
                    item.insert("partition".into(), json!(p));
                }
                if let Some(t) = &args.transaction_id {
                    item.insert("transactionId".into(), json!(t));
                }
                Value::Object(item)
            })
            .collect();
        let answer = client
            .ok(
                Method::POST,
                "/api/v1/push",
                Some(&json!({ "items": items })),
            )
            .await?;
        results.extend(rows_of(&answer).iter().cloned());
    }
    let failed = results
        .iter()
        .filter(|r| r.get("status").and_then(Value::as_str) == Some("failed"))
        .count();
    let count = results.len();
    if json {
        print_json(&Value::Array(results));
    } else {
        let rows: Vec<Vec<String>> = results
            .iter()
            .enumerate()
            .map(|(i, r)| {
                vec![
                    i.to_string(),
                    text(r.get("status")),
                    text(r.get("message_id").or_else(|| r.get("messageId"))),
                    text(r.get("transaction_id").or_else(|| r.get("transactionId"))),
                    text(r.get("error")),
                ]
            })
            .collect();
        table::print(
            &["#", "STATUS", "MESSAGE ID", "TRANSACTION ID", "ERROR"],
            &rows,
        );
    }
    if failed > 0 {
        return Err(Failure::Error(format!(
            "{failed} of {count} item(s) failed"
        )));
    }
    Ok(())
}

// ------------------------------------------------------------------------------ pop and tail

fn pop_path(source: &Source, wait: bool, wait_ms: u64) -> String {
    let base = match &source.partition {
        Some(p) => format!(
            "/api/v1/pop/queue/{}/partition/{}",
            seg(&source.queue),
            seg(p)
        ),
        None => format!("/api/v1/pop/queue/{}", seg(&source.queue)),
    };
    base + &query(&[
        ("batch", Some(source.batch.max(1).to_string())),
        ("wait", Some(wait.to_string())),
        ("timeout", wait.then(|| wait_ms.to_string())),
        ("consumerGroup", source.group.clone()),
    ])
}

/// One pop: the messages (none on 204).
async fn pop_once(
    client: &Client,
    source: &Source,
    wait: bool,
    wait_ms: u64,
) -> Result<Vec<Value>, Failure> {
    let path = pop_path(source, wait, wait_ms);
    let extra = if wait {
        Duration::from_millis(wait_ms)
    } else {
        Duration::ZERO
    };
    let answer = client.call(Method::GET, &path, None, extra).await?;
    if answer.status == 204 {
        return Ok(Vec::new());
    }
    let body = check(&Method::GET, &path, answer)?;
    Ok(body
        .get("messages")
        .map(|m| rows_of(m).to_vec())
        .unwrap_or_default())
}

/// Acknowledges `messages` as completed; an ack the broker refuses is an error.
async fn ack(
    client: &Client,
    source: &Source,
    messages: &[Value],
    status: &str,
    error: Option<&str>,
) -> Result<(), Failure> {
    if messages.is_empty() {
        return Ok(());
    }
    let acks: Vec<Value> = messages
        .iter()
        .map(|m| {
            json!({
                "transactionId": m.get("transactionId"),
                "partitionId": m.get("partitionId"),
                "leaseId": m.get("leaseId"),
                "status": status,
                "error": error,
            })
        })
        .collect();
    let mut body = json!({ "acknowledgments": acks });
    if let Some(g) = &source.group {
        body["consumerGroup"] = json!(g);
    }
    let answer = client
        .ok(Method::POST, "/api/v1/ack/batch", Some(&body))
        .await?;
    let refused: Vec<String> = rows_of(&answer)
        .iter()
        .filter(|r| r.get("success").and_then(Value::as_bool) == Some(false))
        .map(|r| format!("{}: {}", text(r.get("transactionId")), text(r.get("error"))))
        .collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(Failure::Error(format!(
            "ack refused: {}",
            refused.join("; ")
        )))
    }
}

fn message_row(m: &Value) -> Vec<String> {
    vec![
        text(m.get("createdAt")),
        text(m.get("partition")),
        text(m.get("transactionId")),
        short(m.get("data").unwrap_or(&Value::Null), PAYLOAD_CELL),
    ]
}

const MESSAGE_HEADERS: [&str; 4] = ["CREATED", "PARTITION", "TRANSACTION ID", "PAYLOAD"];

async fn pop(client: &Client, args: PopArgs, json: bool) -> Result<(), Failure> {
    let messages = pop_once(client, &args.source, args.wait, args.wait_ms).await?;
    if args.ack || args.ack_status.is_some() {
        let status = args.ack_status.as_deref().unwrap_or("completed");
        ack(
            client,
            &args.source,
            &messages,
            status,
            args.error.as_deref(),
        )
        .await?;
    }
    if json {
        print_json(&Value::Array(messages));
    } else if messages.is_empty() {
        println!("no messages");
    } else {
        let rows: Vec<Vec<String>> = messages.iter().map(message_row).collect();
        table::print(&MESSAGE_HEADERS, &rows);
    }
    Ok(())
}

async fn tail(client: &Client, args: TailArgs, json: bool) -> Result<(), Failure> {
    let mut seen = 0u64;
    let mut out = std::io::stdout().lock();
    loop {
        let messages = pop_once(client, &args.source, true, args.poll_ms).await?;
        for m in &messages {
            let line = if json {
                m.to_string()
            } else {
                message_row(m).join("  ")
            };
            // A closed pipe (`| head`) ends the tail quietly.
            if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                return Ok(());
            }
        }
        if args.ack {
            ack(client, &args.source, &messages, "completed", None).await?;
        }
        seen += messages.len() as u64;
        if args.count > 0 && seen >= args.count {
            return Ok(());
        }
    }
}

// ------------------------------------------------------------------------------------ queues

async fn queues(client: &Client, cmd: QueuesCommand, json: bool) -> Result<(), Failure> {
    match cmd {
        QueuesCommand::List(args) => {
            let path = format!(
                "/api/v1/resources/queues{}",
                query(&[
                    ("limit", Some(args.limit.to_string())),
                    ("offset", Some(args.offset.to_string())),
                    ("search", args.search.clone()),
                ])
            );
            let body = client.get(&path).await?;
            if json {
                print_json(&body);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = body
                .get("queues")
                .map(rows_of)
                .unwrap_or_default()
                .iter()
                .map(|q| {
                    let m = q.get("messages");
                    let count = |k: &str| text(m.and_then(|m| m.get(k)));
                    vec![
                        text(q.get("name")),
                        text(q.get("namespace")),
                        text(q.get("partitions")),
                        count("total"),
                        count("pending"),
                        count("processing"),
                    ]
                })
                .collect();
            table::print(
                &[
                    "QUEUE",
                    "NAMESPACE",
                    "PARTITIONS",
                    "TOTAL",
                    "PENDING",
                    "PROCESSING",
                ],
                &rows,
            );
            page_note(&body, rows.len(), args.offset);
        }
        QueuesCommand::Show { queue } => {
            let body = client
                .get(&format!("/api/v1/resources/queues/{}", seg(&queue)))
                .await?;
            if json {
                print_json(&body);
                return Ok(());
            }
            println!("queue      {}", text(body.get("name")));
            println!("namespace  {}", text(body.get("namespace")));
            println!("task       {}", text(body.get("task")));
            println!("created    {}", text(body.get("createdAt")));
            if let Some(t) = body.get("totals") {
                println!(
                    "messages   total {} · pending {} · processing {} · completed {} · dead {}",
                    text(t.get("total")),
                    text(t.get("pending")),
                    text(t.get("processing")),
                    text(t.get("completed")),
                    text(t.get("deadLetter"))
                );
            }
            println!("\noptions");
            if let Some(Value::Object(o)) = body.get("options") {
                let rows: Vec<Vec<String>> = o
                    .iter()
                    .map(|(k, v)| vec![k.clone(), text(Some(v))])
                    .collect();
                table::print(&["OPTION", "VALUE"], &rows);
            }
            println!("\npartitions");
            let rows: Vec<Vec<String>> = body
                .get("partitions")
                .map(rows_of)
                .unwrap_or_default()
                .iter()
                .map(|p| {
                    let s = p.get("stats");
                    let count = |k: &str| text(s.and_then(|s| s.get(k)));
                    vec![
                        text(p.get("name")),
                        count("total"),
                        count("pending"),
                        count("processing"),
                        count("completed"),
                        count("deadLetter"),
                        text(p.get("newestMessage")),
                    ]
                })
                .collect();
            table::print(
                &[
                    "PARTITION",
                    "TOTAL",
                    "PENDING",
                    "PROCESSING",
                    "COMPLETED",
                    "DEAD",
                    "NEWEST",
                ],
                &rows,
            );
        }
        QueuesCommand::Configure(args) => configure(client, args, json).await?,
        QueuesCommand::Delete { queue, yes } => {
            if !yes {
                return Err(Failure::Usage(format!(
                    "deleting queue {queue:?} removes its messages; add --yes to confirm"
                )));
            }
            let body = client
                .ok(
                    Method::DELETE,
                    &format!("/api/v1/resources/queues/{}", seg(&queue)),
                    None,
                )
                .await?;
            if json {
                print_json(&body);
            } else if body.get("existed").and_then(Value::as_bool) == Some(false) {
                println!("queue {queue} did not exist");
            } else {
                println!("deleted queue {queue}");
            }
        }
    }
    Ok(())
}

async fn configure(client: &Client, args: ConfigureArgs, json: bool) -> Result<(), Failure> {
    // /configure replaces every option: start from the queue's current ones.
    let path = format!("/api/v1/resources/queues/{}", seg(&args.queue));
    let current = client
        .call(Method::GET, &path, None, Duration::ZERO)
        .await?;
    let (mut options, mut namespace, mut task) = match current.status {
        404 => (Map::new(), None, None),
        _ => {
            let body = check(&Method::GET, &path, current)?;
            let opts = body
                .get("options")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let word = |k: &str| {
                body.get(k)
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
            };
            (opts, word("namespace"), word("task"))
        }
    };
    if let Some(extra) = &args.options {
        let Value::Object(extra) = parse_payload(extra, "--options")? else {
            return Err(Failure::Usage("--options must be a JSON object".into()));
        };
        options.extend(extra);
    }
    for (name, value) in [
        ("leaseTime", args.lease_time),
        ("retryLimit", args.retry_limit),
        ("priority", args.priority),
        ("ttl", args.ttl),
    ] {
        if let Some(v) = value {
            options.insert(name.into(), json!(v));
        }
    }
    namespace = args.namespace.or(namespace);
    task = args.task.or(task);
    let mut body = json!({ "queue": args.queue, "options": options });
    if let Some(ns) = namespace {
        body["namespace"] = json!(ns);
    }
    if let Some(t) = task {
        body["task"] = json!(t);
    }
    let answer = client
        .ok(Method::POST, "/api/v1/configure", Some(&body))
        .await?;
    if json {
        print_json(&answer);
    } else {
        println!("configured queue {}", args.queue);
        if let Some(Value::Object(o)) = answer.get("options") {
            let rows: Vec<Vec<String>> = o
                .iter()
                .map(|(k, v)| vec![k.clone(), text(Some(v))])
                .collect();
            table::print(&["OPTION", "VALUE"], &rows);
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------------------ groups

async fn groups(client: &Client, cmd: GroupsCommand, json: bool) -> Result<(), Failure> {
    match cmd {
        GroupsCommand::List => {
            let body = client.get("/api/v1/consumer-groups").await?;
            if json {
                print_json(&body);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = rows_of(&body)
                .iter()
                .map(|g| {
                    vec![
                        text(g.get("name")),
                        text(g.get("queueName")),
                        text(g.get("members")),
                        text(g.get("partitionsWithLag")),
                        text(g.get("maxTimeLag")),
                        text(g.get("state")),
                        text(g.get("subscriptionMode")),
                    ]
                })
                .collect();
            table::print(
                &[
                    "GROUP",
                    "QUEUE",
                    "MEMBERS",
                    "PARTITIONS BEHIND",
                    "MAX LAG (S)",
                    "STATE",
                    "MODE",
                ],
                &rows,
            );
        }
        GroupsCommand::Lag {
            group: Some(group), ..
        } => {
            let body = client
                .get(&format!("/api/v1/consumer-groups/{}", seg(&group)))
                .await?;
            if json {
                print_json(&body);
                return Ok(());
            }
            let mut rows = Vec::new();
            if let Value::Object(queues) = &body {
                for (queue, q) in queues {
                    for p in q.get("partitions").map(rows_of).unwrap_or_default() {
                        rows.push(vec![
                            queue.clone(),
                            text(p.get("partition")),
                            text(p.get("offsetLag")),
                            text(p.get("timeLagSeconds")),
                            text(p.get("totalConsumed")),
                            text(p.get("workerId")),
                            text(p.get("leaseActive")),
                        ]);
                    }
                }
            }
            table::print(
                &[
                    "QUEUE",
                    "PARTITION",
                    "LAG",
                    "LAG (S)",
                    "CONSUMED",
                    "LEASE HOLDER",
                    "LEASE ACTIVE",
                ],
                &rows,
            );
        }
        GroupsCommand::Lag {
            group: None,
            min_lag_seconds,
        } => {
            let body = client
                .get(&format!(
                    "/api/v1/consumer-groups/lagging?minLagSeconds={min_lag_seconds}"
                ))
                .await?;
            if json {
                print_json(&body);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = rows_of(&body)
                .iter()
                .map(|r| {
                    vec![
                        text(r.get("consumer_group")),
                        text(r.get("queue_name")),
                        text(r.get("partition_name")),
                        text(r.get("offset_lag")),
                        text(r.get("time_lag_seconds")),
                    ]
                })
                .collect();
            table::print(&["GROUP", "QUEUE", "PARTITION", "LAG", "LAG (S)"], &rows);
        }
        GroupsCommand::Seek {
            group,
            queue,
            to_end,
            timestamp,
            partition,
        } => {
            let base = format!(
                "/api/v1/consumer-groups/{}/queues/{}",
                seg(&group),
                seg(&queue)
            );
            let body = match (&partition, timestamp) {
                (Some(p), _) => {
                    if !to_end {
                        return Err(Failure::Usage("--partition needs --to-end".into()));
                    }
                    let path = format!("{base}/partitions/{}/seek", seg(p));
                    client.ok(Method::POST, &path, None).await?
                }
                (None, Some(t)) => {
                    client
                        .ok(
                            Method::POST,
                            &format!("{base}/seek"),
                            Some(&json!({ "timestamp": t })),
                        )
                        .await?
                }
                (None, None) => {
                    client
                        .ok(
                            Method::POST,
                            &format!("{base}/seek"),
                            Some(&json!({ "toEnd": true })),
                        )
                        .await?
                }
            };
            if json {
                print_json(&body);
            } else {
                let moved = body
                    .get("partitionsUpdated")
                    .map(|n| format!(" ({} partition(s))", text(Some(n))))
                    .unwrap_or_default();
                println!("moved group {group} on queue {queue}{moved}");
            }
        }
        GroupsCommand::Delete { group, queue, yes } => {
            if !yes {
                return Err(Failure::Usage(format!(
                    "deleting group {group:?} removes its cursors; add --yes to confirm"
                )));
            }
            let path = match &queue {
                Some(q) => format!("/api/v1/consumer-groups/{}/queues/{}", seg(&group), seg(q)),
                None => format!("/api/v1/consumer-groups/{}", seg(&group)),
            };
            let body = client.ok(Method::DELETE, &path, None).await?;
            if json {
                print_json(&body);
            } else {
                println!(
                    "deleted group {group}{} ({} partition state(s))",
                    queue.map(|q| format!(" on queue {q}")).unwrap_or_default(),
                    text(body.get("deletedPartitions"))
                );
            }
        }
    }
    Ok(())
}

// -------------------------------------------------------------------------------------- dlq

async fn dlq(client: &Client, cmd: DlqCommand, json: bool) -> Result<(), Failure> {
    let DlqCommand::List {
        queue,
        group,
        limit,
        offset,
    } = cmd;
    let path = format!(
        "/api/v1/dlq{}",
        query(&[
            ("queue", queue),
            ("consumerGroup", group),
            ("limit", Some(limit.to_string())),
            ("offset", Some(offset.to_string())),
        ])
    );
    let body = client.get(&path).await?;
    if json {
        print_json(&body);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = body
        .get("messages")
        .map(rows_of)
        .unwrap_or_default()
        .iter()
        .map(|m| {
            vec![
                text(m.get("failedAt")),
                text(m.get("queue")),
                text(m.get("partition")),
                text(m.get("consumerGroup")),
                text(m.get("transactionId")),
                text(m.get("retryCount")),
                text(m.get("errorMessage")),
            ]
        })
        .collect();
    table::print(
        &[
            "FAILED",
            "QUEUE",
            "PARTITION",
            "GROUP",
            "TRANSACTION ID",
            "RETRIES",
            "REASON",
        ],
        &rows,
    );
    println!("{} dead letter(s) in all", text(body.get("total")));
    Ok(())
}

// ----------------------------------------------------------------------------- maintenance

async fn maintenance(
    client: &Client,
    action: MaintenanceAction,
    json: bool,
) -> Result<(), Failure> {
    let (pop, enabled) = match action {
        MaintenanceAction::Status => {
            let body = client.get("/api/v1/system/maintenance").await?;
            if json {
                print_json(&body);
                return Ok(());
            }
            let on = |k: &str| match body.get(k).and_then(Value::as_bool) {
                Some(true) => "on",
                _ => "off",
            };
            println!("maintenance      {}", on("maintenanceMode"));
            println!("pop maintenance  {}", on("popMaintenanceMode"));
            println!("spooled items    {}", text(body.get("bufferedMessages")));
            return Ok(());
        }
        MaintenanceAction::On { pop } => (pop, true),
        MaintenanceAction::Off { pop } => (pop, false),
    };
    let path = if pop {
        "/api/v1/system/maintenance/pop"
    } else {
        "/api/v1/system/maintenance"
    };
    let body = client
        .ok(Method::POST, path, Some(&json!({ "enabled": enabled })))
        .await?;
    if json {
        print_json(&body);
    } else {
        println!(
            "{} {}",
            if pop {
                "pop maintenance"
            } else {
                "maintenance"
            },
            if enabled { "on" } else { "off" }
        );
        if let Some(m) = body.get("message").and_then(Value::as_str) {
            println!("{m}");
        }
    }
    Ok(())
}

// ------------------------------------------------------------------------- health, metrics

async fn health(client: &Client, json: bool) -> Result<(), Failure> {
    let answer = client
        .call(Method::GET, "/health", None, Duration::ZERO)
        .await?;
    if !matches!(answer.status, 200 | 503) {
        check(&Method::GET, "/health", answer)?;
        return Ok(());
    }
    let body = answer.body;
    if !body.is_object() {
        // An HTML page or a proxy's text is not the broker's health.
        return Err(Failure::Error(format!(
            "GET /health: {} is not the broker's JSON answer: {}",
            answer.status,
            short(&body, 200)
        )));
    }
    if json {
        print_json(&body);
    } else {
        println!("status    {}", text(body.get("status")));
        println!("database  {}", text(body.get("database")));
        println!("version   {}", text(body.get("version")));
    }
    if answer.status == 503 {
        return Err(Failure::Error("the broker is unhealthy".into()));
    }
    Ok(())
}

async fn metrics(client: &Client, json: bool) -> Result<(), Failure> {
    let body = client.get("/metrics").await?;
    if json {
        print_json(&body);
        return Ok(());
    }
    let at = |path: &[&str]| {
        let mut v = &body;
        for k in path {
            v = v.get(k).unwrap_or(&Value::Null);
        }
        text(Some(v))
    };
    let rows = vec![
        vec!["uptime (s)".to_string(), at(&["uptime"])],
        vec![
            "db pool (size / idle)".to_string(),
            format!(
                "{} / {}",
                at(&["database", "poolSize"]),
                at(&["database", "idleConnections"])
            ),
        ],
        vec!["spooled items".to_string(), at(&["spool", "records"])],
        vec!["spool bytes".to_string(), at(&["spool", "bytes"])],
        vec![
            "replayed from spool".to_string(),
            at(&["spool", "replayed"]),
        ],
        vec![
            "db unreachable (s)".to_string(),
            at(&["spool", "dbUnreachableSeconds"]),
        ],
        vec![
            "maintenance / pop".to_string(),
            format!(
                "{} / {}",
                at(&["spool", "maintenanceMode"]),
                at(&["spool", "popMaintenanceMode"])
            ),
        ],
        vec!["partition actors".to_string(), at(&["partitionActors"])],
        vec!["in-flight bytes".to_string(), at(&["inflightBytes"])],
        vec!["commit backlog".to_string(), at(&["commitBacklogItems"])],
        vec!["rss bytes".to_string(), at(&["memory", "rss"])],
    ];
    table::print(&["METRIC", "VALUE"], &rows);
    Ok(())
}

// ------------------------------------------------------------------------- KV and friends

/// One KV op through `POST /api/v1/kv`; its result object.
async fn kv_op(client: &Client, op: Value) -> Result<Value, Failure> {
    let body = client
        .ok(
            Method::POST,
            "/api/v1/kv",
            Some(&json!({ "operations": [op] })),
        )
        .await?;
    body.get("results")
        .and_then(|r| r.get(0))
        .cloned()
        .ok_or_else(|| Failure::Error(format!("POST /api/v1/kv: no result in {body}")))
}

/// "(N more not shown)" when the broker cut a list.
fn truncated_note(body: &Value, shown: usize) {
    if body.get("truncated") == Some(&Value::Bool(true)) {
        println!("(first {shown} shown; there are more)");
    }
}

async fn kv(client: &Client, cmd: KvCommand, json: bool) -> Result<(), Failure> {
    match cmd {
        KvCommand::Get { namespace, key } => {
            let r = kv_op(client, json!({ "op": "get", "ns": namespace, "key": key })).await?;
            if json {
                print_json(&r);
            }
            if r.get("found") != Some(&Value::Bool(true)) {
                return Err(Failure::Error(format!(
                    "no key {key:?} in namespace {namespace:?}"
                )));
            }
            if !json {
                println!("{}", r.get("value").unwrap_or(&Value::Null));
                println!(
                    "version {} · expires {}",
                    text(r.get("version")),
                    r.get("expiresAt")
                        .and_then(Value::as_str)
                        .unwrap_or("never")
                );
            }
            Ok(())
        }
        KvCommand::Put {
            namespace,
            key,
            value,
            ttl,
        } => {
            let value = parse_payload(&value, "the value")?;
            let mut op = json!({ "op": "put", "ns": namespace, "key": key, "value": value });
            match ttl {
                Some(seconds) => op["ttlSeconds"] = seconds.into(),
                None => op["forever"] = true.into(),
            }
            let r = kv_op(client, op).await?;
            if json {
                print_json(&r);
            } else if r.get("applied") == Some(&Value::Bool(true)) {
                println!(
                    "{namespace}/{key}: version {} · expires {}",
                    text(r.get("version")),
                    r.get("expiresAt")
                        .and_then(Value::as_str)
                        .unwrap_or("never")
                );
            }
            if r.get("applied") != Some(&Value::Bool(true)) {
                return Err(Failure::Error(format!(
                    "{namespace}/{key} not written: {}",
                    text(r.get("reason"))
                )));
            }
            Ok(())
        }
        KvCommand::List {
            namespace: None, ..
        } => {
            let body = client.get("/api/v1/kv/namespaces").await?;
            if json {
                print_json(&body);
                return Ok(());
            }
            let list = body.get("namespaces").map(rows_of).unwrap_or_default();
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|n| {
                    vec![
                        text(n.get("namespace")),
                        text(n.get("keys")),
                        text(n.get("bytes")),
                        text(n.get("expiring")),
                        text(n.get("expiringSoon")),
                        text(n.get("lastWrite")),
                    ]
                })
                .collect();
            table::print(
                &[
                    "NAMESPACE",
                    "KEYS",
                    "BYTES",
                    "EXPIRING",
                    "WITHIN 1 MIN",
                    "LAST WRITE",
                ],
                &rows,
            );
            truncated_note(&body, rows.len());
            Ok(())
        }
        KvCommand::List {
            namespace: Some(namespace),
            prefix,
            limit,
        } => {
            let Some(prefix) = prefix else {
                return Err(Failure::Usage(format!(
                    "listing the keys of {namespace:?} needs --prefix (the KV API reads keys by a \
                     non-empty prefix); without a namespace, kv list shows every namespace"
                )));
            };
            let r = kv_op(
                client,
                json!({ "op": "getPrefix", "ns": namespace, "prefix": prefix, "limit": limit }),
            )
            .await?;
            if json {
                print_json(&r);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = r
                .get("rows")
                .map(rows_of)
                .unwrap_or_default()
                .iter()
                .map(|row| {
                    vec![
                        text(row.get("key")),
                        short(row.get("value").unwrap_or(&Value::Null), PAYLOAD_CELL),
                        text(row.get("version")),
                        row.get("expiresAt")
                            .and_then(Value::as_str)
                            .unwrap_or("never")
                            .to_string(),
                    ]
                })
                .collect();
            table::print(&["KEY", "VALUE", "VERSION", "EXPIRES"], &rows);
            truncated_note(&r, rows.len());
            Ok(())
        }
    }
}

/// A read-only list of one of the 2.x state views: GETs `path`, prints the JSON with `--json`,
/// else a table of `headers` with one row per item of the answer's `key` array (each cell by
/// `cells`), and says when the broker cut the list short.
async fn state_view(
    client: &Client,
    json: bool,
    (path, key): (&str, &str),
    headers: &[&str],
    cells: impl Fn(&Value) -> Vec<String>,
) -> Result<(), Failure> {
    let body = client.get(path).await?;
    if json {
        print_json(&body);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = body
        .get(key)
        .map(rows_of)
        .unwrap_or_default()
        .iter()
        .map(cells)
        .collect();
    table::print(headers, &rows);
    truncated_note(&body, rows.len());
    Ok(())
}

async fn locks(client: &Client, json: bool) -> Result<(), Failure> {
    let headers = ["NAME", "SLOT", "OWNER", "TOKEN", "EXPIRES", "RENEWED"];
    state_view(client, json, ("/api/v1/locks", "locks"), &headers, |l| {
        let expires = l.get("expiresAt").and_then(Value::as_str);
        vec![
            text(l.get("name")),
            text(l.get("slot")),
            text(l.get("owner")),
            text(l.get("token")),
            expires.unwrap_or("never").to_string(),
            text(l.get("renewedAt")),
        ]
    })
    .await
}

async fn timers(client: &Client, json: bool) -> Result<(), Failure> {
    let headers = ["QUEUE", "PENDING", "NEXT DUE", "LATE (S)", "REFUSED"];
    state_view(client, json, ("/api/v1/timers", "queues"), &headers, |t| {
        let late = t.get("lateSeconds").and_then(Value::as_f64).unwrap_or(0.0);
        vec![
            text(t.get("queue")),
            text(t.get("pending")),
            text(t.get("nextDue")),
            format!("{late:.1}"),
            text(t.get("refused")),
        ]
    })
    .await
}

async fn streams(client: &Client, json: bool) -> Result<(), Failure> {
    let headers = [
        "QUERY",
        "SOURCE",
        "SINK",
        "PARTITIONS",
        "STATE KEYS",
        "STATE BYTES",
        "CYCLES",
        "LAST CYCLE",
    ];
    let fields = [
        "name",
        "sourceQueue",
        "sinkQueue",
        "partitions",
        "stateKeys",
        "stateBytes",
        "cycles",
        "lastCycle",
    ];
    state_view(
        client,
        json,
        ("/streams/v1/queries", "queries"),
        &headers,
        |q| fields.iter().map(|f| text(q.get(*f))).collect(),
    )
    .await
}

/// Says which part of a paged list was shown when it is not all of it (`total` in the answer).
fn page_note(body: &Value, shown: usize, offset: u32) {
    let total = body.get("total").and_then(Value::as_i64).unwrap_or(0);
    if (shown as i64) < total {
        let first = if shown == 0 { 0 } else { u64::from(offset) + 1 };
        println!(
            "({first}-{} of {total} shown; --offset and --limit page, --search narrows)",
            u64::from(offset) + shown as u64
        );
    }
}

async fn kafka(client: &Client, cmd: KafkaCommand, json: bool) -> Result<(), Failure> {
    let (what, args) = match &cmd {
        KafkaCommand::Topics(a) => ("topics", a),
        KafkaCommand::Groups(a) => ("groups", a),
    };
    let ListArgs {
        search,
        limit,
        offset,
    } = args;
    let path = format!(
        "/api/v1/kafka/{what}{}",
        query(&[
            ("limit", Some(limit.to_string())),
            ("offset", Some(offset.to_string())),
            ("search", search.clone()),
        ])
    );
    let body = client.get(&path).await?;
    if json {
        print_json(&body);
        return Ok(());
    }
    let items = body.get(what).map(rows_of).unwrap_or_default();
    match &cmd {
        KafkaCommand::Topics(_) => {
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|t| {
                    let offsets = t.get("offsets").map(rows_of).unwrap_or_default();
                    let records: i64 = offsets
                        .iter()
                        .filter_map(|o| o.get("records").and_then(Value::as_i64))
                        .sum();
                    let ends: Vec<String> = offsets
                        .iter()
                        .map(|o| {
                            format!(
                                "{}:{}-{}",
                                text(o.get("partition")),
                                text(o.get("logStartOffset")),
                                text(o.get("endOffset"))
                            )
                        })
                        .collect();
                    vec![
                        text(t.get("name")),
                        text(t.get("partitions")),
                        records.to_string(),
                        ends.join(" "),
                    ]
                })
                .collect();
            table::print(
                &[
                    "TOPIC",
                    "PARTITIONS",
                    "RECORDS",
                    "OFFSETS (PARTITION:START-END)",
                ],
                &rows,
            );
        }
        KafkaCommand::Groups(_) => {
            let known = body.get("membersKnown") == Some(&Value::Bool(true));
            let mut rows: Vec<Vec<String>> = Vec::new();
            for g in items {
                let members: Vec<String> = g
                    .get("members")
                    .map(rows_of)
                    .unwrap_or_default()
                    .iter()
                    .map(|m| {
                        let id = m
                            .get("instanceId")
                            .filter(|v| !v.is_null())
                            .or(m.get("memberId"));
                        text(id)
                    })
                    .collect();
                let members = if !members.is_empty() {
                    members.join(",")
                } else if known {
                    "none here".to_string()
                } else {
                    "unknown".to_string()
                };
                let coordinator =
                    g.get("coordinator")
                        .filter(|c| c.is_object())
                        .map_or("-".to_string(), |c| {
                            format!(
                                "{} ({}:{})",
                                text(c.get("nodeId")),
                                text(c.get("host")),
                                text(c.get("port"))
                            )
                        });
                let offsets = g.get("offsets").map(rows_of).unwrap_or_default();
                let head = [
                    text(g.get("group")),
                    text(g.get("state")),
                    coordinator,
                    members,
                ];
                if offsets.is_empty() {
                    rows.push(
                        head.iter()
                            .cloned()
                            .chain(["-", "-", "-", "-", "-"].map(String::from))
                            .collect(),
                    );
                }
                for o in offsets {
                    rows.push(
                        head.iter()
                            .cloned()
                            .chain(
                                ["topic", "partition", "committedOffset", "endOffset", "lag"]
                                    .iter()
                                    .map(|k| text(o.get(*k))),
                            )
                            .collect(),
                    );
                }
            }
            table::print(
                &[
                    "GROUP",
                    "STATE",
                    "COORDINATOR",
                    "MEMBERS",
                    "TOPIC",
                    "PARTITION",
                    "COMMITTED",
                    "END",
                    "LAG",
                ],
                &rows,
            );
            if !known {
                println!("(members unknown: this broker's Kafka listener is off)");
            }
        }
    }
    page_note(&body, items.len(), *offset);
    Ok(())
}

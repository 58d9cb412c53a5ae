//! The consume path's memory (`storage::segments::cache`): committed segments kept by the broker and the
//! lease ranges it handed out. The cache only saves reading frames; PostgreSQL still decides
//! what exists and who holds a lease. Proven here: a segment removed by retention is not
//! delivered from the cache, data written by another broker is read and served correctly, a
//! lease that ran out while its messages are cached is redelivered and its old lease refused,
//! the one-statement ack agrees with the general path, and it finds its messages by the
//! transaction ids the pop recorded when no segment is cached; pops count what they took from
//! the cache and what they read.

use crate::support::consuming::*;
use crate::support::{fresh_db, spawn_app, spawn_app_with, test_settings, Reply, TestApp, TestDb};
use queen_broker::storage::consume::acks::{plan_completed_fast, Ack, AckStatus};
use serde_json::{json, Value};

#[actix_web::test]
async fn a_segment_removed_by_retention_is_not_served_from_the_cache() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // A consumer is waiting on the queue, so the committer keeps both segments in the cache.
    assert_eq!(pop(&app, "q", "batch=10").await.status, 204);
    push_n(&app, "q", "p", 0, 3).await;
    push_n(&app, "q", "p", 3, 3).await;
    let pid = partition_id(&db, "p").await;
    assert!(app.broker.state.cache.get(pid, 0).is_some());
    assert!(app.broker.state.cache.get(pid, 3).is_some());

    // Retention removes the first segment (as the sweep does: whole segments, oldest first).
    db.exec(&format!(
        "DELETE FROM queen.segments WHERE partition_id = {pid} AND base_offset = 0"
    ))
    .await;
    let reply = pop(&app, "q", "batch=10").await;
    assert_eq!(
        ns(&reply),
        vec![3, 4, 5],
        "only what PostgreSQL still holds"
    );
    let acked = ack_all(&app, &reply, "completed", None).await;
    assert!(all_succeeded(&acked), "{acked}");
    assert_eq!(pop(&app, "q", "batch=10").await.status, 204);
}

#[actix_web::test]
async fn messages_written_through_another_broker_are_read_and_acked_here() {
    let db = fresh_db().await;
    let writer = spawn_app(&db).await;
    let reader = spawn_app(&db).await;
    assert_eq!(pop(&writer, "q", "batch=10").await.status, 204);
    push_n(&writer, "q", "p", 0, 5).await;
    let pid = partition_id(&db, "p").await;
    assert!(reader.broker.state.cache.get(pid, 0).is_none());

    let reply = pop(&reader, "q", "batch=3").await;
    assert_eq!(ns(&reply), vec![0, 1, 2]);
    // The reader read the segment from PostgreSQL and now holds it.
    assert!(reader.broker.state.cache.get(pid, 0).is_some());
    let acked = ack_all(&reader, &reply, "completed", None).await;
    assert_eq!(acked[2]["leaseReleased"], true);

    // The rest, popped on the writer (cached there at commit: it had a pop of the queue) and
    // acked on the reader,
    // which did not hand that lease out: the general path decides.
    // The reader's ack ended its lease whole, so the reader claimed the partition ahead for
    // its own next pop (src/storage/consume/ahead.rs); no pop there takes it, and it is
    // released after QUEEN_POP_AHEAD_MS (longer on a loaded machine). The writer's pops find
    // nothing until then.
    let asked = std::time::Instant::now();
    let rest = loop {
        let r = pop(&writer, "q", "batch=10").await;
        if r.status != 204 {
            break r;
        }
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(10),
            "the rest was not delivered on the writer within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(ns(&rest), vec![3, 4]);
    let acked = ack_all(&reader, &rest, "completed", None).await;
    assert!(all_succeeded(&acked), "{acked}");
    assert_eq!(pop(&reader, "q", "batch=10").await.status, 204);
    assert_eq!(pop(&writer, "q", "batch=10").await.status, 204);
}

#[actix_web::test]
async fn a_lease_that_ran_out_while_cached_is_redelivered_and_its_acks_refused() {
    lease_runs_out("8388608", true).await;
}

/// A lease that runs out while this broker still remembers it — its segments cached
/// (`segments_held`) or, with a cache too small for any segment, only the transaction ids the
/// pop recorded: PostgreSQL says it ended, so its acks are refused and the next pop gets its
/// messages again, from the same bytes.
async fn lease_runs_out(cache_bytes: &str, segments_held: bool) {
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(
        &db,
        &[("QUEEN_SEGMENT_CACHE_BYTES", cache_bytes)],
    ))
    .await;
    assert_eq!(pop(&app, "q", "batch=4").await.status, 204);
    push_n(&app, "q", "p", 0, 4).await;
    let pid = partition_id(&db, "p").await;
    assert_eq!(app.broker.state.cache.get(pid, 0).is_some(), segments_held);
    let first = pop(&app, "q", "batch=4").await;
    assert_eq!(ns(&first), vec![0, 1, 2, 3]);
    db.exec("UPDATE queen.partition_consumers SET lease_expires_at = now() - interval '1 second'")
        .await;

    // The broker would plan the ack; PostgreSQL refuses it.
    assert!(
        plan_completed_fast(&app.broker.state.cache, &acks_of(&first))
            .unwrap()
            .is_some()
    );
    let late = ack_all(&app, &first, "completed", None).await;
    for a in late.as_array().unwrap() {
        assert_eq!(a["success"], false, "{a}");
        assert_eq!(a["error"], "Invalid or expired lease");
    }
    let again = pop(&app, "q", "batch=4").await;
    assert_eq!(ns(&again), vec![0, 1, 2, 3]);
    assert_eq!(messages(&again)[0]["data"], messages(&first)[0]["data"]);
    assert_ne!(again.body["leaseId"], first.body["leaseId"]);
    let acked = ack_all(&app, &again, "completed", None).await;
    assert!(all_succeeded(&acked), "{acked}");
    assert_eq!(consumer_state(&db).await["committed"], 4);
    assert_eq!(pop(&app, "q", "batch=4").await.status, 204);
}

#[actix_web::test]
async fn pops_count_the_segments_they_took_from_the_cache_and_those_they_read() {
    let db = fresh_db().await;
    let writer = spawn_app(&db).await;
    let reader = spawn_app(&db).await;
    assert_eq!(pop(&writer, "q", "batch=10").await.status, 204);
    push_n(&writer, "q", "p", 0, 5).await;

    // The writer kept the segment when it committed it: its pop takes it from memory.
    let reply = pop(&writer, "q", "batch=2").await;
    assert_eq!(ns(&reply), vec![0, 1]);
    assert!(all_succeeded(
        &ack_all(&writer, &reply, "completed", None).await
    ));
    let w = writer.broker.state.cache.reads();
    assert!(w.hits >= 1 && w.misses == 0, "{w:?}");

    // The reader never saw it: its first pop reads it from PostgreSQL, its next one (of the
    // rest of the same segment) takes the copy it kept.
    let reply = pop(&reader, "q", "batch=2").await;
    assert_eq!(ns(&reply), vec![2, 3]);
    assert!(all_succeeded(
        &ack_all(&reader, &reply, "completed", None).await
    ));
    let first = reader.broker.state.cache.reads();
    assert!(first.misses >= 1 && first.hits == 0, "{first:?}");
    let reply = pop(&reader, "q", "batch=2").await;
    assert_eq!(ns(&reply), vec![4]);
    let next = reader.broker.state.cache.reads();
    assert_eq!(next.misses, first.misses, "{next:?}");
    assert!(next.hits >= 1, "{next:?}");

    // The scrape reports the same counts.
    let (status, text) = reader.get_text("/metrics/prometheus").await;
    assert_eq!(status, 200);
    for (result, n) in [("hit", next.hits), ("miss", next.misses)] {
        let line = format!("queen_segment_cache_reads_total{{result=\"{result}\"}} {n}");
        assert!(text.contains(&line), "missing {line:?}");
    }
}

#[actix_web::test]
async fn only_queues_consumed_on_this_broker_fill_the_cache() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // Nobody pops "quiet" here: its segments are not copied into the cache.
    push_n(&app, "quiet", "p", 0, 3).await;
    let quiet = partition_id(&db, "p").await;
    assert!(app.broker.state.cache.get(quiet, 0).is_none());
    assert_eq!(app.broker.state.cache.bytes(), 0);

    // A pop of "busy" (empty so far) makes its next segments kept, and only its.
    assert_eq!(pop(&app, "busy", "batch=10").await.status, 204);
    push_n(&app, "busy", "b", 0, 3).await;
    push_n(&app, "quiet", "p", 3, 3).await;
    let busy = partition_id(&db, "b").await;
    assert!(app.broker.state.cache.get(busy, 0).is_some());
    assert!(app.broker.state.cache.get(quiet, 3).is_none());

    // Both queues still deliver everything, the quiet one from PostgreSQL.
    let reply = pop(&app, "quiet", "batch=10").await;
    assert_eq!(ns(&reply), vec![0, 1, 2, 3, 4, 5]);
    let reply = pop(&app, "busy", "batch=10").await;
    assert_eq!(ns(&reply), vec![0, 1, 2]);
}

/// The consumer rows of partition `p`, as the ack leaves them.
async fn consumer_state(db: &TestDb) -> Value {
    let mut conn = db.conn().await;
    let row: (i64, Option<bool>, i32, i64, bool) = sqlx::query_as(
        "SELECT committed_offset, lease_expires_at > now(), batch_retry_count, total_consumed,
                attention_at IS NOT NULL
           FROM queen.partition_consumers",
    )
    .fetch_one(&mut conn)
    .await
    .expect("consumer row");
    json!({"committed": row.0, "live": row.1, "retries": row.2, "total": row.3, "attention": row.4})
}

/// Pushes 6, pops 4, acks the 2nd then the 4th (batch route), pushes 2 more, and returns
/// every ack answer and the consumer row after each step.
async fn ack_story(app: &TestApp, db: &TestDb) -> Vec<Value> {
    push_n(app, "q", "p", 0, 6).await;
    let reply = pop(app, "q", "batch=4").await;
    let ms = messages(&reply);
    let mut seen = Vec::new();
    seen.push(ack_one(app, &ms[1], "completed", None).await);
    seen.push(consumer_state(db).await);
    // Acking an already committed message again changes nothing and succeeds.
    seen.push(ack_one(app, &ms[0], "completed", None).await);
    seen.push(consumer_state(db).await);
    let rest = json!([
        {"transactionId": ms[2]["transactionId"], "partitionId": ms[2]["partitionId"], "leaseId": ms[2]["leaseId"]},
        {"transactionId": ms[3]["transactionId"], "partitionId": ms[3]["partitionId"], "leaseId": ms[3]["leaseId"]},
    ]);
    let r = app
        .post("/api/v1/ack/batch", &json!({ "acknowledgments": rest }))
        .await;
    seen.push(r.body.clone());
    // Whether the partition is already leased again right after this answer depends on timing
    // on the cached path (the grouped statement's claim ahead for the next pop of 4 may have
    // landed or not), so the lease columns are compared apart from the offsets (below).
    let mut state = consumer_state(db).await;
    let lease = json!({"live": state["live"].take(), "attention": state["attention"].take()});
    seen.push(state);
    seen.push(lease);
    // The batch ack ended the lease through the grouped statement, which claims the partition
    // ahead for the next pop of 4; this pop asks for 10, so it leaves that lease and waits until
    // the hold (QUEEN_POP_AHEAD_MS) gives the partition back.
    seen.push(json!(ns(
        &pop(app, "q", "batch=10&wait=true&timeout=3000").await
    )));
    for v in &mut seen {
        strip_ids(v);
    }
    seen
}

/// [`ack_story`] on a fresh broker whose segment cache holds `cache_bytes` (`None`: the
/// default).
async fn story_with_cache(cache_bytes: Option<&str>) -> Vec<Value> {
    let db = fresh_db().await;
    let app = match cache_bytes {
        Some(bytes) => {
            spawn_app_with(test_settings(&db, &[("QUEEN_SEGMENT_CACHE_BYTES", bytes)])).await
        }
        None => spawn_app(&db).await,
    };
    ack_story(&app, &db).await
}

/// Drops the fields that differ between two runs (generated ids).
fn strip_ids(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("transactionId");
            map.values_mut().for_each(strip_ids);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_ids),
        _ => {}
    }
}

#[actix_web::test]
async fn the_one_statement_ack_answers_as_the_general_path_does() {
    let with_cache = story_with_cache(None).await;
    // A broker without a cache takes the general path for every ack.
    let without = story_with_cache(Some("0")).await;
    let lease_after_batch = |story: &mut Vec<Value>| story.remove(6);
    let (mut with_cache, mut without) = (with_cache, without);
    let cached_lease = lease_after_batch(&mut with_cache);
    let general_lease = lease_after_batch(&mut without);
    assert_eq!(with_cache, without);
    // And the story is the expected one: the second message commits the first two; the last
    // ack of the batch ends the lease; the two left come next.
    assert_eq!(with_cache[1]["committed"], 2);
    assert_eq!(with_cache[5]["committed"], 4);
    assert_eq!(with_cache[4][1]["leaseReleased"], true);
    assert_eq!(with_cache[6], json!([4, 5]));
    // The general path ends the lease and flags the partition for attention (messages left);
    // the cached path does too, unless its claim ahead already holds it for the next pop.
    assert_eq!(general_lease, json!({"live": null, "attention": true}));
    assert!(
        cached_lease == json!({"live": null, "attention": true})
            || cached_lease == json!({"live": true, "attention": false}),
        "{cached_lease}"
    );
}

#[actix_web::test]
async fn the_pop_answer_is_valid_json_with_every_field_escaped_and_the_payload_verbatim() {
    let db = fresh_db().await;
    let app = spawn_app(&db).await;
    // Quotes, backslashes, control characters and non-ASCII in every string the answer
    // writes; a payload whose exact bytes (spacing, escapes, key order) must come back.
    let payload = r#"{ "z":1,"a" : [1.10, "\u0000\"q\"\\"], "ü": null }"#;
    let body = format!(
        r#"{{"items":[{{"queue":"q","partition":"p \"1\" \\ é","transactionId":"t\"x\n\u0001","traceId":"tr\"ace","payload":{payload}}}]}}"#
    );
    let pushed = app.post_raw("/api/v1/push", body.into_bytes()).await;
    assert_eq!(pushed.status, 201, "{:?}", pushed.body);

    let raw = get_raw(&app, "/api/v1/pop/queue/q?batch=5").await;
    assert_eq!(raw.status, 200);
    let text = String::from_utf8(raw.body.clone()).expect("utf-8");
    assert!(text.contains(payload), "payload not verbatim in {text}");
    let v: Value = serde_json::from_slice(&raw.body).expect("the answer is JSON");
    let m = &v["messages"][0];
    assert_eq!(m["transactionId"], "t\"x\n\u{1}");
    assert_eq!(m["partition"], "p \"1\" \\ é");
    assert_eq!(v["partition"], "p \"1\" \\ é");
    // `/push` ignores a traceId in the body (reference/producing.md); only `/transaction` sets it.
    assert_eq!(m["traceId"], Value::Null);
    assert_eq!(m["producerSub"], Value::Null);
    assert_eq!(m["data"]["a"][1], "\u{0}\"q\"\\");
    assert_eq!(m["queue"], "q");
    assert_eq!(m["retryCount"], 0);
    assert_eq!(m["leaseId"], v["leaseId"]);
    assert_eq!(m["partitionId"], v["partitionId"]);
    assert_eq!(v["partitionsClaimed"], 1);
    assert_eq!(v["success"], true);
    let created = m["createdAt"].as_str().expect("createdAt");
    assert_eq!(
        created.len(),
        "2023-11-14T22:13:20.123456Z".len(),
        "{created}"
    );
    assert!(created.ends_with('Z'));
}

/// The acks of `reply`'s messages as the ack routes read them (all `completed`).
fn acks_of(reply: &Reply) -> Vec<Ack> {
    messages(reply)
        .iter()
        .enumerate()
        .map(|(index, m)| Ack {
            index,
            partition: m["partitionId"].as_str().unwrap().parse().unwrap(),
            partition_number: None,
            transaction_id: m["transactionId"].as_str().unwrap().to_string(),
            status: AckStatus::Completed,
            group: m["consumerGroup"].as_str().unwrap().to_string(),
            lease_id: m["leaseId"].as_str().map(str::to_string),
            error: None,
        })
        .collect()
}

#[actix_web::test]
async fn acks_find_their_messages_by_the_ids_the_pop_recorded_without_any_segment() {
    // A one-byte cache keeps no segment (each is larger), but the broker still records the
    // transaction ids its pops hand out.
    let db = fresh_db().await;
    let app = spawn_app_with(test_settings(&db, &[("QUEEN_SEGMENT_CACHE_BYTES", "1")])).await;
    assert_eq!(pop(&app, "q", "batch=10").await.status, 204);
    push_n(&app, "q", "p", 0, 5).await;
    let pid = partition_id(&db, "p").await;
    let reply = pop(&app, "q", "batch=3").await;
    assert_eq!(ns(&reply), vec![0, 1, 2]);
    assert!(app.broker.state.cache.get(pid, 0).is_none());
    let cache = &app.broker.state.cache;
    assert!(cache.lease_id_bytes() > 0);

    // The one-statement ack is planned from the ids alone: all three, in order or not.
    let acks = acks_of(&reply);
    let plan = plan_completed_fast(cache, &acks)
        .unwrap()
        .expect("a fast plan");
    assert_eq!((plan.ack.from, plan.ack.end, plan.ack.to), (0, 3, 3));
    let reversed: Vec<Ack> = acks.iter().rev().cloned().collect();
    let plan = plan_completed_fast(cache, &reversed)
        .unwrap()
        .expect("a fast plan");
    assert_eq!(plan.ack.end, 3);
    let first_two = plan_completed_fast(cache, &acks[..2])
        .unwrap()
        .expect("a fast plan");
    assert_eq!(first_two.ack.end, 2);
    // An id the lease did not hand out is for the general path to answer.
    let mut stranger = acks.clone();
    stranger[1].transaction_id = "not-in-this-lease".into();
    assert!(plan_completed_fast(cache, &stranger).unwrap().is_none());

    // Applied, it ends the lease, and the broker forgets the ids with it.
    let acked = ack_all(&app, &reply, "completed", None).await;
    assert!(all_succeeded(&acked), "{acked}");
    assert_eq!(acked[2]["leaseReleased"], true);
    assert_eq!(cache.lease_id_bytes(), 0);
    assert!(plan_completed_fast(cache, &acks).unwrap().is_none());
    assert_eq!(consumer_state(&db).await["committed"], 3);
    assert_eq!(ns(&pop(&app, "q", "batch=10").await), vec![3, 4]);
}

#[actix_web::test]
async fn the_ack_by_recorded_ids_answers_as_the_general_path_does() {
    // A one-byte cache holds no segment: every fast ack is planned from the recorded ids.
    assert_eq!(
        story_with_cache(Some("1")).await,
        story_with_cache(Some("0")).await
    );
}

#[actix_web::test]
async fn a_lease_that_ran_out_keeps_no_say_through_its_recorded_ids() {
    lease_runs_out("1", false).await;
}

/// Every message of queue `q` a group's pops of one segment each (autoAck) hand out, in order.
async fn read_all(app: &TestApp, group: &str) -> Vec<i64> {
    let mut seen = Vec::new();
    loop {
        let reply = pop(
            app,
            "q",
            &format!("consumerGroup={group}&batch=5&autoAck=true"),
        )
        .await;
        if reply.status == 204 {
            return seen;
        }
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        seen.extend(ns(&reply));
    }
}

#[actix_web::test]
async fn groups_further_apart_than_the_budget_grow_it_until_each_segment_is_read_once() {
    let db = fresh_db().await;
    // Written through a broker nobody pops from, so no segment is cached at commit.
    let writer = spawn_app(&db).await;
    for k in 0..8 {
        push_n(&writer, "q", "p", k * 5, 5).await;
    }
    let mut conn = db.conn().await;
    let largest: i32 = sqlx::query_scalar("SELECT max(length(frames)) FROM queen.segments")
        .fetch_one(&mut conn)
        .await
        .expect("segment sizes");
    // A base that holds one of the eight segments (each costs its frames plus some bookkeeping),
    // a ceiling that holds them all.
    let base = (largest + 200).to_string();
    let app = spawn_app_with(test_settings(
        &db,
        &[
            ("QUEEN_SEGMENT_CACHE_BYTES", base.as_str()),
            ("QUEEN_SEGMENT_CACHE_MAX_BYTES", "1048576"),
        ],
    ))
    .await;
    let cache = &app.broker.state.cache;
    let all: Vec<i64> = (0..40).collect();

    // The first group reads every segment from PostgreSQL once: nothing read twice, no growth.
    assert_eq!(read_all(&app, "a").await, all);
    let after_a = cache.reads();
    assert_eq!((after_a.misses, after_a.rereads), (8, 0), "{after_a:?}");
    assert_eq!(cache.budget(), base.parse::<usize>().unwrap());

    // The second group, the whole queue behind, reads again what the base could not hold: each
    // such read grows the budget.
    assert_eq!(read_all(&app, "b").await, all);
    let after_b = cache.reads();
    assert!(after_b.rereads >= 1, "{after_b:?}");
    assert_eq!(after_b.rereads, after_b.misses - 8, "{after_b:?}");
    assert!(
        cache.budget() > 8 * base.parse::<usize>().unwrap() / 2,
        "budget {} after {after_b:?}",
        cache.budget()
    );

    // A third group finds every segment held: PostgreSQL sends none of them again.
    assert_eq!(read_all(&app, "c").await, all);
    assert_eq!(cache.reads().misses, after_b.misses, "{:?}", cache.reads());
    assert!(cache.bytes() <= cache.budget());
}

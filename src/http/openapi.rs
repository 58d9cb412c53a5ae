//! The OpenAPI 3.1 document of the HTTP API, served at `GET /api/v1/openapi.json`.
//!
//! Its paths are generated from the route table (`http::routes`), so a route added there is
//! in the document with no other change: method, path, path parameters, who may call it (the
//! route's capability, as the bearer requirement and the `x-capability` extension). The
//! request and response shapes of the main routes (push, pop, ack, ack/batch, transaction,
//! configure) are written here, in one place, as JSON Schema; every other route is described
//! as "a JSON answer" (outside `/api/`: any content, e.g. the dashboard's pages) until its shape
//! is written here too. Every operation lists its errors
//! (`{"error": text}`) as the `default` response.

use actix_web::http::Method;
use serde_json::{json, Map, Value};

use crate::http::Capability;
use crate::http::Route;

/// The document's `info.version`: the broker's version.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A queue, partition, group, namespace or task name (reference §1: at most 255 characters;
/// PostgreSQL text holds no NUL).
fn name() -> Value {
    json!({ "type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^\\u0000]+$" })
}

/// Text stored by the broker (no NUL).
fn text() -> Value {
    json!({ "type": "string", "maxLength": 255, "pattern": "^[^\\u0000]*$" })
}

/// The reusable schemas (`components.schemas`).
fn schemas() -> Value {
    json!({
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": { "type": "string" },
                "code": { "type": "string" },
                "reason": { "type": "string", "description": "2.x surfaces: the stable id of the broken rule" },
                "detail": { "type": "string", "description": "2.x surfaces: what is wrong" },
            },
        },
        "Name": name(),
        "History": {
            "type": "object",
            "description": "the broker's last samples (QUEEN_HISTORY_INTERVAL_MS apart, at most `capacity`) as columns aligned with `at`; null where a value does not exist (the first sample's rates, an interval without commits, a pair not among the largest backlogs then)",
            "required": ["enabled", "recording", "intervalSeconds", "capacity", "queuesPerSample", "queuesError",
                         "at", "pushedPerSecond", "poppedPerSecond", "ackedPerSecond", "spoolBytes",
                         "commitP50Seconds", "commitP99Seconds", "queues"],
            "properties": {
                "enabled": { "type": "boolean", "description": "false: QUEEN_HISTORY_INTERVAL_MS=0" },
                "recording": { "type": "boolean", "description": "false: QUEEN_METRICS=false, no rates or latencies" },
                "intervalSeconds": { "type": "number" },
                "capacity": { "type": "integer" },
                "queuesPerSample": { "type": "integer" },
                "queuesError": { "type": ["string", "null"], "description": "why the newest sample has no backlogs" },
                "at": { "type": "array", "items": { "type": "integer" }, "description": "Unix milliseconds" },
                "pushedPerSecond": { "type": "array", "items": { "type": ["number", "null"] } },
                "poppedPerSecond": { "type": "array", "items": { "type": ["number", "null"] } },
                "ackedPerSecond": { "type": "array", "items": { "type": ["number", "null"] } },
                "spoolBytes": { "type": "array", "items": { "type": "integer" } },
                "commitP50Seconds": { "type": "array", "items": { "type": ["number", "null"] } },
                "commitP99Seconds": { "type": "array", "items": { "type": ["number", "null"] } },
                "queues": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["queue", "consumerGroup", "backlog", "oldestSeconds"],
                        "properties": {
                            "queue": { "type": "string" },
                            "consumerGroup": { "type": "string" },
                            "backlog": { "type": "array", "items": { "type": ["integer", "null"] } },
                            "oldestSeconds": { "type": "array", "items": { "type": ["number", "null"] } },
                        },
                    },
                },
            },
        },
        "PushItem": {
            "type": "object",
            "required": ["queue", "payload"],
            "properties": {
                "queue": name(),
                "partition": { "anyOf": [name(), { "type": "null" }] },
                "payload": { "description": "any JSON value, stored and popped back verbatim" },
                "transactionId": { "anyOf": [text(), { "type": "null" }] },
            },
        },
        "PushRequest": {
            "type": "object",
            "required": ["items"],
            "properties": {
                "items": { "type": "array", "items": { "$ref": "#/components/schemas/PushItem" } },
            },
        },
        "PushResult": {
            "type": "object",
            "required": ["index", "message_id", "transaction_id", "queueName", "status"],
            "properties": {
                "index": { "type": "integer", "minimum": 0 },
                "message_id": { "type": "string", "format": "uuid" },
                "transaction_id": { "type": "string" },
                "queueName": { "type": "string" },
                "status": { "enum": ["queued", "duplicate", "buffered", "failed"] },
            },
        },
        "PushResponse": { "type": "array", "items": { "$ref": "#/components/schemas/PushResult" } },
        "Message": {
            "type": "object",
            "required": ["id", "transactionId", "partitionId", "partition", "queue", "leaseId",
                         "consumerGroup", "createdAt", "data", "producerSub", "traceId", "retryCount"],
            "properties": {
                "id": { "type": "string", "format": "uuid" },
                "transactionId": { "type": "string" },
                "partitionId": { "type": "string", "format": "uuid" },
                "partition": { "type": "string" },
                "queue": { "type": "string" },
                "leaseId": { "type": "string" },
                "consumerGroup": { "type": "string" },
                "createdAt": { "type": "string" },
                "data": { "description": "the pushed payload, verbatim" },
                "producerSub": { "type": ["string", "null"] },
                "traceId": { "type": ["string", "null"] },
                "retryCount": { "type": "integer" },
            },
        },
        "PopEcho": {
            "type": "object",
            "description": "what a 2.x pop answer says beyond its messages (reference §2.8)",
            "properties": {
                "autopilot": {
                    "type": "object",
                    "description": "present when the pop sent autopilot=true: the knobs it ran with and the wait advised after an empty pop (0: no advice)",
                    "required": ["partitions", "batch", "waitMs"],
                    "properties": {
                        "partitions": { "type": "integer", "minimum": 1 },
                        "batch": { "type": "integer", "minimum": 1 },
                        "waitMs": { "type": "integer", "minimum": 0 },
                    },
                },
                "conflation": { "const": true, "description": "the pop was served as the group's conflating policy says" },
                "conflationConflict": { "const": true, "description": "the pop asked for conflation, the group's stored policy does not conflate (it wins)" },
            },
        },
        "PopResponse": {
            "anyOf": [
                {
                    "allOf": [{ "$ref": "#/components/schemas/PopEcho" }],
                    "type": "object",
                    "required": ["success", "queue", "partition", "partitionId", "leaseId",
                                 "consumerGroup", "messages", "partitionsClaimed"],
                    "properties": {
                        "success": { "const": true },
                        "queue": { "type": "string" },
                        "partition": { "type": "string" },
                        "partitionId": { "type": "string", "format": "uuid" },
                        "leaseId": { "type": "string", "description": "empty with autoAck" },
                        "consumerGroup": { "type": "string" },
                        "messages": { "type": "array", "items": { "$ref": "#/components/schemas/Message" } },
                        "partitionsClaimed": { "type": "integer", "minimum": 1 },
                    },
                },
                {
                    "allOf": [{ "$ref": "#/components/schemas/PopEcho" }],
                    "type": "object",
                    "description": "nothing handed out, with an echo to say (autopilot, conflation); without one the answer is a 204",
                    "required": ["success", "messages", "partitionsClaimed"],
                    "properties": {
                        "success": { "const": true },
                        "messages": { "type": "array", "maxItems": 0 },
                        "partitionsClaimed": { "const": 0 },
                    },
                },
            ],
        },
        "Ack": {
            "type": "object",
            "required": ["transactionId", "partitionId"],
            "properties": {
                "transactionId": text(),
                "partitionId": {
                    "description": "the partition's UUID, or its 64-bit id in decimal (a framed pop's partitionId; any id up to 9223372036854775807)",
                    "anyOf": [
                        { "type": "string", "format": "uuid" },
                        { "type": "string", "pattern": "^[1-9][0-9]{0,17}$" },
                    ],
                },
                "status": { "enum": ["completed", "success", "failed", "dlq", "retry"] },
                "consumerGroup": { "anyOf": [name(), { "type": "null" }] },
                "leaseId": { "anyOf": [text(), { "type": "null" }] },
                "error": { "anyOf": [text(), { "type": "null" }] },
            },
        },
        "AckBatchRequest": {
            "type": "object",
            "required": ["acknowledgments"],
            "properties": {
                "acknowledgments": { "type": "array", "items": { "$ref": "#/components/schemas/Ack" } },
                "consumerGroup": { "anyOf": [name(), { "type": "null" }] },
            },
        },
        "AckResult": {
            "type": "object",
            "required": ["index", "transactionId", "success"],
            "properties": {
                "index": { "type": "integer", "minimum": 0 },
                "transactionId": { "type": "string" },
                "success": { "type": "boolean" },
                "error": { "type": ["string", "null"] },
                "queueName": { "type": ["string", "null"] },
                "partitionName": { "type": ["string", "null"] },
                "leaseReleased": { "type": "boolean" },
                "dlq": { "type": "boolean" },
                "noop": {
                    "const": true,
                    "description": "present only when true: the message was already below the group's committed offset, nothing changed",
                },
            },
        },
        "AckResponse": { "type": "array", "items": { "$ref": "#/components/schemas/AckResult" } },
        "LeaseExtendResult": {
            "type": "object",
            "required": ["index", "leaseId", "success", "error", "renewed", "newExpiresAt",
                         "expiresAt", "lease_expires_at"],
            "properties": {
                "index": { "const": 0 },
                "leaseId": { "type": "string" },
                "success": { "type": "boolean" },
                "error": { "type": ["string", "null"] },
                "renewed": {
                    "type": "integer", "minimum": 0,
                    "description": "partitions whose lease was extended (0: nothing was)",
                },
                "newExpiresAt": { "type": ["string", "null"], "description": "the new expiry, null when nothing was renewed" },
                "expiresAt": { "type": ["string", "null"], "description": "the same as newExpiresAt" },
                "lease_expires_at": { "type": ["string", "null"], "description": "the same as newExpiresAt" },
            },
        },
        "LeaseExtendResponse": {
            "type": "array",
            "items": { "$ref": "#/components/schemas/LeaseExtendResult" },
            "minItems": 1,
            "maxItems": 1,
        },
        "TransactionRequest": {
            "type": "object",
            "required": ["operations"],
            "properties": {
                "operations": {
                    "type": "array",
                    "description": "may be empty when a kv rider is present",
                    "items": { "oneOf": [
                        {
                            "type": "object",
                            "required": ["type", "items"],
                            "properties": {
                                "type": { "const": "push" },
                                "items": { "type": "array", "items": {
                                    "allOf": [{ "$ref": "#/components/schemas/PushItem" }],
                                    "properties": { "traceId": { "anyOf": [text(), { "type": "null" }] } },
                                } },
                            },
                        },
                        {
                            "allOf": [{ "$ref": "#/components/schemas/Ack" }],
                            "type": "object",
                            "required": ["type"],
                            "properties": { "type": { "const": "ack" } },
                        },
                    ] },
                },
                "requiredLeases": { "type": "array", "items": { "type": "string" } },
                "kv": { "type": "array", "items": { "$ref": "#/components/schemas/KvOp" },
                        "description": "KV ops in the same transaction (no getPrefix)" },
                "timers": { "type": "array", "items": { "type": "object" },
                            "description": "refused (400 timers_bad_request) until timers are available" },
            },
        },
        "KvOp": {
            "type": "object",
            "required": ["op", "ns"],
            "properties": {
                "op": { "enum": ["get", "getMany", "getPrefix", "put", "putIfAbsent", "delete", "incr", "check"] },
                "ns": { "type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$" },
                "key": { "type": "string", "minLength": 1 },
                "keys": { "type": "array", "items": { "type": "string" } },
                "prefix": { "type": "string", "minLength": 1 },
                "after": { "type": "string" },
                "limit": { "type": "integer" },
                "keysOnly": { "type": "boolean" },
                "value": { "description": "any JSON value (null included)" },
                "ttlSeconds": { "type": "integer", "minimum": 1 },
                "forever": { "const": true },
                "expect": { "type": "integer", "minimum": 0 },
                "required": { "type": "boolean" },
                "delta": { "type": "number" },
                "min": { "type": "number" },
                "max": { "type": "number" },
            },
        },
        "KvRequest": {
            "type": "object",
            "required": ["operations"],
            "properties": {
                "operations": { "type": "array", "minItems": 1, "maxItems": 1000,
                                "items": { "$ref": "#/components/schemas/KvOp" } },
            },
        },
        "KvResponse": {
            "type": "object",
            "required": ["results"],
            "properties": {
                "results": { "type": "array", "items": {
                    "type": "object", "required": ["index"],
                    "properties": { "index": { "type": "integer", "minimum": 0 } },
                } },
                "success": { "const": false },
                "reason": { "const": "kv_precondition" },
                "failedIndex": { "type": "integer" },
            },
        },
        "LocksRequest": {
            "type": "object",
            "required": ["operations"],
            "properties": {
                "operations": { "type": "array", "minItems": 1, "maxItems": 1000, "items": {
                    "type": "object",
                    "required": ["op", "name"],
                    "properties": {
                        "op": { "enum": ["acquire", "renew", "release", "get"] },
                        "name": { "type": "string", "minLength": 1 },
                        "ttlSeconds": { "type": "integer", "minimum": 1 },
                        "owner": { "type": "string", "minLength": 1 },
                        "limit": { "type": "integer", "minimum": 1, "maximum": 1024 },
                        "token": { "type": "integer", "minimum": 1 },
                        "slot": { "type": "integer", "minimum": 0 },
                    },
                } },
            },
        },
        "LocksResponse": {
            "type": "object",
            "required": ["results"],
            "properties": {
                "results": { "type": "array", "items": {
                    "type": "object", "required": ["index"],
                    "properties": { "index": { "type": "integer", "minimum": 0 } },
                } },
            },
        },
        "TransactionResponse": {
            "type": "object",
            "required": ["transactionId", "success", "results"],
            "properties": {
                "transactionId": { "type": "string" },
                "success": { "type": "boolean" },
                "error": { "type": ["string", "null"] },
                "reason": { "const": "kv_precondition" },
                "failedIndex": { "type": "integer" },
                "kvReason": { "enum": ["version", "absent", "exists", "limit", "type"] },
                "results": { "type": "array", "items": {
                    "type": "object",
                    "required": ["index", "type", "success"],
                    "properties": {
                        "index": { "type": "integer" },
                        "type": { "enum": ["push", "ack", "kv"] },
                        "success": { "type": "boolean" },
                    },
                } },
            },
        },
        "QueueOptions": {
            "type": "object",
            "properties": {
                "leaseTime": { "type": ["integer", "null"], "minimum": 0, "maximum": 2147483647 },
                "retryLimit": { "type": ["integer", "null"], "minimum": 0, "maximum": 2147483647 },
                "priority": { "type": ["integer", "null"], "minimum": 0, "maximum": 2147483647 },
                "delayedProcessing": { "type": ["integer", "null"], "minimum": 0, "maximum": 2147483647 },
                "windowBuffer": { "type": ["integer", "null"], "minimum": 0, "maximum": 2147483647 },
                "maxSize": { "type": ["integer", "null"], "minimum": 0, "maximum": 2147483647 },
                "retentionSeconds": { "type": ["integer", "null"], "minimum": 0, "maximum": 2147483647 },
                "completedRetentionSeconds": { "type": ["integer", "null"], "minimum": 0, "maximum": 2147483647 },
                "dedupWindowSeconds": { "type": ["integer", "null"], "minimum": 0, "maximum": 2147483647 },
                "encryptionEnabled": { "type": ["boolean", "null"] },
                "retentionEnabled": { "type": ["boolean", "null"] },
            },
        },
        "ConfigureRequest": {
            "type": "object",
            "required": ["queue"],
            "properties": {
                "queue": name(),
                "namespace": { "anyOf": [text(), { "type": "null" }] },
                "task": { "anyOf": [text(), { "type": "null" }] },
                "options": { "$ref": "#/components/schemas/QueueOptions" },
            },
        },
        "ConfigureResponse": {
            "type": "object",
            "required": ["configured", "queueId", "partitionId", "queue"],
            "properties": {
                "configured": { "const": true },
                "queueId": { "type": "string", "format": "uuid" },
                "partitionId": { "type": "string", "format": "uuid" },
                "queue": { "type": "string" },
                "namespace": { "type": "string" },
                "task": { "type": "string" },
                "options": { "type": "object" },
            },
        },
        "TimerOp": {
            "type": "object",
            "required": ["op", "queue", "timerKey"],
            "description": "schedule/reschedule need payload (base64 of JSON) and delayMs; docs/timers.md",
            "properties": {
                "op": { "enum": ["schedule", "reschedule", "cancel"] },
                "queue": name(),
                "timerKey": { "type": "string", "minLength": 1, "maxLength": 1024, "pattern": "^[^\\u0000]+$" },
                "payload": { "type": "string", "contentEncoding": "base64" },
                "delayMs": { "type": "integer", "minimum": -31622400000_i64, "maximum": 31622400000_i64 },
                "txn": { "anyOf": [name(), { "type": "null" }] },
                "partition": { "anyOf": [name(), { "type": "null" }] },
            },
        },
        "TimersRequest": {
            "type": "object",
            "required": ["operations"],
            "properties": {
                "operations": { "type": "array", "maxItems": 1000,
                                "items": { "$ref": "#/components/schemas/TimerOp" } },
            },
        },
        "TimersResponse": {
            "type": "object",
            "required": ["results"],
            "properties": {
                "results": { "type": "array", "items": {
                    "type": "object",
                    "required": ["ok", "status", "queue", "timerKey"],
                    "properties": {
                        "ok": { "type": "boolean" },
                        "status": { "enum": ["scheduled", "rescheduled", "cancelled", "absent", "too_late"] },
                        "queue": { "type": "string" },
                        "timerKey": { "type": "string" },
                        "txn": { "type": ["string", "null"] },
                        "messageId": { "type": "string", "format": "uuid" },
                        "deliverAt": { "type": "string" },
                    },
                } },
            },
        },
    })
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

/// The query of the three pop routes (reference §4.2).
fn pop_query() -> Vec<Value> {
    let q = |name: &str, schema: Value, description: &str| {
        json!({ "name": name, "in": "query", "required": false, "schema": schema,
                "description": description })
    };
    vec![
        q(
            "batch",
            json!({ "type": "integer", "minimum": 1, "maximum": 10000 }),
            "messages per pop (default 1, or the autopilot's choice with autopilot=true)",
        ),
        q(
            "partitions",
            json!({ "type": "integer", "minimum": 1, "maximum": 100 }),
            "partitions claimed at most (default 1, or the autopilot's choice with autopilot=true)",
        ),
        q(
            "wait",
            json!({ "type": "boolean" }),
            "long-poll until a message arrives or `timeout` passes",
        ),
        q(
            "timeout",
            json!({ "type": "integer", "minimum": 0, "maximum": 30000 }),
            "long-poll limit in ms (default 30000)",
        ),
        q(
            "consumerGroup",
            name(),
            "consumer group (default: queue mode)",
        ),
        q(
            "autoAck",
            json!({ "type": "boolean" }),
            "commit the cursor at once, no lease",
        ),
        q(
            "subscriptionMode",
            json!({ "enum": ["all", "new", "new-only"] }),
            "where a new group starts",
        ),
        q(
            "subscriptionFrom",
            json!({ "type": "string" }),
            "`now` or an RFC 3339 time: where a new group starts",
        ),
        q(
            "autopilot",
            json!({ "type": "boolean" }),
            "the broker sizes `batch` and `partitions` when they are left out, and echoes `autopilot` (2.x)",
        ),
        q(
            "conflation",
            json!({ "type": "boolean" }),
            "last-value delivery for the group (2.x; 400 without consumerGroup or with autoAck)",
        ),
        q(
            "leaseSeconds",
            json!({ "type": "integer", "minimum": 1, "maximum": 86400 }),
            "this pop's lease length in seconds instead of the queue's (2.x; 400 outside 1..86400)",
        ),
    ]
}

/// What is written here about one route: (request body schema, success status, success
/// schema, extra parameters).
struct Shape {
    request: Option<Value>,
    success: &'static str,
    response: Value,
    parameters: Vec<Value>,
}

/// The shapes of the main routes; `None` for a route described only generically.
fn shape(method: &Method, path: &str) -> Option<Shape> {
    let s = |request: Option<&str>, success, response: &str| Shape {
        request: request.map(schema_ref),
        success,
        response: json_content(schema_ref(response)),
        parameters: Vec::new(),
    };
    let pop = || {
        let mut shape = s(None, "200", "PopResponse");
        shape.parameters = pop_query();
        shape
    };
    Some(match (method.as_str(), path) {
        ("POST", "/api/v1/push") => s(Some("PushRequest"), "201", "PushResponse"),
        ("POST", "/api/v1/ack") => s(Some("Ack"), "200", "AckResponse"),
        ("POST", "/api/v1/ack/batch") => s(Some("AckBatchRequest"), "200", "AckResponse"),
        ("POST", "/api/v1/lease/{lease_id}/extend") => Shape {
            // The body is optional: `{}`, none, or `{"seconds": n}`.
            request: None,
            success: "200",
            response: json_content(schema_ref("LeaseExtendResponse")),
            parameters: Vec::new(),
        },
        ("POST", "/api/v1/transaction") => {
            s(Some("TransactionRequest"), "200", "TransactionResponse")
        }
        ("POST", "/api/v1/configure") => s(Some("ConfigureRequest"), "200", "ConfigureResponse"),
        ("POST", "/api/v1/kv") => s(Some("KvRequest"), "200", "KvResponse"),
        ("POST", "/api/v1/locks") => s(Some("LocksRequest"), "200", "LocksResponse"),
        ("POST", "/api/v1/timers") => s(Some("TimersRequest"), "200", "TimersResponse"),
        ("GET", "/api/v1/system/history") => {
            let mut shape = s(None, "200", "History");
            shape.parameters.push(json!({
                "name": "queue", "in": "query", "schema": name(),
                "description": "only this queue's (queue, consumer group) series",
            }));
            shape
        }
        ("GET", "/api/v1/pop/queue/{queue}")
        | ("GET", "/api/v1/pop/queue/{queue}/partition/{partition}") => pop(),
        ("GET", "/api/v1/pop") => {
            let mut shape = pop();
            shape
                .parameters
                .push(json!({ "name": "namespace", "in": "query", "schema": text() }));
            shape
                .parameters
                .push(json!({ "name": "task", "in": "query", "schema": text() }));
            shape
        }
        _ => return streams_shape(method, path),
    })
}

/// `{a}` segments of an actix path, with any `:regex` removed: (OpenAPI path, names).
pub fn openapi_path(path: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut names = Vec::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').map_or(rest.len(), |c| open + c);
        let inner = &rest[open + 1..close];
        let name = inner.split(':').next().unwrap_or(inner).to_string();
        out.push_str(&format!("{{{name}}}"));
        names.push(name);
        rest = rest.get(close + 1..).unwrap_or("");
    }
    out.push_str(rest);
    (out, names)
}

fn capability_name(c: Capability) -> &'static str {
    match c {
        Capability::Public => "public",
        Capability::Produce => "produce",
        Capability::Consume => "consume",
        Capability::ProduceAndConsume => "produce+consume",
        Capability::Configure => "configure",
        Capability::Read => "read",
        Capability::Admin => "admin",
    }
}

/// The query parameters of the views that answer a page at a time (docs/operations.md, "Views
/// at scale"): `limit` (default, largest), `offset`, and `search` where names are searched.
fn page_query(method: &Method, path: &str) -> Vec<Value> {
    if method != Method::GET {
        return Vec::new();
    }
    // (default limit, largest limit, searched, extra parameters)
    let (default, max, searched, extra): (i64, i64, bool, Vec<Value>) = match path {
        "/api/v1/resources/queues" => (100, 1000, true, vec![]),
        "/api/v1/resources/queues/{queue}" => (1000, 10_000, false, vec![]),
        "/api/v1/consumer-groups" => (1000, 10_000, true, vec![]),
        "/api/v1/consumer-groups/lagging" => (
            1000,
            10_000,
            false,
            vec![json!({
                "name": "minLagSeconds", "in": "query",
                "schema": { "type": "integer", "minimum": 0, "default": 3600 },
                "description": "only partitions whose oldest unconsumed message is at least this old",
            })],
        ),
        "/api/v1/consumer-groups/{group}" => (
            1000,
            10_000,
            false,
            vec![json!({
                "name": "queue", "in": "query", "schema": name(),
                "description": "only this queue's partitions",
            })],
        ),
        "/api/v1/kafka/topics" | "/api/v1/kafka/groups" => (50, 500, true, vec![]),
        _ => return Vec::new(),
    };
    let mut out = vec![json!({
        "name": "limit", "in": "query",
        "schema": { "type": "integer", "minimum": 1, "default": default },
        "description": format!("entries per page (larger values are cut to {max})"),
    })];
    if path != "/api/v1/consumer-groups/lagging" {
        out.push(json!({
            "name": "offset", "in": "query",
            "schema": { "type": "integer", "minimum": 0, "default": 0 },
            "description": "entries skipped before the page",
        }));
    }
    if searched {
        out.push(json!({
            "name": "search", "in": "query",
            "schema": { "type": "string", "maxLength": 255 },
            "description": "only names containing this text (any case; `%` and `_` are literal)",
        }));
    }
    out.extend(extra);
    out
}

/// One operation of the document.
fn operation(route: &Route) -> (String, String, Value) {
    let (path, names) = openapi_path(route.path);
    let method = route.method.as_str().to_ascii_lowercase();
    let mut parameters: Vec<Value> = names
        .iter()
        .map(|n| {
            let schema = if n.ends_with("Id") || n == "lease_id" {
                json!({ "type": "string" })
            } else {
                name()
            };
            json!({ "name": n, "in": "path", "required": true, "schema": schema })
        })
        .collect();
    parameters.extend(page_query(&route.method, route.path));
    let shape = shape(&route.method, route.path);
    let mut op = Map::new();
    op.insert("operationId".into(), format!("{method} {path}").into());
    op.insert(
        "x-capability".into(),
        capability_name(route.capability).into(),
    );
    if route.capability != Capability::Public {
        op.insert("security".into(), json!([{ "bearer": [] }, {}]));
    }
    let mut responses = Map::new();
    match shape {
        Some(shape) => {
            parameters.extend(shape.parameters);
            if let Some(request) = shape.request {
                op.insert(
                    "requestBody".into(),
                    json!({ "required": true, "content": json_content(request) }),
                );
            }
            responses.insert(
                shape.success.into(),
                json!({ "description": "success", "content": shape.response }),
            );
        }
        None if route.path == "/metrics/prometheus" => {
            responses.insert(
                "200".into(),
                json!({ "description": "Prometheus text exposition",
                        "content": { "text/plain": { "schema": { "type": "string" } } } }),
            );
        }
        None if route.path.starts_with("/api/") => {
            responses.insert(
                "2XX".into(),
                json!({ "description": "a JSON answer (shape not described here yet)",
                        "content": { "application/json": { "schema": {} } } }),
            );
        }
        None => {
            responses.insert(
                "2XX".into(),
                json!({ "description": "a page, a file or a JSON answer",
                        "content": { "*/*": { "schema": {} } } }),
            );
        }
    }
    if route.path.starts_with("/api/v1/pop") || route.method == Method::DELETE {
        responses.insert(
            "204".into(),
            json!({ "description": "nothing to answer (pop: no message within the wait)" }),
        );
    }
    responses.insert(
        "default".into(),
        json!({
            "description": "an error: 400 names the field, 401/403 authentication, 404 unknown, 413 too large, 503 retry later",
            "content": {
                "application/json": { "schema": schema_ref("Error") },
                "text/plain": { "schema": { "type": "string" } },
            },
        }),
    );
    if !parameters.is_empty() {
        op.insert("parameters".into(), parameters.into());
    }
    op.insert("responses".into(), responses.into());
    (path, method, Value::Object(op))
}

/// The document for `routes`.
pub fn document(routes: &[Route]) -> Value {
    let mut paths = Map::new();
    for route in routes {
        let (path, method, op) = operation(route);
        let entry = paths
            .entry(path)
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(methods) = entry {
            methods.insert(method, op);
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "queen-broker",
            "version": VERSION,
            "description": "Queen MQ's HTTP protocol as served by queen-broker. Generated from the broker's route table.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas(),
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer", "bearerFormat": "JWT" } },
        },
    })
}

// ---- Streams runtime (`/streams/v1/*`, reference 2.x §2.11, docs/streams.md). Kept in this
// ---- one block: the schemas are written inline, not in `components.schemas`.

/// The shapes of the three streams routes; `None` for any other route.
fn streams_shape(method: &Method, path: &str) -> Option<Shape> {
    let id = || json!({ "type": "string", "format": "uuid" });
    let refused = || {
        json!({
            "type": "object",
            "required": ["success", "error"],
            "properties": {
                "success": { "const": false },
                "error": { "type": "string" },
                "code": { "enum": ["config_hash_mismatch", "query_not_found", "lease_lost",
                                   "ack_message_not_found", "ack_refused", "sink_refused",
                                   "state_limit_exceeded"] },
            },
        })
    };
    let shape = |request: Value, response: Value| Shape {
        request: Some(request),
        success: "200",
        response: json!({ "application/json": { "schema": { "oneOf": [response, refused()] } } }),
        parameters: Vec::new(),
    };
    Some(match (method.as_str(), path) {
        ("POST", "/streams/v1/queries") => shape(
            json!({
                "type": "object",
                "required": ["name", "source_queue", "config_hash"],
                "properties": {
                    "name": name(),
                    "source_queue": name(),
                    "sink_queue": { "anyOf": [name(), { "type": "null" }] },
                    "config_hash": { "type": "string", "maxLength": 1024 },
                    "reset": { "type": "boolean", "description": "wipe the state when the hash changed (409 without it)" },
                },
            }),
            json!({
                "type": "object",
                "required": ["success", "query_id", "name", "config_hash", "fresh", "reset"],
                "properties": {
                    "success": { "const": true },
                    "query_id": id(),
                    "name": { "type": "string" },
                    "config_hash": { "type": "string" },
                    "fresh": { "type": "boolean" },
                    "reset": { "type": "boolean" },
                },
            }),
        ),
        ("POST", "/streams/v1/state/get") => shape(
            json!({
                "type": "object",
                "required": ["query_id", "partition_id"],
                "properties": {
                    "query_id": id(),
                    "partition_id": id(),
                    "keys": { "type": "array", "items": { "type": "string" }, "description": "empty: every key" },
                    "key_prefix": { "type": "string" },
                    "ripe_at_or_before": { "type": "number", "description": "epoch ms: only rows whose value.windowEnd is a number at or before it" },
                },
            }),
            json!({
                "type": "object",
                "required": ["success", "rows"],
                "properties": {
                    "success": { "const": true },
                    "rows": { "type": "array", "items": {
                        "type": "object",
                        "required": ["key", "value", "updated_at"],
                        "properties": {
                            "key": { "type": "string" },
                            "value": { "description": "the JSON value as written" },
                            "updated_at": { "type": "string" },
                        },
                    } },
                },
            }),
        ),
        ("POST", "/streams/v1/cycle") => shape(
            json!({
                "type": "object",
                "required": ["query_id", "partition_id"],
                "properties": {
                    "query_id": id(),
                    "partition_id": id(),
                    "consumer_group": { "type": "string", "description": "empty: queue mode" },
                    "state_ops": { "type": "array", "items": {
                        "type": "object",
                        "required": ["type", "key"],
                        "properties": {
                            "type": { "enum": ["upsert", "delete"] },
                            "key": { "type": "string", "maxLength": 1024 },
                            "value": { "description": "any JSON (upsert)" },
                        },
                    } },
                    "push_items": { "type": "array", "items": {
                        "type": "object",
                        "required": ["queue", "payload"],
                        "properties": {
                            "queue": name(),
                            "partition": name(),
                            "payload": {},
                            "transactionId": { "type": "string" },
                            "traceId": { "type": "string" },
                            "messageId": id(),
                        },
                    } },
                    "ack": { "anyOf": [{ "type": "null" }, {
                        "type": "object",
                        "required": ["transactionId"],
                        "properties": {
                            "transactionId": { "type": "string" },
                            "leaseId": { "type": "string" },
                            "status": { "enum": ["completed", "success", "failed", "dlq"] },
                            "count": { "type": "integer", "minimum": 0 },
                            "error": { "type": "string" },
                        },
                    }] },
                    "release_lease": { "type": "boolean", "default": true },
                },
            }),
            json!({
                "type": "object",
                "required": ["success", "query_id", "partition_id", "state_ops_applied", "push_results", "ack_result"],
                "properties": {
                    "success": { "const": true },
                    "query_id": id(),
                    "partition_id": id(),
                    "queueName": { "type": ["string", "null"] },
                    "state_ops_applied": { "type": "integer", "minimum": 0 },
                    "push_results": { "type": "array", "items": { "type": "object" } },
                    "ack_result": { "anyOf": [{ "type": "null" }, {
                        "type": "object",
                        "properties": {
                            "success": { "const": true },
                            "count": { "type": "integer" },
                            "lease_released": { "type": "boolean" },
                            "dlq": { "type": "boolean" },
                        },
                    }] },
                },
            }),
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paged_views_describe_their_query_parameters() {
        let routes: Vec<Route> = [
            "/api/v1/consumer-groups",
            "/api/v1/consumer-groups/{group}",
            "/api/v1/consumer-groups/lagging",
            "/api/v1/resources/queues/{queue}",
            "/api/v1/kafka/groups",
        ]
        .into_iter()
        .map(|path| Route::new(Method::GET, path, Capability::Read, |r| r))
        .collect();
        let doc = document(&routes);
        let names = |path: &str| -> Vec<String> {
            doc["paths"][path]["get"]["parameters"]
                .as_array()
                .unwrap_or_else(|| panic!("{path} has parameters"))
                .iter()
                .map(|p| p["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            names("/api/v1/consumer-groups"),
            ["limit", "offset", "search"]
        );
        assert_eq!(
            names("/api/v1/consumer-groups/{group}"),
            ["group", "limit", "offset", "queue"]
        );
        assert_eq!(
            names("/api/v1/consumer-groups/lagging"),
            ["limit", "minLagSeconds"]
        );
        assert_eq!(
            names("/api/v1/resources/queues/{queue}"),
            ["queue", "limit", "offset"]
        );
        assert_eq!(names("/api/v1/kafka/groups"), ["limit", "offset", "search"]);
    }

    #[test]
    fn each_route_given_is_one_operation() {
        let routes = vec![
            Route::new(Method::GET, "/a/{queue}", Capability::Read, |r| r),
            Route::new(Method::DELETE, "/a/{queue}", Capability::Admin, |r| r),
            Route::new(Method::POST, "/api/v1/push", Capability::Produce, |r| r),
            Route::new(Method::GET, "/health", Capability::Public, |r| r),
        ];
        let doc = document(&routes);
        assert_eq!(doc["paths"].as_object().unwrap().len(), 3);
        assert_eq!(
            doc["paths"]["/a/{queue}"]["get"]["parameters"][0]["name"],
            "queue"
        );
        assert_eq!(
            doc["paths"]["/a/{queue}"]["delete"]["x-capability"],
            "admin"
        );
        assert!(doc["paths"]["/health"]["get"]["security"].is_null());
        let push = &doc["paths"]["/api/v1/push"]["post"];
        assert_eq!(
            push["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/PushRequest"
        );
        // Every reference resolves.
        let text = doc.to_string();
        for piece in text.split("#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap();
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "{name} is referenced but not defined"
            );
        }
    }

    #[test]
    fn actix_patterns_become_openapi_paths() {
        assert_eq!(
            openapi_path("/a/{queue}/b/{tail:.*}"),
            (
                "/a/{queue}/b/{tail}".to_string(),
                vec!["queue".to_string(), "tail".to_string()]
            )
        );
    }
}

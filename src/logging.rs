//! Log output. The broker's `tracing` events reach env_logger through tracing's `log` bridge
//! (no subscriber is installed); this module builds that env_logger with one of two line
//! formats and carries the id of the HTTP request being served:
//!
//! - `text`: `[time LEVEL target] message request_id=…`
//! - `json`: one object per line, `{"ts", "level", "target", "message", "request_id"}`;
//!   `message` holds the event's text with its fields as `key=value` (how the bridge renders
//!   them).
//!
//! The request id lives in a task-local ([`with_request_id`]): every event logged while a
//! request's future runs carries it, on whatever worker the request runs.

use std::future::Future;
use std::io::Write;
use std::sync::Arc;

tokio::task_local! {
    static REQUEST_ID: Arc<str>;
}

/// Runs `fut` with `id` as the current request id of its log lines.
pub fn with_request_id<F: Future>(id: Arc<str>, fut: F) -> impl Future<Output = F::Output> {
    REQUEST_ID.scope(id, fut)
}

/// The id of the request being served on this task, if any.
pub fn request_id() -> Option<Arc<str>> {
    REQUEST_ID.try_with(Arc::clone).ok()
}

/// The filter every format shares: `LOG_LEVEL` for the broker's crates, `warn` for the rest,
/// refined by `RUST_LOG`.
fn base(level: &str) -> env_logger::Builder {
    let mut builder = env_logger::Builder::new();
    builder
        .parse_filters(&format!("warn,queen_broker={level},broker_actors={level}"))
        .parse_env("RUST_LOG");
    builder
}

/// The logger: `json` selects one JSON object per line.
pub fn builder(level: &str, json: bool) -> env_logger::Builder {
    let mut builder = base(level);
    if json {
        builder.format(|buf, record| {
            let line = json_line(
                &chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                record,
                request_id().as_deref(),
            );
            writeln!(buf, "{line}")
        });
    } else {
        builder.format(|buf, record| {
            let ts = buf.timestamp_micros();
            write!(
                buf,
                "[{ts} {:<5} {}] {}",
                record.level(),
                record.target(),
                one_line(&record.args().to_string())
            )?;
            match request_id() {
                Some(id) => writeln!(buf, " request_id={id}"),
                None => writeln!(buf),
            }
        });
    }
    builder
}

/// A message as one text line: control characters (a newline or an escape sequence in a queue
/// name or a transactionId a client sent) are written escaped (`\n`, `\u{1b}`), so no
/// client-chosen text can start a forged log line or drive the reader's terminal.
pub fn one_line(message: &str) -> std::borrow::Cow<'_, str> {
    if !message.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(message.len() + 8);
    for c in message.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// One record as a JSON object (no newline).
pub fn json_line(ts: &str, record: &log::Record<'_>, request_id: Option<&str>) -> String {
    let mut line = serde_json::json!({
        "ts": ts,
        "level": record.level().as_str(),
        "target": record.target(),
        "message": record.args().to_string(),
    });
    if let Some(id) = request_id {
        line["request_id"] = id.into();
    }
    line.to_string()
}

/// Installs the logger (once per process; later calls do nothing).
pub fn init(level: &str, json: bool) {
    let _ = builder(level, json).try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_line_is_one_object_with_the_request_id() {
        let args = format_args!("pop answered status=200 \"quoted\"\nnext");
        let record = log::Record::builder()
            .args(args)
            .level(log::Level::Debug)
            .target("queen_broker::access")
            .build();
        let line = json_line("2026-01-01T00:00:00.000000Z", &record, Some("r-1"));
        assert!(!line.contains('\n'), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "DEBUG");
        assert_eq!(v["target"], "queen_broker::access");
        assert_eq!(v["request_id"], "r-1");
        assert_eq!(v["message"], "pop answered status=200 \"quoted\"\nnext");
    }

    #[test]
    fn a_text_line_escapes_control_characters() {
        assert_eq!(one_line("plain queue q1"), "plain queue q1");
        assert_eq!(
            one_line("queue=a\n[2026 ERROR forged] x\r\u{1b}[31m"),
            "queue=a\\n[2026 ERROR forged] x\\r\\u{1b}[31m"
        );
        assert!(!one_line("a\nb\u{0}c\u{7f}").contains(['\n', '\u{0}', '\u{7f}']));
    }

    #[actix_rt::test]
    async fn the_request_id_is_seen_inside_the_request_only() {
        assert!(request_id().is_none());
        let seen = with_request_id(Arc::from("abc"), async { request_id() }).await;
        assert_eq!(seen.as_deref(), Some("abc"));
    }
}

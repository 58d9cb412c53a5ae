//! Human output: aligned columns, and JSON values as short text.

use serde_json::Value;

/// Prints a header and rows as aligned columns (two spaces apart); "(none)" when empty.
pub fn print(headers: &[&str], rows: &[Vec<String>]) {
    print!("{}", render(headers, rows));
}

/// The text [`print()`] writes.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 == widths.len() {
                out.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(&mut headers.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    if rows.is_empty() {
        out.push_str("(none)\n");
    }
    out
}

/// Text from the broker made safe for a terminal: control characters (an escape sequence in a
/// queue name, a newline in a transactionId) are shown escaped (`\u{1b}`, `\n`), never sent
/// to the terminal as they are.
pub fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A field as text: strings bare, `null`/absent as `-`, anything else as compact JSON; control
/// characters escaped ([`clean`]).
pub fn text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => clean(s),
        Some(other) => other.to_string(),
    }
}

/// A payload as one line, cut at `max` characters.
pub fn short(v: &Value, max: usize) -> String {
    let s = v.to_string();
    if s.chars().count() <= max {
        s
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_empty_tables_say_so() {
        let rows = vec![
            vec!["orders".to_string(), "12".to_string()],
            vec!["q".to_string(), "3".to_string()],
        ];
        assert_eq!(
            render(&["QUEUE", "PENDING"], &rows),
            "QUEUE   PENDING\norders  12\nq       3\n"
        );
        assert_eq!(render(&["A", "B"], &[]), "A  B\n(none)\n");
    }

    #[test]
    fn control_characters_from_the_broker_are_escaped() {
        let v = Value::from("q\u{1b}]0;owned\u{7}\nline");
        assert_eq!(text(Some(&v)), "q\\u{1b}]0;owned\\u{7}\\nline");
        assert!(!clean("a\u{1b}[2Jb\r").chars().any(char::is_control));
        assert_eq!(clean("plain ü"), "plain ü");
    }

    #[test]
    fn values_print_short() {
        assert_eq!(text(None), "-");
        assert_eq!(text(Some(&Value::from("x"))), "x");
        assert_eq!(text(Some(&Value::from(3))), "3");
        assert_eq!(short(&serde_json::json!({"a": "bcdef"}), 5), "{\"a\":…");
    }
}

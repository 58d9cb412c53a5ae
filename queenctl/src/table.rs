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

/// A field as text: strings bare, `null`/absent as `-`, anything else as compact JSON.
pub fn text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
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
    fn values_print_short() {
        assert_eq!(text(None), "-");
        assert_eq!(text(Some(&Value::from("x"))), "x");
        assert_eq!(text(Some(&Value::from(3))), "3");
        assert_eq!(short(&serde_json::json!({"a": "bcdef"}), 5), "{\"a\":…");
    }
}

//! The one nesting limit of JSON a client sends: at most [`MAX_DEPTH`] levels of arrays and
//! objects in a payload (a push item's, a transaction push's, and, through [`check`], any
//! route that stores client JSON: KV values, timer payloads). Payloads are kept as raw text
//! and never parsed into values by the broker, so nothing would stop a payload of 100 000
//! levels, which every consumer's JSON parser then has to survive (most stop at a few hundred
//! levels). 128 is serde_json's own recursion limit, so what the broker accepts, a Rust
//! consumer parses.
//!
//! The check is one pass over the bytes (no parse, no allocation): brackets inside strings do
//! not count. It assumes the text is valid JSON (it was parsed as a `RawValue` before).

use crate::protocol::ProtocolError;

/// Most levels of nested arrays and objects in one payload.
pub const MAX_DEPTH: usize = 128;

/// The deepest nesting of arrays and objects in `json` (valid JSON text), stopping as soon as
/// it passes `limit` (then `limit + 1`).
pub fn depth_up_to(json: &str, limit: usize) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut in_string = false;
    let mut escaped = false;
    for &b in json.as_bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > deepest {
                    deepest = depth;
                    if deepest > limit {
                        return deepest;
                    }
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Checks that `json` (valid JSON text, named `what` in the error) nests at most
/// [`MAX_DEPTH`] levels.
///
/// # Errors
///
/// [`ProtocolError`] naming `what` and the limit.
pub fn check(json: &str, what: &str) -> Result<(), ProtocolError> {
    // The depth cannot pass the number of opening brackets; looking for them is a vectorised
    // pass (memchr), and most payloads hold no more than the limit, so the scan below rarely
    // runs.
    if memchr::memchr2_iter(b'[', b'{', json.as_bytes())
        .nth(MAX_DEPTH)
        .is_none()
    {
        return Ok(());
    }
    if depth_up_to(json, MAX_DEPTH) > MAX_DEPTH {
        return Err(ProtocolError(format!(
            "{what} nests arrays and objects deeper than {MAX_DEPTH} levels (the limit)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_brackets_outside_strings_only() {
        assert_eq!(depth_up_to("1", 128), 0);
        assert_eq!(depth_up_to(r#"{"a":[1,{"b":[]}]}"#, 128), 4);
        assert_eq!(depth_up_to(r#"["[[[[", "\"[[[", {"k]":"}"}]"#, 128), 2);
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        assert_eq!(depth_up_to(&deep, 128), 129);
        assert!(check(&deep, "item 0: payload")
            .unwrap_err()
            .0
            .contains("128"));
        let ok = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert!(check(&ok, "payload").is_ok());
        // More brackets than the limit, but inside strings or side by side: not deep.
        let flat = format!("[{}]", vec!["[]"; 200].join(","));
        assert!(flat.bytes().filter(|b| *b == b'[').count() > MAX_DEPTH);
        assert!(check(&flat, "payload").is_ok());
        let quoted = format!("[\"{}\"]", "[".repeat(300));
        assert!(check(&quoted, "payload").is_ok());
        let deep_in_many = format!(
            "[{},{}{}]",
            vec!["[]"; 50].join(","),
            "[".repeat(128),
            "]".repeat(128)
        );
        assert!(check(&deep_in_many, "payload").is_err());
    }
}

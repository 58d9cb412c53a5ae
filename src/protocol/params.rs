//! Rules for the values a request carries outside the push body: path segments, query
//! parameters and the small fields of ack, lease and admin bodies. A value PostgreSQL cannot
//! hold (a NUL character), a name past the name rule, or a number that would overflow the
//! statement it feeds is refused here with a 400 naming the field, never left to the database
//! (whose refusal would be a 500, which the official clients retry three times).

use crate::protocol::{Name, ProtocolError};

/// Query and path parameters that are names (queue, partition, consumer group, ...): the name
/// rule applies to them as a whole.
pub const NAME_PARAMS: &[&str] = &[
    "queue",
    "partition",
    "consumerGroup",
    "group",
    "namespace",
    "ns",
    "task",
    "transactionId",
];

/// Longest lease extension, in seconds (one day). A lease held longer is a consumer that should
/// ack or fail the message.
pub const MAX_LEASE_EXTEND_SECONDS: i64 = 86_400;

/// Largest duration in seconds a query parameter may give (100 years): far beyond any lag or
/// window, and far inside what PostgreSQL's interval arithmetic holds.
pub const MAX_SECONDS: i64 = 100 * 365 * 86_400;

/// Checks one request value: no NUL character anywhere, and the name rule for a name.
///
/// # Errors
///
/// [`ProtocolError`] naming `field`.
pub fn check_value(field: &str, value: &str) -> Result<(), ProtocolError> {
    if NAME_PARAMS.contains(&field) {
        return check_name(field, value);
    }
    if value.contains('\0') {
        return Err(ProtocolError(format!(
            "{field} must not contain NUL characters"
        )));
    }
    Ok(())
}

/// Checks a name field (the name rule, [`Name`]).
///
/// # Errors
///
/// [`ProtocolError`] naming `field`.
pub fn check_name(field: &str, value: &str) -> Result<(), ProtocolError> {
    Name::check(value).map_err(|e| ProtocolError(format!("{field} {e}")))
}

/// Checks a free-text field of a body (an ack's `error`, say): any length, no NUL.
///
/// # Errors
///
/// [`ProtocolError`] naming `field`.
pub fn check_text(field: &str, value: Option<&str>) -> Result<(), ProtocolError> {
    match value {
        Some(v) if v.contains('\0') => Err(ProtocolError(format!(
            "{field} must not contain NUL characters"
        ))),
        _ => Ok(()),
    }
}

/// A whole number of seconds from a query parameter: `default` when absent or empty, else an
/// integer in `0..=MAX_SECONDS`.
///
/// # Errors
///
/// [`ProtocolError`] naming `field` when it is not such a number.
pub fn seconds_param(field: &str, value: Option<&str>, default: i64) -> Result<i64, ProtocolError> {
    let Some(text) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(default);
    };
    text.parse::<i64>()
        .ok()
        .filter(|n| (0..=MAX_SECONDS).contains(n))
        .ok_or_else(|| {
            ProtocolError(format!(
                "{field} must be a whole number of seconds from 0 to {MAX_SECONDS}"
            ))
        })
}

/// The `seconds` of a lease extension: `default` when absent or `null`, else an integer in
/// `1..=MAX_LEASE_EXTEND_SECONDS`.
///
/// # Errors
///
/// [`ProtocolError`] naming `seconds`.
pub fn lease_seconds(
    value: Option<&serde_json::Value>,
    default: i64,
) -> Result<i64, ProtocolError> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(v) => v
            .as_i64()
            .filter(|n| (1..=MAX_LEASE_EXTEND_SECONDS).contains(n))
            .ok_or_else(|| {
                ProtocolError(format!(
                    "seconds must be a whole number from 1 to {MAX_LEASE_EXTEND_SECONDS}"
                ))
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nul_and_long_names_are_refused_by_field() {
        assert_eq!(
            check_value("consumerGroup", "a\0b").unwrap_err().0,
            "consumerGroup must not contain NUL characters"
        );
        assert_eq!(
            check_value("consumerGroup", &"g".repeat(256))
                .unwrap_err()
                .0,
            "consumerGroup is longer than 255 characters"
        );
        assert!(check_value("limit", &"9".repeat(300)).is_ok());
        assert_eq!(
            check_value("status", "\0").unwrap_err().0,
            "status must not contain NUL characters"
        );
        assert!(check_text("error", Some("boom")).is_ok());
        assert!(check_text("error", Some("bo\0om")).is_err());
    }

    #[test]
    fn seconds_are_bounded() {
        assert_eq!(seconds_param("minLagSeconds", None, 3600), Ok(3600));
        assert_eq!(seconds_param("minLagSeconds", Some("60"), 3600), Ok(60));
        assert!(seconds_param("minLagSeconds", Some("9223372036854775807"), 0).is_err());
        assert!(seconds_param("minLagSeconds", Some("-1"), 0).is_err());
        assert!(seconds_param("minLagSeconds", Some("x"), 0).is_err());
        assert_eq!(lease_seconds(None, 60), Ok(60));
        assert_eq!(lease_seconds(Some(&json!(120)), 60), Ok(120));
        assert!(lease_seconds(Some(&json!(9_223_372_036_854_775_000_i64)), 60).is_err());
        assert!(lease_seconds(Some(&json!(0)), 60).is_err());
        assert!(lease_seconds(Some(&json!("5")), 60).is_err());
    }
}

/// One page of a listing, from the query parameters `limit`, `offset` and `search`
/// (docs/operations.md, "Views at scale").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Rows at most.
    pub limit: i64,
    /// Rows skipped.
    pub offset: i64,
    /// Only names containing this (case insensitive); `None` when absent or empty.
    pub search: Option<String>,
}

/// The page a listing's query asks for: `limit` is `default` when absent or empty and at most
/// `max` (a larger one is cut to `max`), `offset` 0 when absent, `search` at most 255
/// characters without NUL.
///
/// # Errors
///
/// [`ProtocolError`] naming the parameter that is not a whole number (`limit` at least 1,
/// `offset` at least 0) or the search text that is too long.
pub fn page_params(
    query: &std::collections::HashMap<String, String>,
    default: i64,
    max: i64,
) -> Result<Page, ProtocolError> {
    let number = |field: &str, min: i64, default: i64| match query
        .get(field)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
    {
        None => Ok(default),
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= min)
            .ok_or_else(|| {
                ProtocolError(format!("{field} must be a whole number of at least {min}"))
            }),
    };
    let search = query.get("search").filter(|v| !v.is_empty()).cloned();
    check_text("search", search.as_deref())?;
    if search.as_ref().is_some_and(|s| s.chars().count() > 255) {
        return Err(ProtocolError(
            "search must be at most 255 characters".into(),
        ));
    }
    Ok(Page {
        limit: number("limit", 1, default)?.min(max),
        offset: number("offset", 0, 0)?,
        search,
    })
}

//! The HTTP side: one call of the broker's API, with the token, and the broker's `error` text
//! turned into a message naming the route.

use std::time::Duration;

use awc::http::Method;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

/// Why a command failed.
#[derive(Debug)]
pub enum Failure {
    /// The command line does not make sense (exit 2).
    Usage(String),
    /// The broker refused or failed, or could not be reached (exit 1).
    Error(String),
}

/// Characters left as they are in a path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A name as one path segment.
pub fn seg(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// A query string from the pairs whose value is present.
pub fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", seg(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// An answer: status and JSON body (`Null` when empty).
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

/// `url` with the password of its user information (`http://user:secret@host`) replaced by
/// `***`, for messages.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => url.to_string(),
    }
}

/// The broker at one URL.
pub struct Client {
    base: String,
    token: Option<String>,
    http: awc::Client,
    timeout: Duration,
}

impl Client {
    /// A client for `base` (`http://host:port`, a trailing slash is dropped).
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<Self, Failure> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Failure::Usage(format!(
                "--url/QUEEN_URL must start with http:// or https://, got {:?}",
                redacted(&base)
            )));
        }
        Ok(Self {
            base,
            token: token.filter(|t| !t.trim().is_empty()),
            http: awc::Client::builder().disable_timeout().finish(),
            timeout,
        })
    }

    /// One request; any status is returned (the caller decides what is an error).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        extra_wait: Duration,
    ) -> Result<Answer, Failure> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .timeout(self.timeout + extra_wait);
        if let Some(token) = &self.token {
            req = req.insert_header(("Authorization", format!("Bearer {token}")));
        }
        let sent = match body {
            Some(b) => req.send_json(b).await,
            None => req.send().await,
        };
        let mut res = sent.map_err(|e| {
            Failure::Error(format!(
                "cannot reach the broker at {}: {} (set --url or QUEEN_URL)",
                redacted(&self.base),
                redacted(&e.to_string())
            ))
        })?;
        let bytes =
            res.body().limit(256 * 1024 * 1024).await.map_err(|e| {
                Failure::Error(format!("{method} {path}: cannot read the answer: {e}"))
            })?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok(Answer {
            status: res.status().as_u16(),
            body,
        })
    }

    /// A request that must succeed (2xx); anything else is an error naming the route.
    pub async fn ok(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let answer = self
            .call(method.clone(), path, body, Duration::ZERO)
            .await?;
        check(&method, path, answer)
    }

    /// `GET` that must succeed.
    pub async fn get(&self, path: &str) -> Result<Value, Failure> {
        self.ok(Method::GET, path, None).await
    }
}

/// The answer's body when 2xx, else an error with the broker's own text.
pub fn check(method: &Method, path: &str, answer: Answer) -> Result<Value, Failure> {
    if (200..300).contains(&answer.status) {
        return Ok(answer.body);
    }
    let why = answer
        .body
        .get("error")
        .or_else(|| answer.body.get("message"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| match &answer.body {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    // The 2.x routes say what is wrong in `detail` beside a stable `error` id.
    let why = match answer.body.get("detail").and_then(Value::as_str) {
        Some(detail) => format!("{why}: {detail}"),
        None => why,
    };
    let hint = match answer.status {
        401 => " (set --token or QUEEN_TOKEN)",
        403 => " (the token's roles do not allow this)",
        _ => "",
    };
    Err(Failure::Error(format!(
        "{method} {path}: {} {why}{hint}",
        answer.status
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_the_url_is_never_shown() {
        assert_eq!(
            redacted("http://admin:hunter2@127.0.0.1:6632/x?y=1"),
            "http://admin:***@127.0.0.1:6632/x?y=1"
        );
        assert_eq!(redacted("http://tok@h:1"), "http://tok@h:1");
        assert_eq!(redacted("http://h:1/a@b"), "http://h:1/a@b");
        assert_eq!(redacted("https://u:p:q@h"), "https://u:***@h");
        let Err(Failure::Usage(text)) = Client::new("ftp://u:hunter2@h", None, Duration::ZERO)
        else {
            panic!("refused");
        };
        assert!(!text.contains("hunter2"), "{text}");
    }
}
